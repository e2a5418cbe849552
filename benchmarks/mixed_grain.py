"""Does mixed 3/6-bit pay at a finer grain? Per-tensor against per-row allocation, beside uniform int4.

    .venv/bin/python benchmarks/mixed_grain.py [--model M.onnx] [--windows N] [--budgets 4.0 4.5]

The compiler allocates 3 or 6 bits per tensor (quantize.choose_bits: KL sensitivity). This
benchmark also builds, in the integer reference only, a per-row allocation: each row's gain
from 6 bits is its Hessian output error at 3 bits minus at 6 (`(w - q) H (w - q)^T`, the
error GPTQ minimises), scaled so that a tensor's rows sum to its KL sensitivity; rows go to
6 bits by gain per weight while the budget (codes and scales, as avg_weight_bits counts
them) holds. The RTL stores one width per tensor, so the per-row rows are an experiment:
they say whether per-row widths in hardware would pay. Prints a markdown table and writes
benchmarks/results/mixed_grain_<model>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path
from unittest import mock

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package

from hardwire.benchmarks.quality import compare, integer_logits, validation_set  # noqa: E402
from hardwire.cli import BUNDLED_MODEL  # noqa: E402
from hardwire.frontend import float_forward  # noqa: E402
from hardwire.quant import quantize as q  # noqa: E402
from hardwire.quant.weights import QuantizedWeight, scale_bits  # noqa: E402

FORMAT = q.WEIGHT_FORMAT["mixed36"]


def per_row_quantize(ir, avg_bits: float):
    """A QModel whose projections mix int3 and int6 rows (stored as 6-bit tensors), chosen per row."""
    rows: dict[str, tuple[QuantizedWeight, QuantizedWeight, np.ndarray]] = {}
    original = q._quantize

    def choose(scheme, folded, cal, budget, in_steps):
        weights = q._weights(folded)
        sens = q.sensitivity(folded, cal, in_steps, weight_format=FORMAT)
        n = sum(w.size for w in weights.values())
        side = sum(scale_bits(*w.shape, FORMAT) for w in weights.values())
        gains = []
        for name, w in weights.items():
            steps = in_steps(name)
            low, high = original(name, w, FORMAT, 3, cal, steps), original(name, w, FORMAT, 6, cal, steps)
            scaled = w * (1.0 if steps is None else steps[None, :])
            site = q._input_site(name)
            h = np.eye(w.shape[1]) if site is None else cal.gram[site] / np.outer(steps, steps)

            def error(qw: QuantizedWeight, scaled=scaled, h=h) -> np.ndarray:
                d = scaled - qw.dequantize()
                return np.einsum("ri,ij,rj->r", d, h, d)

            e3, e6 = error(low), error(high)
            gain = sens[name] * (e3 - e6) / max(float(e3.sum()), 1e-300)
            gains += [(float(g) / w.shape[1], name, r, w.shape[1]) for r, g in enumerate(gain)]
            rows[name] = (low, high, np.zeros(w.shape[0], dtype=bool))
        room, used = budget * n - side, 3 * n
        for _, name, r, cols in sorted(gains, reverse=True):
            if used + 3 * cols <= room:
                rows[name][2][r] = True
                used += 3 * cols
        return dict.fromkeys(weights, 6)

    def quantize_rows(name, w, scheme, bits, cal, in_scale=None):
        if name not in rows:
            return original(name, w, scheme, bits, cal, in_scale)
        low, high, six = rows[name]
        shift = np.where(six[:, None], high.block_shift, low.block_shift)
        return QuantizedWeight(FORMAT, 6, np.where(six[:, None], high.codes, low.codes),
                               np.where(six, high.row_scale, low.row_scale), shift, None, 0.0)

    with mock.patch.object(q, "choose_bits", choose), mock.patch.object(q, "_quantize", quantize_rows):
        qm = q.quantize(ir, "mixed36", avg_bits=avg_bits)
    six = sum(int(v[2].sum()) * v[0].codes.shape[1] for v in rows.values())
    total = sum(v[0].codes.size for v in rows.values())
    code_bits = 3 * total + 3 * six
    return qm, (code_bits + qm.scale_bits) / qm.n_weights, six / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    parser.add_argument("--windows", type=int, default=100, help="validation windows of `context` tokens (0: all)")
    parser.add_argument("--budgets", type=float, nargs="+", default=[4.0, 4.5])
    args = parser.parse_args()

    ir, inputs, targets, _ = validation_set(args.model, args.corpus, args.windows, "mixed_grain")
    float_logits = torch.cat([float_forward(ir, b) for b in inputs.split(64)]).double()
    rows = []

    def measure(label: str, qm, bits: float, six: float) -> None:
        rows.append({"variant": label, **compare(integer_logits(qm, inputs), float_logits, targets), "avg_bits": bits,
                     "six_bit_share": six})
        print(f"  {label:<28} {rows[-1]['agreement']:.2%}  ({time.time() - start:.0f} s)", flush=True)

    for scheme in ("int4", "int3"):
        start = time.time()
        qm = q.quantize(ir, scheme)
        measure(scheme, qm, qm.avg_weight_bits, 0.0)
    for budget in args.budgets:
        start = time.time()
        qm = q.quantize(ir, "mixed36", avg_bits=budget)
        six = sum(t.codes.numel() for _, t in qm.weight_tensors() if t.bits == 6) / qm.n_weights
        measure(f"mixed36 per tensor @ {budget}", qm, qm.avg_weight_bits, six)
        start = time.time()
        measure(f"mixed36 per row @ {budget}", *per_row_quantize(ir, budget))

    print(f"\n{args.model.name}, {inputs.numel():,} validation tokens, {date.today()}, {platform.machine()}\n")
    print("| variant | top-1 agreement with float | KL to float | avg bits/weight (scales included) | weights at 6 bits |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['variant']} | {row['agreement']:.2%} | {row['kl']:.4f} | {row['avg_bits']:.2f} | "
              f"{row['six_bit_share']:.0%} |")
    out = ROOT / "benchmarks" / "results" / f"mixed_grain_{args.model.stem}.json"
    out.write_text(json.dumps({"date": str(date.today()), "model": args.model.name, "tokens": inputs.numel(),
                               "rows": rows}, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
