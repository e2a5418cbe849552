"""A ModelIR as a GGUF file of llama.cpp's `llama` architecture, so llama.cpp can decode the same model.

    .venv/bin/python benchmarks/gguf_export.py MODEL.onnx OUT.gguf [--weights F32|Q8_0]

The CPU baseline (benchmarks/cpu_baseline.py) times llama.cpp on this file and refuses the figure unless
llama.cpp's logits match frontend.float_forward. Three things differ from our IR's layout:

- Names and orientation: llama.cpp's tensor names (token_embd, blk.N.attn_q, ...); a (out, in) numpy
  array is written as it is, which GGUF records as ne = (in, out), the order ggml's matmul wants.
- RoPE: our models (like Hugging Face's) rotate dimension j with j + head_dim/2 ("rotate half");
  llama.cpp's llama architecture rotates adjacent pairs (2j, 2j+1). Reordering the rows of q and k in
  each head so that rows j and j + head_dim/2 become 2j and 2j+1 (`rope_permute`, the permutation of
  llama.cpp's convert_hf_to_gguf.py) makes the two the same; attention scores are dot products of q and
  k with the same reordering, so nothing else changes.
- Vocabulary: tokenizer model "no_vocab" with `llama.vocab_size` tokens: llama.cpp loads it and decodes
  token ids, which is all the benchmark feeds it (no text is tokenised).

Q8_0 stores blocks of 32 weights of a row with one float16 scale; a matrix whose in-features are not a
multiple of 32 (the word-piece model's ffn_down, 172 wide) cannot be Q8_0 and stays F32, as llama.cpp's
own converter falls back for such tensors. Norm gains are F32 in every file (llama.cpp requires it).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT.parent))  # run from a checkout: the root is the hardwire package

from hardwire.frontend.ir import Linear, ModelIR  # noqa: E402

WeightType = Literal["F32", "Q8_0"]
WEIGHT_TYPES: tuple[WeightType, ...] = ("F32", "Q8_0")
Q8_0_BLOCK = 32  # weights per Q8_0 block (one float16 scale, 32 int8 codes)


def rope_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows of q or k (n_heads * head_dim, in), rotate-half order -> llama.cpp's adjacent-pair order.

    Within each head, new row 2j is old row j and new row 2j + 1 is old row j + head_dim/2.
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of an even width")
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of rope_permute: adjacent-pair rows back to rotate-half order."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unsupported(ir: ModelIR) -> list[str]:
    """What of this model llama.cpp's llama architecture cannot express (empty: it can)."""
    cfg, out = ir.config, []
    if cfg.norm != "rms":
        out.append(f"norm {cfg.norm!r} (llama has RMSNorm)")
    if cfg.activation != "silu_glu":
        out.append(f"activation {cfg.activation!r} (llama has SwiGLU)")
    if cfg.positions != "rope" or ir.pos_embed is not None:
        out.append("learned positions (llama has RoPE)")
    out += [f"feature: {f}" for f in cfg.features]
    biased = sorted({name.rsplit(".", 2)[-2] for name, _ in ir.named_weights() if name.endswith(".bias")})
    if biased:
        out.append(f"biases on {', '.join(biased)} (llama has none)")
    return out


def storage(weight: np.ndarray, weights: WeightType) -> WeightType:
    """How one tensor is stored in a file of the given weight type: 1-D and non-block-aligned ones in F32."""
    if weights == "Q8_0" and weight.ndim == 2 and weight.shape[1] % Q8_0_BLOCK == 0:
        return "Q8_0"
    return "F32"


def llama_tensors(ir: ModelIR) -> list[tuple[str, np.ndarray]]:
    """Every tensor of the file under llama.cpp's name, float32, in llama.cpp's layout (q, k rows permuted)."""
    problems = unsupported(ir)
    if problems:
        raise ValueError("llama.cpp's llama architecture cannot hold this model: " + "; ".join(problems))
    cfg = ir.config
    out = [("token_embd.weight", ir.embed)]  # (vocab, d_model)
    for i, layer in enumerate(ir.layers):
        out += [(f"blk.{i}.attn_norm.weight", layer.attn_norm.weight),  # (d_model,)
                (f"blk.{i}.attn_q.weight", rope_permute(layer.q.weight, cfg.n_heads)),  # (heads * hd, d_model)
                (f"blk.{i}.attn_k.weight", rope_permute(layer.k.weight, cfg.n_kv_heads)),  # (kv_heads * hd, d_model)
                (f"blk.{i}.attn_v.weight", layer.v.weight),
                (f"blk.{i}.attn_output.weight", layer.o.weight),  # (d_model, heads * hd)
                (f"blk.{i}.ffn_norm.weight", layer.mlp_norm.weight),
                (f"blk.{i}.ffn_gate.weight", layer.gate.weight),  # (ffn, d_model)
                (f"blk.{i}.ffn_up.weight", layer.up.weight),
                (f"blk.{i}.ffn_down.weight", layer.down.weight)]  # (d_model, ffn)
    out.append(("output_norm.weight", ir.final_norm.weight))
    if not cfg.tied_head:  # tied: llama.cpp reads the head from token_embd when output.weight is absent
        out.append(("output.weight", ir.head.weight))
    return [(name, np.ascontiguousarray(w, dtype=np.float32)) for name, w in out]


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    weights: WeightType  # the file's weight type
    types: dict[str, WeightType]  # tensor name -> how it is stored
    kept_f32: tuple[str, ...]  # 2-D tensors a Q8_0 file keeps in F32 (in-features not a multiple of 32)


def write_gguf(ir: ModelIR, path: str | Path, weights: WeightType = "F32") -> GGUFFile:
    """Write the model as a llama-architecture GGUF of the given weight type; -> what was written."""
    import gguf  # the bench extra (pyproject: .[bench])

    if weights not in WEIGHT_TYPES:
        raise ValueError(f"weight type {weights!r}: accepted {', '.join(WEIGHT_TYPES)}")
    cfg = ir.config
    tensors = llama_tensors(ir)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(Path(ir.source).stem if ir.source else "hardwire-model")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if weights == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    if cfg.context is not None:
        writer.add_context_length(cfg.context)
    writer.add_embedding_length(cfg.d_model)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.ffn)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(float(cfg.rope_theta))
    writer.add_layer_norm_rms_eps(float(cfg.norm_eps))
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_tokenizer_model("no_vocab")  # ids only: llama.cpp makes vocab_size placeholder tokens
    types: dict[str, WeightType] = {}
    for name, w in tensors:
        types[name] = storage(w, weights)
        if types[name] == "Q8_0":
            writer.add_tensor(name, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    kept = tuple(name for name, w in tensors if w.ndim == 2 and weights != "F32" and types[name] == "F32")
    return GGUFFile(path, weights, types, kept)


def stored_ir(ir: ModelIR, weights: WeightType) -> ModelIR:
    """The IR with each weight as the file stores it (Q8_0 rounded and back): what llama.cpp should compute.

    Q8_0 blocks run along a row, and rope_permute only reorders rows, so rounding the IR's own rows gives
    the same values as rounding the file's permuted ones.
    """
    if weights == "F32":
        return ir
    import gguf

    def rounded(w: np.ndarray) -> np.ndarray:
        if storage(w, weights) != "Q8_0":
            return w
        codes = gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
        return gguf.quants.dequantize(codes, gguf.GGMLQuantizationType.Q8_0).reshape(w.shape)

    def lin(x: Linear | None) -> Linear | None:
        return None if x is None else dataclasses.replace(x, weight=rounded(x.weight))

    layers = tuple(dataclasses.replace(layer, q=lin(layer.q), k=lin(layer.k), v=lin(layer.v), o=lin(layer.o),
                                       gate=lin(layer.gate), up=lin(layer.up), down=lin(layer.down))
                   for layer in ir.layers)
    embed = rounded(ir.embed)
    head = Linear(embed, ir.head.bias) if ir.config.tied_head else lin(ir.head)
    return dataclasses.replace(ir, embed=embed, layers=layers, head=head, proof=None)


def main() -> None:
    from hardwire.frontend import load

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="ONNX model (or anything hardwire.frontend.load reads)")
    parser.add_argument("out", type=Path, help="GGUF file to write")
    parser.add_argument("--weights", choices=WEIGHT_TYPES, default="F32")
    args = parser.parse_args()
    written = write_gguf(load(args.model), args.out, args.weights)
    kept = f"; kept in F32 (in-features not a multiple of {Q8_0_BLOCK}): {', '.join(written.kept_f32)}" \
        if written.kept_f32 else ""
    print(f"wrote {written.path} ({written.weights}, {written.path.stat().st_size:,} bytes){kept}")


if __name__ == "__main__":
    main()
