"""CPU baseline for the chip: single-stream greedy decoding of the same model on this machine, by every engine
a user would pick for it.

    .venv/bin/python benchmarks/cpu_baseline.py [--model M.onnx ...] [-n 128] [--prompt TEXT] [--repeats 15]
                                                [--threads 1,2] [--no-compile]
    make bench-cpu   # installs the bench extra (llama-cpp-python, built from source; gguf) and runs this

Times generate(prompt, n) (prompt fed, then n greedy tokens; batch 1) for
  float32 eager           PyTorch with a KV cache (frontend.float_decoder.FloatDecoder)
  float32 torch.compile   the same under torch.compile (fixed-shape attention over the whole cache)
  float32 onnxruntime     the exported ONNX file itself: its graph has no KV cache, so each token reruns the
                          whole prefix, which is what a user with that file gets
  float32 llama.cpp F32   llama.cpp (llama-cpp-python) on a GGUF of the model (benchmarks/gguf_export.py), KV
                          cache in F32; the decode loop calls llama.cpp's C API (llama_decode, its greedy sampler)
  Q8_0 llama.cpp          the same with Q8_0 weights (8-bit blocks of 32; F32 where in-features are not a
                          multiple of 32)
  int8 integer reference  the integer reference decoder (quant.reference.ReferenceDecoder) on the int8 QModel
at each thread count (default: one, and all cores), after a warm-up run each. Reports the median of the
timed runs as tokens/s and ms/token, prints a markdown table and writes benchmarks/results/cpu_baseline.json.
The chip-vs-CPU benchmark (speed.py) calls measure_cpu(); rows whose name starts with "float" are the
float engines it takes the fastest of.

A llama.cpp figure is reported only after its GGUF is checked: llama.cpp's logits on three sequences of a
full context must be within 1e-4 (F32) of frontend.float_forward's, relative to the largest logit, and its
greedy tokens equal to ours; Q8_0 is checked the same way against float_forward on the Q8_0-rounded weights
(llama.cpp also rounds the activations to 8 bits there, hence a looser bound). Without llama-cpp-python
the llama.cpp rows say why and the rest is measured.

The default prompt is one newline: with n = 128 on the bundled models (context 128) the prompt plus the
n - 1 tokens fed back fill the context exactly, so the time is all one-token decode steps, as on the chip.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package
sys.path.insert(0, str(ROOT / "benchmarks"))  # gguf_export beside this file

from gguf_export import WEIGHT_TYPES, WeightType, stored_ir, write_gguf  # noqa: E402

from hardwire.cli import BUNDLED_MODEL  # noqa: E402
from hardwire.frontend import ModelIR, load  # noqa: E402
from hardwire.frontend.float_decoder import FloatDecoder  # noqa: E402
from hardwire.frontend.float_model import float_forward  # noqa: E402
from hardwire.quant.quantize import quantize  # noqa: E402
from hardwire.quant.reference import ReferenceDecoder  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "cpu_baseline.json"
BUNDLED_MODELS = (BUNDLED_MODEL, BUNDLED_MODEL.with_name("tinyshakespeare_pieces.onnx"))
GGUF_DIR = ROOT / "build" / "gguf"
DEFAULT_PROMPT = "\n"
# llama.cpp's logits against ours, as a fraction of our largest logit: F32 sums in another order only;
# Q8_0 also rounds each activation row to 8-bit blocks before its matmuls (ggml's q8_0 x q8_0 dot product)
LOGIT_TOLERANCE: dict[WeightType, float] = {"F32": 1e-4, "Q8_0": 5e-2}
# llama.cpp's KV cache in F32 (ggml type 0), flash attention off: the fastest settings measured here for both
# files (2026-12-07, one thread, character model: 12,900 tokens/s against 9,700 with the default F16 cache;
# flash attention on: 9,600 with F32, 12,000 with F16), and F32 keeps the F32 file's check at float precision
GGML_TYPE_F32 = 0
BENCH_EXTRA = "install the bench extra: `make bench-cpu`, or .venv/bin/pip install -e '.[bench]'"

Generate = Callable[[], list[int]]


class Unavailable(Exception):
    """An engine that cannot run here; the message says why, in one line."""


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
    return {"cpu": cpu, "cores": _cores(), "arch": platform.machine(), "torch": torch.__version__,
            "python": platform.python_version(), "engines": _versions()}


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _versions() -> dict[str, str]:
    out = {}
    for module in ("onnxruntime", "llama_cpp", "gguf"):
        try:
            out[module] = __import__(module).__version__
        except Exception:  # absent (or broken): the row of that engine says so
            continue
    return out


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


def _time(generate: Generate, repeats: int) -> tuple[list[float], list[int]]:
    runs, out = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = generate()
        runs.append(time.perf_counter() - start)
    return runs, out


def _row(name: str, threads: int, n: int, runs: list[float], tokens: list[int], reference: list[int] | None,
         **extra: object) -> dict:
    median = statistics.median(runs)
    return {"name": name, "threads": threads, "tokens_per_s": n / median, "ms_per_token": median / n * 1e3,
            "best_tokens_per_s": n / min(runs), "runs_s": runs,
            "same_tokens_as_float_eager": None if reference is None else tokens == reference, **extra}


def _failed(name: str, threads: int | None, reason: str, **extra: object) -> dict:
    return {"name": name, "threads": threads, "tokens_per_s": None, "ms_per_token": None, "error": reason, **extra}


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


# --- engines: each make(threads) -> (generate, extra fields of the row), after setting up what it needs ---

def _torch_engines(ir: ModelIR, ids: list[int], n: int, use_compile: bool, log: Callable[[str], None]
                   ) -> list[tuple[str, Callable[[int], tuple[Generate, dict]]]]:
    def eager(threads: int) -> tuple[Generate, dict]:
        torch.set_num_threads(threads)
        decoder = FloatDecoder(ir)
        return (lambda: decoder.generate(ids, n)), {}

    def compiled(threads: int) -> tuple[Generate, dict]:
        torch.set_num_threads(threads)
        decoder = FloatDecoder(ir)
        decoder.compile()
        start = time.perf_counter()
        try:
            decoder.generate(ids, n)  # traces and compiles the prompt and the one-token step
        except Exception as error:  # inductor needs a working C++ toolchain; say what failed instead of the figure
            raise Unavailable(f"torch.compile failed on this CPU: {_one_line(error)}") from error
        compile_s = time.perf_counter() - start
        log(f"  torch.compile at {threads} thread(s): first run (compiling) {compile_s:.0f} s")
        return (lambda: decoder.generate(ids, n)), {"first_run_s": compile_s}

    qm_box: list = []

    def integer(threads: int) -> tuple[Generate, dict]:
        torch.set_num_threads(threads)
        start = time.perf_counter()
        if not qm_box:
            qm_box.append(quantize(ir, "int8"))
        quantize_s = time.perf_counter() - start
        reference = ReferenceDecoder(qm_box[0])

        def generate() -> list[int]:
            reference.reset()  # ReferenceDecoder.generate continues the sequence; each run is a new one
            return reference.generate(ids, n)
        return generate, {"quantize_s": quantize_s}

    engines = [("float32 eager, KV cache", eager)]
    if use_compile:
        engines.append(("float32 torch.compile, KV cache", compiled))
    engines.append(("int8 integer reference, KV cache", integer))
    return engines


def _onnxruntime_engine(model_path: Path, ids: list[int], n: int) -> Callable[[int], tuple[Generate, dict]]:
    def make(threads: int) -> tuple[Generate, dict]:
        if Path(model_path).suffix != ".onnx":
            raise Unavailable(f"{Path(model_path).name} is not an ONNX file")
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        inputs = session.get_inputs()
        if len(inputs) != 1:
            raise Unavailable(f"the graph takes {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                              "only a graph of token ids alone is timed")
        name, dtype = inputs[0].name, np.int32 if inputs[0].type == "tensor(int32)" else np.int64

        def generate() -> list[int]:
            seq, out = list(ids), []
            for _ in range(n):  # no KV cache in the graph: every token reruns the whole prefix
                logits = session.run(None, {name: np.asarray([seq], dtype=dtype)})[0]  # (1, len(seq), vocab)
                out.append(int(logits[0, -1].argmax()))
                seq.append(out[-1])
            return out
        return generate, {"kv_cache": False}
    return make


_LOG_CALLBACKS: list[object] = []  # ctypes callbacks handed to llama.cpp must outlive every call into it


def _llama_cpp_errors_only(llama_cpp: object) -> None:
    """Let through llama.cpp's errors only. llama-cpp-python 0.3.36 reads ggml's log levels one off (a warning as
    an error), so verbose=False still prints "n_ctx_seq (256) > n_ctx_train (128)" for every context: llama.cpp
    pads the context to 256 and the model declares 128, which is all we use."""
    def errors_only(level: int, text: bytes, user_data: object) -> None:
        if level == 4:  # GGML_LOG_LEVEL_ERROR in ggml.h
            sys.stderr.write(text.decode("utf-8", "replace"))
    callback = llama_cpp.llama_log_callback(errors_only)
    _LOG_CALLBACKS.append(callback)
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


class LlamaCppGreedy:
    """Greedy decoding by llama.cpp's C API, as llama.cpp's own programs decode: llama_decode on the prompt,
    then its greedy sampler and one llama_decode per token; Python only loops (a few ctypes calls a token)."""

    def __init__(self, llama_cpp: object, llm: object, ids: list[int], n: int) -> None:
        self.api, self.llm, self.n = llama_cpp, llm, n  # llm owns the model and context: kept alive here
        self.ctx = llm._ctx.ctx
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.sampler = llama_cpp.llama_sampler_init_greedy()
        self.prompt = (llama_cpp.llama_token * len(ids))(*ids)
        self.token = (llama_cpp.llama_token * 1)()

    def __call__(self) -> list[int]:
        api, ctx = self.api, self.ctx
        api.llama_memory_clear(self.memory, True)  # a new sequence each run
        if api.llama_decode(ctx, api.llama_batch_get_one(self.prompt, len(self.prompt))):
            raise RuntimeError("llama_decode failed on the prompt")
        out: list[int] = []
        for _ in range(self.n):
            out.append(api.llama_sampler_sample(self.sampler, ctx, -1))
            if len(out) < self.n:
                self.token[0] = out[-1]
                if api.llama_decode(ctx, api.llama_batch_get_one(self.token, 1)):
                    raise RuntimeError(f"llama_decode failed at position {len(self.prompt) + len(out) - 1}")
        return out


def _llama_cpp_engines(ir: ModelIR, model_path: Path, ids: list[int], n: int,
                       log: Callable[[str], None]) -> list[tuple[str, Callable[[int], tuple[Generate, dict]] | str]]:
    """One engine per GGUF weight type, each verified first; an engine that cannot run is its reason instead."""
    names = {"F32": "float32 llama.cpp, GGUF F32, KV cache", "Q8_0": "Q8_0 llama.cpp, GGUF Q8_0 weights, KV cache"}
    try:
        import gguf  # noqa: F401
        import llama_cpp
    except ImportError as error:
        reason = f"llama.cpp not measured: {error.name or 'llama_cpp'} is not installed ({BENCH_EXTRA})"
        return [(names[w], reason) for w in WEIGHT_TYPES]
    _llama_cpp_errors_only(llama_cpp)
    context = ir.config.context or len(ids) + n
    out: list[tuple[str, Callable[[int], tuple[Generate, dict]] | str]] = []
    for weights in WEIGHT_TYPES:
        try:
            written = write_gguf(ir, GGUF_DIR / f"{Path(model_path).stem}-{weights}.gguf", weights)
        except ValueError as error:
            out.append((names[weights], f"no GGUF of this model: {error}"))
            continue

        def open_model(threads: int, logits_all: bool = False, path: Path = written.path):
            return llama_cpp.Llama(str(path), n_ctx=context, n_batch=context, n_ubatch=context, n_threads=threads,
                                   n_threads_batch=threads, logits_all=logits_all, verbose=False, flash_attn=False,
                                   type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)

        def make(threads: int, open_model=open_model) -> tuple[Generate, dict]:
            return LlamaCppGreedy(llama_cpp, open_model(threads), ids, n), {}

        try:
            check = verify_gguf(ir, weights, open_model, llama_cpp, ids, n, context)
        except Exception as error:  # llama.cpp refused the file: its message is the reason
            out.append((names[weights], f"llama.cpp could not run the GGUF: {_one_line(error)}"))
            continue
        log(f"  llama.cpp {weights}: logits within {check['max_relative_logit_difference']:.1e} of ours "
            f"(limit {check['tolerance']:.0e}); greedy tokens {'equal' if check['tokens_equal'] else 'DIFFER'}")
        if not check["passed"]:
            out.append((names[weights], f"refused: the GGUF does not decode as our model ({check['summary']})",))
            continue
        extra = {"gguf": str(written.path.relative_to(ROOT) if written.path.is_relative_to(ROOT) else written.path),
                 "kept_f32": list(written.kept_f32), "check": check}

        def make_checked(threads: int, make=make, extra=extra) -> tuple[Generate, dict]:
            generate, more = make(threads)
            return generate, {**extra, **more}
        out.append((names[weights], make_checked))
    return out


def verify_gguf(ir: ModelIR, weights: WeightType, open_model: Callable[..., object], llama_cpp: object,
                ids: list[int], n: int, context: int) -> dict:
    """llama.cpp's logits and greedy tokens against float_forward / FloatDecoder on the weights the file holds.

    Logits on three full contexts (the benchmark's prompt and greedy continuation, two random sequences);
    greedy tokens from the benchmark's prompt and from a random 8-token one (the bundled character model
    answers a lone newline with newlines only, which would check little).
    """
    expected_ir = stored_ir(ir, weights)
    rng = np.random.default_rng(0)
    vocab = ir.config.vocab_size
    prompts = [ids, rng.integers(0, vocab, size=8).tolist()]
    ours = [FloatDecoder(expected_ir).generate(p, min(n, context - len(p) + 1)) for p in prompts]
    sequences = [(ids + ours[0])[:context]] + [rng.integers(0, vocab, size=context).tolist() for _ in range(2)]
    llm = open_model(_cores(), logits_all=True)
    worst, largest = 0.0, 0.0
    for seq in sequences:
        llm.reset()
        llm.eval(seq)
        got = np.asarray(llm.scores[: len(seq)], dtype=np.float64)  # (len, vocab)
        want = float_forward(expected_ir, torch.tensor([seq]))[0].double().numpy()
        worst = max(worst, float(np.abs(got - want).max()))
        largest = max(largest, float(np.abs(want).max()))
    del llm
    relative, tolerance = worst / largest, LOGIT_TOLERANCE[weights]
    differ = []
    for prompt, expected in zip(prompts, ours, strict=True):
        tokens = LlamaCppGreedy(llama_cpp, open_model(1), prompt, len(expected))()
        if tokens == expected:
            continue
        k = next(i for i, (a, b) in enumerate(zip(tokens, expected, strict=True)) if a != b)
        logits = float_forward(expected_ir, torch.tensor([prompt + expected[:k]]))[0, -1]
        margin = float(logits[expected[k]] - logits[tokens[k]])  # how close our two candidates were there
        differ.append(f"from a {len(prompt)}-token prompt they differ from generated token {k} (ours {expected[k]}, "
                      f"llama.cpp's {tokens[k]}, {margin:.2e} apart in our logits = {margin / largest:.1e} of the largest)")
    generated = sum(len(t) for t in ours)
    return {"sequences": len(sequences), "positions": sum(len(s) for s in sequences),
            "max_abs_logit_difference": worst, "largest_logit": largest, "max_relative_logit_difference": relative,
            "tolerance": tolerance, "against": "float_forward" + ("" if weights == "F32" else " on the Q8_0-rounded weights"),
            "greedy_prompts": len(prompts), "greedy_tokens": generated, "tokens_equal": not differ,
            "passed": relative <= tolerance and not differ,
            "summary": f"max logit difference {worst:.2e} = {relative:.1e} of the largest, limit {tolerance:.0e}; "
                       + (f"{generated} greedy tokens from {len(prompts)} prompts equal" if not differ
                          else "greedy tokens differ: " + "; ".join(differ))}


def _thread_counts(threads: int | Sequence[int] | None, cores: int) -> list[int]:
    if threads is None:
        return sorted({1, cores})
    return [threads] if isinstance(threads, int) else list(dict.fromkeys(threads))


def measure_cpu(model_path: str | os.PathLike[str] = BUNDLED_MODEL, n_tokens: int = 128, *, prompt: str | None = None,
                repeats: int = 15, threads: int | Sequence[int] | None = None, use_compile: bool = True,
                use_llama_cpp: bool = True, log: Callable[[str], None] = lambda s: None) -> dict:
    """Time single-stream greedy decoding of n_tokens on this CPU by each engine; -> the result record (module doc).

    threads: one count or several (default: 1 and all cores); each engine is timed at each.
    """
    info = machine()
    counts = _thread_counts(threads, int(info["cores"]))
    model_path = Path(model_path)
    ir = load(model_path)
    ids = prompt_ids(ir, prompt)
    context = ir.config.context
    if context is not None and len(ids) + n_tokens - 1 > context:
        raise SystemExit(f"{len(ids)} prompt tokens + {n_tokens - 1} fed back exceed the context of {context}; "
                         "shorten the prompt or lower -n")
    load_before = os.getloadavg()
    notes: list[str] = []
    rows: list[dict] = []
    eager_tokens = FloatDecoder(ir).generate(ids, n_tokens)  # the tokens every engine is compared with

    engines: list[tuple[str, Callable[[int], tuple[Generate, dict]] | str]] = []
    engines += _torch_engines(ir, ids, n_tokens, use_compile, log)
    engines.insert(2 if use_compile else 1, ("float32 onnxruntime, whole prefix per token (no KV cache in the graph)",
                                             _onnxruntime_engine(model_path, ids, n_tokens)))
    if use_llama_cpp:
        engines += _llama_cpp_engines(ir, model_path, ids, n_tokens, log)
    else:
        notes.append("llama.cpp not measured (--no-llama-cpp)")
    if not use_compile:
        notes.append("torch.compile not measured (--no-compile)")

    for name, make in engines:
        if isinstance(make, str):
            rows.append(_failed(name, None, make))
            if not any(make in note for note in notes):  # one line for a reason shared by several engines
                notes.append(make if make.startswith("llama.cpp not measured") else f"{name}: {make}")
                log(f"  {notes[-1]}")
            continue
        for count in counts:
            try:
                generate, extra = make(count)
                generate()  # warm-up
                runs, tokens = _time(generate, repeats)
            except Exception as error:  # Unavailable says why; anything else is reported, not a stack trace
                reason = str(error) if isinstance(error, Unavailable) else f"{name} failed: {_one_line(error)}"
                rows.append(_failed(name, count, reason))
                notes.append(reason)
                log(f"  {reason}")
                break
            rows.append(_row(name, count, n_tokens, runs, tokens, eager_tokens, **extra))
            log(f"  {name}, {count} thread(s): {rows[-1]['tokens_per_s']:,.0f} tokens/s")

    load_after = os.getloadavg()
    if max(load_before[0], load_after[0]) > int(info["cores"]):
        notes.append(f"other processes were busy: 1-min load average {load_before[0]:.1f} before, "
                     f"{load_after[0]:.1f} after, on {info['cores']} cores; figures are pessimistic")
    measured = [r for r in rows if r.get("tokens_per_s")]

    def best(candidates: list[dict]) -> dict | None:
        top = max(candidates, key=lambda r: r["tokens_per_s"], default=None)
        return None if top is None else {k: top[k] for k in ("name", "threads", "tokens_per_s")}
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": info, "threads": counts,
            "model": str(model_path), "config": vars(ir.config), "prompt_tokens": len(ids), "n_tokens": n_tokens,
            "repeats": repeats,
            "timing": "median wall time of generate(prompt, n): prompt fed, n greedy tokens, batch 1",
            "load_average": {"before": load_before, "after": load_after}, "rows": rows,
            "fastest": best(measured), "fastest_float": best([r for r in measured if r["name"].startswith("float")]),
            "notes": notes}


def table(result: dict) -> str:
    m = result["machine"]
    engines = ", ".join(f"{k} {v}" for k, v in m.get("engines", {}).items())
    lines = [f"{Path(result['model']).name}, {result['n_tokens']} tokens from a {result['prompt_tokens']}-token prompt, "
             f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {engines}, {result['date']}",
             "", "| engine | threads | tokens/s | ms/token | best tokens/s | same tokens as float eager | check |",
             "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        threads = "—" if row.get("threads") is None else row["threads"]
        if row.get("tokens_per_s") is None:
            lines.append(f"| {row['name']} | {threads} | — | — | — | — | {row.get('error', '')} |")
            continue
        same = {None: "(itself)", True: "yes", False: "no"}[row["same_tokens_as_float_eager"]]
        check = row["check"]["summary"] if "check" in row else ""
        lines.append(f"| {row['name']} | {threads} | {row['tokens_per_s']:,.0f} | {row['ms_per_token']:.3f} | "
                     f"{row['best_tokens_per_s']:,.0f} | {same} | {check} |")
    for key, label in (("fastest", "fastest engine"), ("fastest_float", "fastest float engine")):
        if result.get(key):
            top = result[key]
            lines.append(f"\n{label}: {top['name']}, {top['threads']} thread(s), {top['tokens_per_s']:,.0f} tokens/s")
    lines += [f"\nnote: {note}" for note in result["notes"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, nargs="+", default=list(BUNDLED_MODELS),
                        help="ONNX models (default: both bundled ones)")
    parser.add_argument("-n", "--tokens", type=int, default=128, help="tokens to generate (default 128)")
    parser.add_argument("--prompt", default=None, help="prompt text for a char-level model (default: one newline)")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs after the warm-up; the median is reported")
    parser.add_argument("--threads", type=lambda v: [int(t) for t in v.split(",")], default=None,
                        help="thread counts, comma-separated (default: 1 and the machine's cores)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (it compiles for about a minute)")
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = []
    for model in args.model:
        print(f"{model.name} ...", flush=True)
        results.append(measure_cpu(model, args.tokens, prompt=args.prompt, repeats=args.repeats, threads=args.threads,
                                   use_compile=not args.no_compile, use_llama_cpp=not args.no_llama_cpp,
                                   log=lambda s: print(s, flush=True)))
        print("\n" + table(results[-1]) + "\n", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = "benchmarks/cpu_baseline.py " + " ".join(sys.argv[1:])
    args.out.write_text(json.dumps({"command": command.strip(), "models": results}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
