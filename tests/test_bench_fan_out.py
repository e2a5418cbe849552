"""benchmarks/fan_out.py: sweep points run as Dask tasks in worker processes, results in the points' order."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cloudpickle
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fan_out import fan_out

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module


def _square_with_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise ValueError(f"point {x} failed")
    return x


@pytest.mark.xdist_group("dask")
def test_points_run_in_worker_processes_in_order() -> None:
    said = []
    results = fan_out(_square_with_pid, [5, 1, 4, 2], workers=2, log=said.append)
    assert [value for value, _ in results] == [25, 1, 16, 4]
    assert os.getpid() not in {pid for _, pid in results}  # not in this process: on the cluster's workers
    assert said == ["4 sweep points on a local cluster of 2 worker processes"]


@pytest.mark.xdist_group("dask")
def test_a_failing_point_raises_its_error() -> None:
    with pytest.raises(ValueError, match="point 3 failed"):
        fan_out(_fails_on_three, [1, 2, 3], workers=1, log=lambda _: None)


def test_no_scheduler_at_the_address_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"no Dask scheduler answers at 'tcp://127\.0\.0\.1:9'.*dask scheduler"):
        fan_out(_square_with_pid, [1], scheduler="tcp://127.0.0.1:9", log=lambda _: None)

