"""Tiny test models, built from configs (nothing downloaded) and exported the way users do.

Parameters are perturbed away from their initial values (norm gains of one, zero biases)
so that a frontend which confuses gains, biases or roles cannot pass by luck.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hardwire.examples.tiny_llama import TinyLlama, TinyLlamaConfig, export_onnx

SEQ_MAX = 64


class LogitsOnly(torch.nn.Module):
    """Hugging Face causal LMs return a ModelOutput; exporters want a tensor."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def export_dynamo(model: torch.nn.Module, path: Path) -> Path:
    seq = torch.export.Dim("seq", min=2, max=SEQ_MAX)
    torch.onnx.export(LogitsOnly(model).eval(), (torch.zeros((1, 8), dtype=torch.long),), str(path), dynamo=True,
                      input_names=["input_ids"], output_names=["logits"], dynamic_shapes=({1: seq},))
    return path


def hf_llama(kv_heads: int, tied: bool, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=SEQ_MAX,
                      tie_word_embeddings=tied, rope_theta=5000.0, rms_norm_eps=1e-6)
    return perturb(LlamaForCausalLM(cfg), seed)


def hf_gpt2(seed: int = 0) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_positions=SEQ_MAX,
                     bos_token_id=0, eos_token_id=0)
    return perturb(GPT2LMHeadModel(cfg), seed)


def example_model(seed: int = 0) -> TinyLlama:
    torch.manual_seed(seed)
    cfg = TinyLlamaConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, ffn=64, context=32)
    return perturb(TinyLlama(cfg), seed)


def export_example(model: TinyLlama, path: Path, dynamo: bool) -> Path:
    export_onnx(model, str(path), dynamo=dynamo)
    return path
