"""The error budget: what each integer site costs in agreement with float, one site at a time.

    .venv/bin/python benchmarks/error_budget.py [--scheme int8] [--windows N] [--model PATH]

On the bundled model's validation split: the float model with its weights rounded as
`--scheme` stores them (activations float), then with one group of activation sites rounded
to the integer decoder's grid (weights float; quant/fake_quant.py), then all activation
sites, weights and activations together, and last the integer decoder itself. Each row:
teacher-forced top-1 agreement with float, validation loss, KL(float || row). Prints a
markdown table and writes benchmarks/results/error_budget_<scheme>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package
sys.path.insert(0, str(ROOT / "benchmarks"))

from quality import compare, integer_logits, validation_set  # noqa: E402

from hardwire.cli import BUNDLED_MODEL  # noqa: E402
from hardwire.frontend import float_forward  # noqa: E402
from hardwire.quant.calibrate import calibrate, self_generated  # noqa: E402
from hardwire.quant.fake_quant import SITE_GROUPS, rounding  # noqa: E402
from hardwire.quant.fold import fold_norms  # noqa: E402
from hardwire.quant.quantize import (  # noqa: E402
    CALIBRATION_SEQUENCES,
    activation_steps,
    quantize,
    residual_and_logit_scales,
    rounded_weights,
)

SITE_TITLES = {"norm": "norm outputs (int12, per channel)", "q": "q (int12 into RoPE, int8 after)",
               "k": "k (int12 into RoPE, int8 KV cache)", "v": "v (int8, the KV cache)",
               "probs": "softmax (EXP table, Q15 probabilities)", "attn_out": "attention output (int8)",
               "gate": "gate (int8) and its SILU table (9 bits out)", "up": "up (int8)", "hidden": "MLP hidden (GELU table out)",
               "residual": "residual (int16)", "logits": "logits (int32)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    parser.add_argument("--scheme", default="int8")
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    parser.add_argument("--windows", type=int, default=0, help="validation windows (0: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    ir, inputs, targets, chars = validation_set(args.model, args.corpus, args.windows, "the error budget")
    length = inputs.shape[1]

    folded = fold_norms(ir)
    cal = calibrate(folded, self_generated(folded, sequences=CALIBRATION_SEQUENCES, length=min(length, 128)))
    steps, scales = activation_steps(ir.config, cal), residual_and_logit_scales(cal)

    def run(model, groups: set[str]) -> torch.Tensor:
        transform = rounding(ir.config, steps, scales, groups)
        return torch.cat([float_forward(model, b, transform=transform) for b in inputs.split(64)])

    reference = run(folded, set())
    rows = []

    def add(title: str, logits: torch.Tensor) -> None:
        rows.append({"row": title, **compare(logits, reference, targets)})
        print(f"  {title}: {rows[-1]['agreement']:.2%}", flush=True)

    add("float", reference)
    start = time.time()
    weights = rounded_weights(folded, cal, args.scheme)
    add(f"{args.scheme} weights alone", run(weights, set()))
    for group in SITE_GROUPS:
        if group == "hidden" and ir.config.gated:
            continue  # SILU[g] * u is exact: nothing is rounded there
        add(SITE_TITLES[group], run(folded, {group}))
    every = set(SITE_GROUPS)
    add("every activation site", run(folded, every))
    add(f"every activation site, {args.scheme} weights", run(weights, every))
    qm = quantize(ir, args.scheme)
    add(f"the integer decoder ({args.scheme})", integer_logits(qm, inputs).float())
    print(f"  ({time.time() - start:.0f} s)")

    print(f"\n{args.model.name}, {args.scheme}, validation split ({inputs.numel():,} tokens, {chars:,} characters), "
          f"{date.today()}\n")
    print("| rounded to the integer grid | top-1 agreement with float | val loss | KL to float |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['row']} | {row['agreement']:.2%} | {row['val_loss']:.4f} | {row['kl']:.5f} |")
    out = args.out or ROOT / "benchmarks" / "results" / f"error_budget_{args.scheme}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": str(date.today()), "machine": platform.machine(), "model": args.model.name,
                               "scheme": args.scheme, "tokens": inputs.numel(), "characters": chars, "rows": rows},
                              indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
