"""CPU baseline for the chip: single-stream greedy decoding of the same model on this machine.

    .venv/bin/python benchmarks/cpu_baseline.py [--model M.onnx] [-n 128] [--prompt TEXT] [--repeats 3] [--no-compile]

Times generate(prompt, n) (prompt fed, then n greedy tokens; batch 1) for
  float eager     PyTorch float32 with a KV cache (frontend.float_decoder.FloatDecoder)
  float compiled  the same under torch.compile (fixed-shape attention over the whole cache)
  int8 reference  the integer reference decoder (quant.reference.ReferenceDecoder) on the int8 QModel
after a warm-up run each, with torch.set_num_threads at the machine's cores. Reports the
median of the timed runs as tokens/s and ms/token, prints a markdown table and writes
benchmarks/results/cpu_baseline.json. The chip-vs-CPU benchmark calls measure_cpu().

The default prompt is one newline: with n = 128 on the bundled model (context 128) the
prompt plus the n - 1 tokens fed back fill the context exactly, so the time is all
one-token decode steps, as on the chip.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package

from hardwire.cli import BUNDLED_MODEL  # noqa: E402
from hardwire.frontend import ModelIR, load  # noqa: E402
from hardwire.frontend.float_decoder import FloatDecoder  # noqa: E402
from hardwire.quant.quantize import quantize  # noqa: E402
from hardwire.quant.reference import ReferenceDecoder  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "cpu_baseline.json"
DEFAULT_PROMPT = "\n"


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"cpu": cpu, "cores": cores, "arch": platform.machine(), "torch": torch.__version__,
            "python": platform.python_version()}


def prompt_ids(ir: ModelIR, text: str | None) -> list[int]:
    """Prompt text to ids for a char-level model (its vocabulary in the file); id 0 for a model without one."""
    if ir.vocab is None:
        return [0]
    stoi = {c: i for i, c in enumerate(ir.vocab)}
    text = DEFAULT_PROMPT if text is None else text
    missing = sorted({c for c in text if c not in stoi})
    if missing or not text:
        raise SystemExit(f"prompt {text!r}: characters {missing} are not in the model's vocabulary" if missing
                         else "the prompt is empty")
    return [stoi[c] for c in text]


def _time(generate: Callable[[], list[int]], repeats: int) -> tuple[list[float], list[int]]:
    runs, out = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = generate()
        runs.append(time.perf_counter() - start)
    return runs, out


def _row(name: str, n: int, runs: list[float], tokens: list[int], reference: list[int] | None, **extra: object) -> dict:
    median = statistics.median(runs)
    return {"name": name, "tokens_per_s": n / median, "ms_per_token": median / n * 1e3,
            "best_tokens_per_s": n / min(runs), "runs_s": runs,
            "same_tokens_as_float_eager": None if reference is None else tokens == reference, **extra}


def measure_cpu(model_path: str | os.PathLike[str] = BUNDLED_MODEL, n_tokens: int = 128, *, prompt: str | None = None,
                repeats: int = 3, threads: int | None = None, use_compile: bool = True,
                log: Callable[[str], None] = lambda s: None) -> dict:
    """Time single-stream greedy decoding of n_tokens on this CPU; -> the result record (see the module doc)."""
    info = machine()
    torch.set_num_threads(threads or int(info["cores"]))
    ir = load(model_path)
    ids = prompt_ids(ir, prompt)
    context = ir.config.context
    if context is not None and len(ids) + n_tokens - 1 > context:
        raise SystemExit(f"{len(ids)} prompt tokens + {n_tokens - 1} fed back exceed the context of {context}; "
                         "shorten the prompt or lower -n")
    load_before = os.getloadavg()
    notes: list[str] = []
    rows = []

    decoder = FloatDecoder(ir)
    decoder.generate(ids, n_tokens)  # warm-up
    runs, eager_tokens = _time(lambda: decoder.generate(ids, n_tokens), repeats)
    rows.append(_row("float32 eager, KV cache", n_tokens, runs, eager_tokens, None))
    log(f"  float eager: {rows[-1]['ms_per_token']:.3f} ms/token")

    if use_compile:
        compiled = FloatDecoder(ir)
        try:
            compiled.compile()
            start = time.perf_counter()
            compiled.generate(ids, n_tokens)  # warm-up: traces and compiles the prompt and the one-token step
            compile_s = time.perf_counter() - start
            compiled.generate(ids, n_tokens)  # second warm-up: anything left lazy
            runs, tokens = _time(lambda: compiled.generate(ids, n_tokens), repeats)
            rows.append(_row("float32 torch.compile, KV cache", n_tokens, runs, tokens, eager_tokens,
                             first_run_s=compile_s))
            log(f"  float compiled: {rows[-1]['ms_per_token']:.3f} ms/token (first run, compiling: {compile_s:.0f} s)")
        except Exception as error:  # inductor needs a working C++ toolchain; say what failed instead of the figure
            reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            notes.append(f"torch.compile failed on this CPU: {reason}")
            rows.append({"name": "float32 torch.compile, KV cache", "tokens_per_s": None, "ms_per_token": None,
                         "error": reason})
    else:
        notes.append("torch.compile not measured (--no-compile)")

    start = time.perf_counter()
    qm = quantize(ir, "int8")
    quantize_s = time.perf_counter() - start
    reference = ReferenceDecoder(qm)

    def integer_generate() -> list[int]:
        reference.reset()  # ReferenceDecoder.generate continues the sequence; each run is a new one
        return reference.generate(ids, n_tokens)

    integer_generate()  # warm-up
    runs, tokens = _time(integer_generate, repeats)
    rows.append(_row("int8 integer reference, KV cache", n_tokens, runs, tokens, eager_tokens, quantize_s=quantize_s))
    log(f"  int8 reference: {rows[-1]['ms_per_token']:.3f} ms/token")

    load_after = os.getloadavg()
    if max(load_before[0], load_after[0]) > int(info["cores"]):
        notes.append(f"other processes were busy: 1-min load average {load_before[0]:.1f} before, "
                     f"{load_after[0]:.1f} after, on {info['cores']} cores; figures are pessimistic")
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": info,
            "threads": torch.get_num_threads(), "model": str(model_path), "config": vars(ir.config),
            "prompt_tokens": len(ids), "n_tokens": n_tokens, "repeats": repeats,
            "timing": "median wall time of generate(prompt, n): prompt fed, n greedy tokens, batch 1",
            "load_average": {"before": load_before, "after": load_after}, "rows": rows, "notes": notes}


def table(result: dict) -> str:
    m = result["machine"]
    lines = [f"{Path(result['model']).name}, {result['n_tokens']} tokens from a {result['prompt_tokens']}-token prompt, "
             f"{m['cpu']}, {m['cores']} cores, {result['threads']} torch threads, torch {m['torch']}, {result['date']}",
             "", "| decoder | tokens/s | ms/token | best tokens/s | same tokens as float eager |", "|---|---|---|---|---|"]
    for row in result["rows"]:
        if row.get("tokens_per_s") is None:
            lines.append(f"| {row['name']} | — | — | — | {row.get('error', '')} |")
            continue
        same = {None: "(itself)", True: "yes", False: "no"}[row["same_tokens_as_float_eager"]]
        lines.append(f"| {row['name']} | {row['tokens_per_s']:.0f} | {row['ms_per_token']:.3f} | "
                     f"{row['best_tokens_per_s']:.0f} | {same} |")
    lines += [f"\nnote: {note}" for note in result["notes"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=BUNDLED_MODEL, help="ONNX model (default: the bundled one)")
    parser.add_argument("-n", "--tokens", type=int, default=128, help="tokens to generate (default 128)")
    parser.add_argument("--prompt", default=None, help="prompt text for a char-level model (default: one newline)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after the warm-up; the median is reported")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the machine's cores)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (it compiles for about a minute)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = measure_cpu(args.model, args.tokens, prompt=args.prompt, repeats=args.repeats, threads=args.threads,
                         use_compile=not args.no_compile, log=lambda s: print(s, flush=True))
    print("\n" + table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
