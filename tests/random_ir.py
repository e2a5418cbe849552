"""Small random ModelIRs built directly (no ONNX round trip) for fast hardware tests."""

from __future__ import annotations

import numpy as np

from hardwire.frontend.ir import Layer, Linear, ModelConfig, ModelIR, Norm


def scheme_options(scheme: str) -> dict:
    """quantize() options for a scheme on these tiny models: their rows of 16-32 weights spend 0.7-1.4 bits per weight
    on the 21-bit row rescale, which mixed36's default budget of 4.0 bits (scales included) cannot hold with 3-bit codes;
    at 5.0 the codes still mix int3 and int6 tensors."""
    return {"avg_bits": 5.0} if scheme == "mixed36" else {}


def random_ir(*, family: str = "llama", vocab: int = 40, d: int = 32, layers: int = 2, heads: int = 4,
              kv_heads: int = 2, ffn: int = 48, context: int = 16, seed: int = 0, block: str = "sequential",
              rotary_dims: int | None = None, windows: tuple[int | None, ...] | None = None, tied: bool = False,
              gain: float = 1.5, post_norms: bool = False) -> ModelIR:
    """A Llama-style (RMSNorm, RoPE, SwiGLU) or GPT-2-style (LayerNorm, learned positions, GELU) model; `block`
    "parallel" (GPT-NeoX: two norms) or "shared" (Phi: one norm) makes both sublayers read the block's input,
    `rotary_dims` rotates only the first dims of each head (RoPE models), `windows`: per layer an attention
    window (the last w keys) or None (causal). The head is its own matrix unless `tied` (tied to the embedding, a
    random model mostly echoes its input token), and `gain` scales the matrices that write attention and the MLP
    into the residual and pick their mixing (q, k, o, gate, down): at 1.5 greedy decoding varies and depends on
    attention, RoPE and the MLP (tests/break_check.py). `post_norms`: RMSNorms of o's and down's outputs before the
    residual adds (Gemma 2, 3), their gains about 1 with every fifth negated (the chip holds the sign in o's and
    down's rows)."""
    rng = np.random.default_rng(seed)
    hd = d // heads
    llama = family == "llama"

    def w(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.normal(size=(rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    def b(n: int) -> np.ndarray | None:
        return None if llama else (rng.normal(size=n) * 0.05).astype(np.float32)

    def norm() -> Norm:
        return Norm((1 + 0.1 * rng.normal(size=d)).astype(np.float32), b(d))

    def layer() -> Layer:
        attn_norm = norm()
        return Layer(attn_norm=attn_norm, q=Linear(w(heads * hd, d, gain), b(heads * hd)),
                     k=Linear(w(kv_heads * hd, d, gain), b(kv_heads * hd)), v=Linear(w(kv_heads * hd, d), b(kv_heads * hd)),
                     o=Linear(w(d, heads * hd, gain), b(d)), mlp_norm=attn_norm if block == "shared" else norm(),
                     up=Linear(w(ffn, d), b(ffn)), down=Linear(w(d, ffn, gain), b(d)),
                     gate=Linear(w(ffn, d, gain)) if llama else None, **post())

    def post() -> dict[str, Norm]:
        if not post_norms:
            return {}
        sign = np.where(np.arange(d) % 5 == 0, -1.0, 1.0)
        return {name: Norm(((1 + 0.1 * rng.normal(size=d)) * sign).astype(np.float32))
                for name in ("post_attn_norm", "post_mlp_norm")}

    blocks = tuple(layer() for _ in range(layers))
    embed = (rng.normal(size=(vocab, d))).astype(np.float32)
    config = ModelConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, head_dim=hd,
                         ffn=ffn, context=context, norm="rms" if llama else "layer", norm_eps=1e-5,
                         activation="silu_glu" if llama else "gelu_tanh", positions="rope" if llama else "learned",
                         rope_theta=10000.0 if llama else None, tied_head=tied, parallel_residual=block != "sequential",
                         shared_norm=block == "shared", rotary_dims=rotary_dims, attn_windows=windows,
                         post_norms=post_norms)
    return ModelIR(config=config, embed=embed, layers=blocks, final_norm=norm(),
                   head=Linear(embed) if tied else Linear(w(vocab, d)),
                   pos_embed=None if llama else (rng.normal(size=(context, d)) * 0.3).astype(np.float32))


def random_adapters(qm, seed: int, zero: bool = False) -> dict:
    """A LoRA adapter on every slot of qm's address map (random, or all-zero with the same shapes)."""
    from hardwire.quant.lora import quantize_lora
    from hardwire.rtl.lora_map import lora_address_map

    rng = np.random.default_rng(seed)
    out = {}
    for slot in lora_address_map(qm):
        a = rng.normal(scale=0.5, size=(slot.rank, slot.in_features))
        b = rng.normal(scale=0.5, size=(slot.out_features, slot.rank))
        if zero:
            a, b = np.zeros_like(a), np.zeros_like(b)
        out[slot.layer, slot.site] = quantize_lora(qm, slot.layer, slot.site, a, b, alpha=8.0)
    return out
