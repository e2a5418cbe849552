"""Quantisation quality: what each weight scheme costs in loss and in agreement with float.

    .venv/bin/python benchmarks/quality.py [--model M.onnx] [--corpus ../shared/data/tinyshakespeare.txt] [--windows N]

On a model with a vocabulary (the bundled character model by default, or the bundled
word-piece model) and the validation split (the last 10% of the corpus, the same split
as training), for float and each scheme: validation loss computed from the integer
decoder's logits (per token and per character), teacher-forced top-1 agreement with the
float model, KL(float || integer), average bits per weight (scales included) and total
weight bits. Then the same agreement on a random tiny HF GPT-2 (random token sequences).
Prints a markdown table and writes benchmarks/results/quality.json (quality_<model>.json
for another model).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package

from hardwire.cli import BUNDLED_MODEL  # noqa: E402
from hardwire.frontend import float_forward, load  # noqa: E402
from hardwire.frontend.float_model import soft_cap  # noqa: E402
from hardwire.frontend.vocab import encode  # noqa: E402
from hardwire.quant import reference  # noqa: E402
from hardwire.quant.divergence import kl_per_token  # noqa: E402
from hardwire.quant.quantize import quantize  # noqa: E402

SCHEMES = [("int8", {}), ("mixed36", {"avg_bits": 4.0}), ("int4", {}), ("int3", {}), ("mxfp4", {})]


def validation_windows(corpus: Path, vocab: tuple[str, ...], length: int, windows: int) -> torch.Tensor:
    text = corpus.read_text(encoding="utf-8")
    val = text[int(len(text) * 0.9):]
    ids = torch.tensor(encode(val, vocab), dtype=torch.int64)
    n = (len(ids) - 1) // length
    if windows:
        n = min(n, windows)
    return ids[: n * length + 1]


def validation_set(model: Path, corpus: Path, windows: int, purpose: str):
    """(ModelIR, inputs, targets, characters): the model and its validation split in windows of its context."""
    ir = load(model)
    if ir.vocab is None:
        raise SystemExit(f"{model}: {purpose} needs a model with a vocabulary (hardwire.vocab metadata)")
    length = ir.config.context or 128
    data = validation_windows(corpus, ir.vocab, length, windows)
    inputs, targets = data[:-1].view(-1, length), data[1:].view(-1, length)
    chars = sum(len(ir.vocab[t]) for t in targets.reshape(-1).tolist())
    print(f"validation: {inputs.numel():,} tokens ({chars:,} characters) in {inputs.shape[0]} windows of {length}",
          flush=True)
    return ir, inputs, targets, chars


def compare(logits: torch.Tensor, reference: torch.Tensor, targets: torch.Tensor,
            cap: float | None = None) -> dict[str, float]:
    """Top-1 agreement with the reference logits, cross-entropy on the targets, KL(reference || logits), per token.

    Both are the head's outputs before a logit soft-cap CAP (Gemma 2; float_forward(..., capped=False)): agreement
    is their argmax, the token the chip gives (numerics §8); the loss and KL see the model's capped distribution."""
    agreement = (logits.argmax(-1) == reference.argmax(-1)).double().mean().item()
    logits, reference = soft_cap(logits.double(), cap), soft_cap(reference.double(), cap)
    lp = logits.log_softmax(-1)
    return {"agreement": agreement, "val_loss": -lp.gather(-1, targets.unsqueeze(-1)).mean().item(),
            "kl": kl_per_token(reference, logits)}


def integer_logits(qm, windows: torch.Tensor) -> torch.Tensor:
    """Float view of the integer decoder's logits (before a logit soft-cap, as the chip computes them), batch by batch
    (evaluation only)."""
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
    parser.add_argument("--model", type=Path, default=BUNDLED_MODEL)
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "data" / "tinyshakespeare.txt")
    parser.add_argument("--windows", type=int, default=0, help="validation windows of `context` tokens (0: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    ir, inputs, targets, chars = validation_set(args.model, args.corpus, args.windows, "quality")
    per_char = inputs.numel() / chars  # nats/token x tokens/character
    float_logits = torch.cat([float_forward(ir, b, capped=False) for b in inputs.split(64)]).double()
    cap = ir.config.logit_softcap
    rows = [{"scheme": "float", **compare(float_logits, float_logits, targets, cap), "avg_bits": 32.0,
             "weight_bits": ir.n_params * 32}]
    for scheme, options in SCHEMES:
        start = time.time()
        qm = quantize(ir, scheme, **options)
        rows.append({"scheme": scheme + (f" @ {options['avg_bits']}" if options else ""),
                     **compare(integer_logits(qm, inputs), float_logits, targets, cap),
                     "avg_bits": qm.avg_weight_bits, "weight_bits": qm.weight_bits,
                     "bits": {name: t.bits for name, t in qm.weight_tensors()}})
        print(f"  {rows[-1]['scheme']:<14} done in {time.time() - start:.0f} s", flush=True)
    gpt2 = random_gpt2_agreement(SCHEMES)

    print(f"\n{args.model.name}, validation split ({inputs.numel():,} tokens, {chars:,} characters), {date.today()}, "
          f"{platform.machine()}\n")
    print("| scheme | val loss (nats/token) | val loss (nats/char) | top-1 agreement with float | KL to float | "
          "avg bits/weight | weight bits | random GPT-2 agreement |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        key = row["scheme"].split(" ")[0]
        g = f"{gpt2[key]:.1%}" if key in gpt2 else "—"
        print(f"| {row['scheme']} | {row['val_loss']:.4f} | {row['val_loss'] * per_char:.4f} | {row['agreement']:.2%} | "
              f"{row['kl']:.4f} | {row['avg_bits']:.2f} | {row['weight_bits']:,} | {g} |")
    out = args.out or ROOT / "benchmarks" / "results" / (
        "quality.json" if args.model == BUNDLED_MODEL else f"quality_{args.model.stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": str(date.today()), "machine": platform.machine(), "model": args.model.name,
                               "tokens": inputs.numel(), "characters": chars, "rows": rows,
                               "random_gpt2_agreement": gpt2}, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
