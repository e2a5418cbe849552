"""Train a bundled tiny Llama on a corpus and export it to ONNX.

    python examples/train_tiny.py ../shared/data/tinyshakespeare.txt -o models/      # characters, 3 x 128
    python examples/train_tiny.py ../shared/data/tinyshakespeare.txt -o models/ --name tinyshakespeare_pieces \
        --pieces 512 --d-model 64 --layers 4 --ffn 172                               # word pieces, llama2.c 260K shape
    python examples/train_tiny.py ../shared/data/tinyshakespeare.txt -o models/ --name tinyshakespeare_small \
        --d-model 48 --layers 2 --heads 3 --ffn 128 --context 64 --threads 1         # characters, for the small boards

Deterministic for a given seed and thread count. The last 10% of the corpus is the
validation split, the same split the quality benchmarks use.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hardwire.frontend.vocab import encode, learn_pieces

try:
    from hardwire.examples.tiny_llama import TinyLlama, TinyLlamaConfig, export_onnx
except ImportError:  # run from a checkout without installing
    from tiny_llama import TinyLlama, TinyLlamaConfig, export_onnx  # type: ignore[no-redef]


def split_corpus(text: str) -> tuple[str, str]:
    """First 90% for training, last 10% for validation."""
    cut = int(len(text) * 0.9)
    return text[:cut], text[cut:]


@torch.no_grad()
def evaluate(model: TinyLlama, data: torch.Tensor, context: int, batches: int = 0) -> float:
    """Mean cross-entropy over non-overlapping windows of the data (all of it if batches == 0)."""
    model.eval()
    n = (len(data) - 1) // context
    starts = torch.arange(n) * context
    if batches:
        starts = starts[: batches * 64]
    total, count = 0.0, 0
    for chunk in starts.split(64):
        x = torch.stack([data[s : s + context] for s in chunk])
        y = torch.stack([data[s + 1 : s + 1 + context] for s in chunk])
        logits = model(x)
        total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path, help="plain-text corpus (tinyshakespeare.txt)")
    parser.add_argument("-o", "--out", type=Path, default=Path("models"), help="output folder")
    parser.add_argument("--name", default="tinyshakespeare", help="file stem of the outputs")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pieces", type=int, default=0, help="learn a word-piece vocabulary of this size (0: characters)")
    parser.add_argument("--d-model", type=int, default=TinyLlamaConfig.d_model)
    parser.add_argument("--layers", type=int, default=TinyLlamaConfig.n_layers)
    parser.add_argument("--heads", type=int, default=TinyLlamaConfig.n_heads)
    parser.add_argument("--ffn", type=int, default=TinyLlamaConfig.ffn)
    parser.add_argument("--context", type=int, default=TinyLlamaConfig.context, help="longest sequence trained for")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    text = args.corpus.read_text(encoding="utf-8")
    train_text, val_text = split_corpus(text)
    vocab = list(learn_pieces(train_text, args.pieces) if args.pieces else sorted(set(text)))
    train = torch.tensor(encode(train_text, vocab), dtype=torch.long)
    val = torch.tensor(encode(val_text, vocab), dtype=torch.long)
    print(f"vocabulary {len(vocab)}; {len(train_text) / len(train):.2f} characters per token")

    cfg = TinyLlamaConfig(vocab_size=len(vocab), d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                          ffn=args.ffn, context=args.context)
    model = TinyLlama(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"config {cfg}\nparameters {n_params}")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = 100

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        starts = torch.randint(len(train) - cfg.context - 1, (args.batch,), generator=gen)
        x = torch.stack([train[s : s + cfg.context] for s in starts])
        y = torch.stack([train[s + 1 : s + 1 + cfg.context] for s in starts])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            msg = f"step {step:5d}  loss {loss.item():.3f}  {time.time() - t0:6.0f}s"
            if step % 500 == 0 or step == args.steps - 1:
                msg += f"  val {evaluate(model, val, cfg.context, batches=4):.3f}"
            print(msg, flush=True)

    val_loss = evaluate(model, val, cfg.context)
    print(f"final validation loss (last 10% of the corpus): {val_loss:.4f} nats/token, "
          f"{val_loss * len(val) / len(val_text):.4f} nats/character")
    args.out.mkdir(parents=True, exist_ok=True)
    onnx_path = args.out / f"{args.name}.onnx"
    vocab_json = json.dumps(vocab)
    export_onnx(model, str(onnx_path), metadata={"hardwire.vocab": vocab_json})
    (args.out / f"{args.name}.vocab.json").write_text(vocab_json + "\n")
    (args.out / f"{args.name}.train.json").write_text(json.dumps({
        "config": cfg.__dict__, "parameters": n_params, "steps": args.steps, "batch": args.batch,
        "lr": args.lr, "seed": args.seed, "val_loss": round(val_loss, 4),
        "val_loss_per_char": round(val_loss * len(val) / len(val_text), 4), "val_tokens": len(val),
        "train_seconds": round(time.time() - t0), "corpus_chars": len(text)}, indent=2) + "\n")
    print(f"wrote {onnx_path}")


if __name__ == "__main__":
    main()
