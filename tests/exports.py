"""Tiny test models, built from configs (nothing downloaded) and exported the way users do.

Parameters are perturbed away from their initial values (norm gains of one, zero biases)
so that a frontend which confuses gains, biases or roles cannot pass by luck, and matrices are
drawn at a scale that makes greedy decoding vary (tests/break_check.py).
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


def perturb(model: torch.nn.Module, seed: int, gains: dict[str, float] | None = None) -> torch.nn.Module:
    """Matrices drawn afresh at a scale of 1/sqrt(fan-in) (Hugging Face's initialisation, std 0.02, leaves the
    logits of these tiny models nearly uniform, and greedy decoding then echoes the input or repeats one token,
    which proves nothing), times gains[suffix] for a parameter whose name ends so; gains and biases moved 0.05
    away from one and zero."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                gain = next((g for suffix, g in (gains or {}).items() if name.endswith(suffix)), 1.0)
                p.copy_(torch.randn(p.shape, generator=gen) * gain / p.shape[-1] ** 0.5)
            else:
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


def hf_neox(seed: int = 0) -> torch.nn.Module:
    """GPT-NeoX / Pythia: parallel residual, partial rotary (rotary_pct), LayerNorm with bias, GELU, untied head."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, rotary_pct=0.25, rotary_emb_base=10000, max_position_embeddings=SEQ_MAX,
                        use_parallel_residual=True, tie_word_embeddings=False, hidden_act="gelu",
                        bos_token_id=0, eos_token_id=0)
    return perturb(GPTNeoXForCausalLM(cfg), seed)


def hf_gemma(seed: int = 0) -> torch.nn.Module:
    """Gemma: embedding times sqrt(d), RMSNorm with (1 + w), GELU-tanh gated MLP, head_dim != d / heads, one kv head,
    the head tied to the unscaled table. The sublayers write into the residual at the embedding's scale (o and down
    times sqrt(d)): at 1/sqrt(fan-in) they add a ninth of what the scaled embedding holds, and the tied head then
    echoes the last input token whatever the layers compute."""
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(seed)
    cfg = GemmaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=24, max_position_embeddings=SEQ_MAX,
                      rope_theta=10000.0, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return perturb(GemmaForCausalLM(cfg), seed, {"o_proj.weight": 8.0, "down_proj.weight": 8.0})


def hf_gpt_neo(seed: int = 0) -> torch.nn.Module:
    """GPT-Neo (TinyStories): learned positions, global and local (windowed) attention, no 1/sqrt(d) scaling: q and k
    are drawn at half the scale (their scores a quarter = 1/sqrt(head_dim), as a trained GPT-Neo's are small)."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(seed)
    cfg = GPTNeoConfig(vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                       attention_types=[[["global", "local"], 1]], window_size=40, max_position_embeddings=SEQ_MAX,
                       activation_function="gelu_new", bos_token_id=0, eos_token_id=0)
    return perturb(GPTNeoForCausalLM(cfg), seed, {"q_proj.weight": 0.5, "k_proj.weight": 0.5})


def hf_opt(seed: int = 0) -> torch.nn.Module:
    """OPT: learned positions with an offset of 2, ReLU MLP, LayerNorm with bias."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    cfg = OPTConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                    max_position_embeddings=SEQ_MAX, word_embed_proj_dim=64, do_layer_norm_before=True,
                    activation_function="relu", bos_token_id=0, eos_token_id=0, pad_token_id=1)
    return perturb(OPTForCausalLM(cfg), seed)


def hf_phi(seed: int = 0) -> torch.nn.Module:
    """Phi (phi-1.5/phi-2): attention and MLP in parallel after one shared LayerNorm, partial rotary, biases."""
    from transformers import PhiConfig, PhiForCausalLM

    torch.manual_seed(seed)
    cfg = PhiConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, partial_rotary_factor=0.5, max_position_embeddings=SEQ_MAX,
                    hidden_act="gelu_new", bos_token_id=0, eos_token_id=0)
    return perturb(PhiForCausalLM(cfg), seed)


def hf_mistral(seed: int = 0) -> torch.nn.Module:
    """Mistral: Llama with sliding-window attention (every layer sees the last 20 keys)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=SEQ_MAX, sliding_window=20)
    return perturb(MistralForCausalLM(cfg), seed)
