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


def hf_llama_rope(rope_parameters: dict, seed: int = 0) -> torch.nn.Module:
    """Llama with a scaled RoPE schedule (Llama 3.1's `llama3`, `linear`, `yarn`): frequencies that no single base
    gives, read from the graph's tables; YaRN also scales cos and sin by its attention factor."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ_MAX,
                      rope_parameters=rope_parameters, rms_norm_eps=1e-6)
    return perturb(LlamaForCausalLM(cfg), seed)


LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=32)  # wavelengths < 8 kept, > 32 times 8, smoothed between
YARN_ROPE = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16)


def hf_gptj(seed: int = 0) -> torch.nn.Module:
    """GPT-J: interleaved RoPE (pairs (2i, 2i + 1)) on the first rotary_dim dims of each head, attention and MLP in
    parallel after one shared LayerNorm, GELU, a head with a bias."""
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.manual_seed(seed)
    cfg = GPTJConfig(vocab_size=96, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=SEQ_MAX, n_inner=128,
                     activation_function="gelu_new", bos_token_id=0, eos_token_id=0, tie_word_embeddings=False)
    return perturb(GPTJForCausalLM(cfg), seed)


def hf_phi3(seed: int = 0) -> torch.nn.Module:
    """Phi-3: Llama's block with fused qkv and fused gate/up projections, cut by slicing."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(seed)
    cfg = Phi3Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=SEQ_MAX, original_max_position_embeddings=SEQ_MAX,
                     bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return perturb(Phi3ForCausalLM(cfg), seed)


def hf_granite(seed: int = 0) -> torch.nn.Module:
    """Granite: Llama's block with scalar multipliers on the embedding, each sublayer's residual contribution, the
    scores (instead of 1/sqrt(head_dim)) and the logits (divided). o and down are drawn 48 times larger, so that the
    sublayers (times 0.22) write at the scaled embedding's size: at 12 times the greedy token echoed the input 84% of the
    time."""
    from transformers import GraniteConfig, GraniteForCausalLM

    torch.manual_seed(seed)
    cfg = GraniteConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ_MAX,
                        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.2,
                        logits_scaling=8.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return perturb(GraniteForCausalLM(cfg), seed, {"o_proj.weight": 48.0, "down_proj.weight": 48.0})


def hf_cohere(seed: int = 0) -> torch.nn.Module:
    """Cohere (Command R): interleaved RoPE on every dim, attention and MLP in parallel after one shared LayerNorm
    without a bias, SwiGLU, the logits times logit_scale, the head tied."""
    from transformers import CohereConfig, CohereForCausalLM

    torch.manual_seed(seed)
    cfg = CohereConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=SEQ_MAX, logit_scale=0.5, bos_token_id=0,
                       eos_token_id=0, pad_token_id=0)
    return perturb(CohereForCausalLM(cfg), seed)


def hf_qwen3(seed: int = 0) -> torch.nn.Module:
    """Qwen3: Llama's block with an RMSNorm on each head of q and k, after their projections and before RoPE."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=SEQ_MAX, tie_word_embeddings=True)
    return perturb(Qwen3ForCausalLM(cfg), seed)


def hf_gemma3(seed: int = 0, post_norms: bool = True, post_mlp_norm: bool = True) -> torch.nn.Module:
    """Gemma 3: per-head q/k norms with (1 + w) gains, a score scale of query_pre_attn_scalar^-0.5 (24, not the
    head's 16), local layers (a window of 16), and norms of the attention's and the MLP's outputs before each residual
    Add. post_norms=False replaces those with identities (a pre-norm block), post_mlp_norm=False only the MLP's
    (refused by name)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=SEQ_MAX,
                           sliding_window=16, query_pre_attn_scalar=24, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = perturb(Gemma3ForCausalLM(cfg), seed)
    for layer in model.model.layers:
        if not post_norms:
            layer.post_attention_layernorm = torch.nn.Identity()
        if not post_norms or not post_mlp_norm:
            layer.post_feedforward_layernorm = torch.nn.Identity()
    return model


def hf_gemma2(seed: int = 0, attention_cap: float = 50.0, tied: bool = True, score_gain: float = 1.0) -> torch.nn.Module:
    """Gemma 2: tanh soft-capping of the scores and the logits, norms of the attention's and the MLP's outputs before
    each residual Add, alternating local (a window of 16) and global layers. tied=False gives it a head of its own
    (tied, a random Gemma mostly echoes its input: the embedding is scaled by sqrt(d_model)); score_gain scales q's
    and k's matrices (the scores by its square), so that a cap smaller than Gemma 2's 50 bites on this model's
    scores."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(seed)
    cfg = Gemma2Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, max_position_embeddings=SEQ_MAX, sliding_window=16,
                       attn_logit_softcapping=attention_cap, final_logit_softcapping=30.0, bos_token_id=0,
                       eos_token_id=0, pad_token_id=0, tie_word_embeddings=tied)
    return perturb(Gemma2ForCausalLM(cfg), seed, {"q_proj.weight": score_gain, "k_proj.weight": score_gain})


def hf_bloom(seed: int = 0) -> torch.nn.Module:
    """BLOOM: ALiBi (a linear bias per head on the scores, no position embedding), a LayerNorm of the embedding, a
    fused qkv laid out per head, LayerNorm with bias, BLOOM's GELU-tanh, the head tied to the unnormed table. The
    sublayers write at 8 times the scale (as Gemma's): at 1/sqrt(fan-in) the normed embedding dominates the residual
    and the tied head echoes the input."""
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(seed)
    cfg = BloomConfig(vocab_size=96, hidden_size=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0,
                      pad_token_id=0)
    return perturb(BloomForCausalLM(cfg), seed, {"dense.weight": 8.0, "dense_4h_to_h.weight": 8.0})


def hf_mpt(seed: int = 0) -> torch.nn.Module:
    """MPT: ALiBi built as slope_h * (key - last position) from a table of max_seq_len sliced to the sequence (its
    slopes 2^-8h/heads: Hugging Face's MPT ignores alibi_bias_max), LayerNorm without bias, exact GELU, no biases, the
    head tied. o and down drawn 8 times larger, as BLOOM's."""
    from transformers import MptConfig, MptForCausalLM

    torch.manual_seed(seed)
    cfg = MptConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, max_seq_len=SEQ_MAX, expansion_ratio=2)
    return perturb(MptForCausalLM(cfg), seed, {"out_proj.weight": 8.0, "down_proj.weight": 8.0})


FAMILIES_2025 = {  # the `exported` fixture's names for the families of issue 35 (dynamo exports)
    "llama3-rope": lambda: hf_llama_rope(LLAMA3_ROPE),
    "yarn-rope": lambda: hf_llama_rope(YARN_ROPE),
    "gptj": hf_gptj,
    "phi3": hf_phi3,
    "granite": hf_granite,
    "cohere": hf_cohere,
    "qwen3": hf_qwen3,
    "gemma3": hf_gemma3,
    "gemma3-prenorm": lambda: hf_gemma3(post_norms=False),
    "gemma3-attention-post-norm-only": lambda: hf_gemma3(post_mlp_norm=False),
    "gemma2": hf_gemma2,
    "bloom": hf_bloom,
    "mpt": hf_mpt,
    "gemma2-cap4": lambda: hf_gemma2(attention_cap=4.0, tied=False, score_gain=3.0),
}

