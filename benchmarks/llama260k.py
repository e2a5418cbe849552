"""The issue's second speed model: a random-weight Hugging Face LlamaForCausalLM of the llama2.c "260K" shape.

    .venv/bin/python benchmarks/llama260k.py [-o build/llama260k.onnx]

dim 64, 4 layers, 4 heads, 4 kv heads, ffn 172, vocabulary 512, context 128, built from its config
(nothing downloaded; speed does not depend on the weights' values) and exported with torch.onnx
(dynamo) the way users export. Then, for example:

    hardwire compile build/llama260k.onnx --quant mixed36 --rows auto --board ulx3s -o build/llama260k
    hardwire sim build/llama260k --prompt-ids 1,2,3 -n 64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 128


def build_model(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=CONTEXT,
                      tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5)
    return LlamaForCausalLM(cfg).eval()


class _LogitsOnly(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def export(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    seq = torch.export.Dim("seq", min=2, max=CONTEXT)
    torch.onnx.export(_LogitsOnly(build_model()), (torch.zeros((1, 8), dtype=torch.long),), str(path), dynamo=True,
                      input_names=["input_ids"], output_names=["logits"], dynamic_shapes=({1: seq},))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", type=Path, default=ROOT / "build" / "llama260k.onnx")
    args = parser.parse_args(argv)
    print(f"exporting the 260K-shape Llama to {args.out} ...", flush=True)
    export(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
