"""Quantisation quality: what each weight scheme costs in loss and in agreement with float.

    .venv/bin/python benchmarks/quality.py [--corpus ../shared/data/tinyshakespeare.txt] [--windows N]

On the bundled model and the validation split (the last 10% of the corpus, the same split
as training), for float and each scheme: validation loss computed from the integer
decoder's logits, teacher-forced top-1 agreement with the float model, average code bits
per weight and total weight bits. Then the same agreement on a random tiny HF GPT-2
(random token sequences). Prints a markdown table and writes benchmarks/results/quality.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package

from hardwire.cli import BUNDLED_MODEL  # noqa: E402
from hardwire.frontend import float_forward, load  # noqa: E402
from hardwire.quant import reference  # noqa: E402
from hardwire.quant.quantize import quantize  # noqa: E402

SCHEMES = [("int8", {}), ("mixed36", {"avg_bits": 4.0}), ("int4", {}), ("int3", {}), ("mxfp4", {})]


def validation_windows(corpus: Path, vocab: tuple[str, ...], length: int, windows: int) -> torch.Tensor:
    text = corpus.read_text(encoding="utf-8")
    val = text[int(len(text) * 0.9):]
    stoi = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([stoi[c] for c in val], dtype=torch.int64)
    n = (len(ids) - 1) // length
    if windows:
        n = min(n, windows)
    return ids[: n * length + 1]


def loss_and_agreement(logits: torch.Tensor, targets: torch.Tensor, float_top1: torch.Tensor) -> tuple[float, float]:
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1)).item()
    agree = (logits.argmax(-1) == float_top1).double().mean().item()
    return loss, agree


def integer_logits(qm, windows: torch.Tensor) -> torch.Tensor:
    """Float view of the integer decoder's logits, batch by batch (evaluation only)."""
    out = [reference.forward(qm, batch).double() * qm.scales["logits"] for batch in windows.split(64)]
    return torch.cat(out)


def random_gpt2_agreement(schemes: list[tuple[str, dict]]) -> dict[str, float]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                       bos_token_id=0, eos_token_id=0)).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids=ids, use_cache=False).logits

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt2.onnx"
        torch.onnx.export(Logits().eval(), (torch.zeros((1, 8), dtype=torch.long),), str(path), dynamo=True,
                          input_names=["input_ids"], dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=64)},))
        ir = load(path)
    ids = torch.randint(0, 96, (32, 64), generator=torch.Generator().manual_seed(1))
    top1 = float_forward(ir, ids).argmax(-1)
    result = {}
    for scheme, options in schemes:
        qm = quantize(ir, scheme, context=64, **options)
        result[scheme] = (reference.forward(qm, ids).argmax(-1) == top1).double().mean().item()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    parser.add_argument("--windows", type=int, default=0, help="validation windows of 128 characters (0: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "quality.json")
    args = parser.parse_args()

    ir = load(BUNDLED_MODEL)
    length = ir.config.context
    data = validation_windows(args.corpus, ir.vocab, length, args.windows)
    inputs = data[:-1].view(-1, length)
    targets = data[1:].view(-1, length)
    print(f"validation: {inputs.numel():,} characters in {inputs.shape[0]} windows of {length}", flush=True)
    float_logits = torch.cat([float_forward(ir, b) for b in inputs.split(64)]).double()
    float_top1 = float_logits.argmax(-1)
    rows = [{"scheme": "float", **dict(zip(("val_loss", "agreement"),
                                          loss_and_agreement(float_logits, targets, float_top1), strict=True)),
             "avg_bits": 32.0, "weight_bits": ir.n_params * 32}]
    for scheme, options in SCHEMES:
        start = time.time()
        qm = quantize(ir, scheme, **options)
        loss, agree = loss_and_agreement(integer_logits(qm, inputs), targets, float_top1)
        rows.append({"scheme": scheme + (f" @ {options['avg_bits']}" if options else ""), "val_loss": loss,
                     "agreement": agree, "avg_bits": qm.avg_weight_bits, "weight_bits": qm.weight_bits,
                     "bits": {name: t.bits for name, t in qm.weight_tensors()}})
        print(f"  {rows[-1]['scheme']:<14} done in {time.time() - start:.0f} s", flush=True)
    gpt2 = random_gpt2_agreement(SCHEMES)

    print(f"\nbundled model, validation split ({inputs.numel():,} characters), {date.today()}, {platform.machine()}\n")
    print("| scheme | val loss (nats/char) | top-1 agreement with float | avg bits/weight | weight bits | "
          "random GPT-2 agreement |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        key = row["scheme"].split(" ")[0]
        g = f"{gpt2[key]:.1%}" if key in gpt2 else "—"
        print(f"| {row['scheme']} | {row['val_loss']:.4f} | {row['agreement']:.2%} | {row['avg_bits']:.2f} | "
              f"{row['weight_bits']:,} | {g} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"date": str(date.today()), "machine": platform.machine(),
                                    "characters": inputs.numel(), "rows": rows, "random_gpt2_agreement": gpt2},
                                   indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
