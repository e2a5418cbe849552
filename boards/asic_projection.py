"""Projecting a chip too big to synthesise here: blocks measured on small sky130 builds, memories from the macro
model, cycles from the schedule.

A model configuration (no weights) becomes a *stand-in QModel*: the real QModel dataclasses with every tensor on
PyTorch's "meta" device (shapes, no storage), so `rtl.plan.schedule`, `weight_bank_shapes`, `kv_bank_shapes`,
`table_shapes` and `lora_address_map` run on it unchanged: cycles per token and the memory inventory come from the
same code a real build uses, never from a copy of it.

Per configuration and engine (docs/asic.md gives the formulas):

- **logic area and transistors** = a linear cost model over the engine's blocks, its coefficients fitted by least
  squares to small builds synthesised to sky130 (benchmarks/results/asic_blocks.json): a fixed part (control, norm,
  softmax, RoPE, argmax: the units every build has), a part per MAC lane and code bit (multipliers, adder trees),
  per norm output lane, per epilogue lane and per softmax lane; the measured logic includes a buffer tree on every
  net that drives more than 8 inputs (`buffer_fanout`, what placement's repair would insert);
- **critical path** = a + b log2(lanes x widest code bits), fitted to the builds' paths once buffered; the clock is
  the slower of that and the ROM / SRAM macros' cycle (boards/rom_macro.py);
- **memories**: every memory the decoder holds (weight banks, embedding, KV cache, LoRA, tables, buffers), from the
  plan's own inventory functions where they exist, as mask-ROM or SRAM macros of the node (boards/rom_macro.py),
  memories deeper than the calibrated macro's 1,024 words tiled into macros of at most that depth;
- **tokens/s** = clock / `cycles_per_token_estimate(qm, plan, position)` at half the context (as `hardwire compile`
  reports it).

Every figure is labelled: "measured" (a synthesis ran), "fitted" (a coefficient), "projected" (the model's
prediction), "assumption" (a stated figure not measured here).
"""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..frontend.ir import ModelConfig
from ..quant.qmodel import LoraSpec, QEmbedding, QLayer, QLinear, QModel, QNorm
from ..quant.quantize import DEFAULT_LORA, WEIGHT_FORMAT
from ..rtl.lora_map import lora_address_map
from ..rtl.plan import (
    HardwarePlan,
    cycles_per_token_estimate,
    kv_bank_shapes,
    latency_floor_cycles,
    macs_per_token,
    row_code_bits,
    table_shapes,
    weight_bank_shapes,
)
from .rom_macro import SKY130, MemoryTech, macro

BLOCKS_FILE = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "asic_blocks.json"
MAX_MACRO_DEPTH = 1024  # the calibrated macro's depth (OpenRAM sky130 1024 x 32): deeper memories are tiled
PROJECT_SCHEMES = ("int8", "int4", "int3", "mxfp4", "mixed36")
SCHEME_BITS = {"int8": 8, "int4": 4, "int3": 3, "mxfp4": 4}
# mixed36 without weights: which tensors the sensitivity measure gives 6 bits needs the weights, so the projection
# assumes the attention projections at 6 bits and the MLP, embedding and head at 3 (about 3.5 code bits a weight
# for the Llama shapes, within the scheme's default budget of 4.0 bits with scales)
MIXED36_SIX_BIT = ("q", "k", "v", "o")

# widths of the small memories, from the RTL (rtl/datapath.py ACT_BITS, rtl/norm.py, rtl/rope.py, rtl/softmax.py)
ACT_BITS = 17  # the engine's activation buffers: a lane's int8 / int16 / Q15 value
RAW_BITS = 12  # q and k before rotation
RESID_BITS = 16  # the residual
SCALE_ROW_BITS = 21  # a row's multiplier (15) and shift (6): the per-row parameter and scale tables
NORM_COEF_BITS = 14  # a norm's per-channel multiplier and shift
RSQRT_WORDS, RSQRT_BITS = 1024, 24
ROPE_BITS = 16
SOFTMAX_BUF_BITS = 32
ACT_TABLE_WORDS = 256

# The node the projection scales to, and the figures it takes (all assumptions, cited):
N6_DENSITY_MTR_MM2 = 91.2 * 1.18  # TSMC N7 high-density logic 91.2 MTr/mm^2 (WikiChip, "7 nm lithography
#                                   process"), N6 "18% higher logic density over the N7 process" (tsmc.com 7nm page)
FO4_7NM_PS = 10.0  # assumed FO4 inverter delay of a 7/6 nm-class FinFET node; no checked source: an assumption
SCALED_NODE = "6/7 nm class (TSMC N6 density)"

HC1 = {"name": "Taalas HC1", "model": "Llama 3.1 8B", "node": "TSMC 6 nm", "area_mm2": 815,
       "transistors": 53e9, "transistors_per_parameter": 6.6, "tokens_per_s": 17000,
       "weights": "mixed 3/6-bit in two metal layers", "label": "published (Taalas)"}


class ProjectionError(ValueError):
    """A configuration or option the projection cannot take; the message says what is accepted."""


# ---- configurations -------------------------------------------------------------------------------------------

HF_TYPES = ("llama", "mistral", "qwen2", "gemma", "gpt2", "gpt_neox", "gpt_neo", "opt", "phi")


def config_from_hf(config: dict, where: str = "config.json") -> ModelConfig:
    """A ModelConfig from a Hugging Face config.json's fields, for the families the frontend imports."""
    kind = config.get("model_type")
    if kind not in HF_TYPES:
        raise ProjectionError(f"{where}: model_type {kind!r} is not a family hardwire knows; accepted: "
                              f"{', '.join(HF_TYPES)}")

    def need(*names: str) -> int:
        for name in names:
            if isinstance(config.get(name), (int, float)) and not isinstance(config.get(name), bool):
                return int(config[name])
        raise ProjectionError(f"{where}: {kind} config has no {' / '.join(names)} (a positive integer)")

    if kind in ("gpt2", "gpt_neo", "opt"):
        d = need("n_embd", "hidden_size")
        layers = need("n_layer", "num_layers", "num_hidden_layers")
        heads = need("n_head", "num_heads", "num_attention_heads")
        ffn = config.get("n_inner") or config.get("intermediate_size") or config.get("ffn_dim") or 4 * d
        context = need("n_positions", "max_position_embeddings")
        act = {"relu": "relu", "gelu": "gelu"}.get(config.get("activation_function", "gelu_new"), "gelu_tanh")
        windows = None
        if kind == "gpt_neo":
            types = [t for group, n in config.get("attention_types", []) for _ in range(n) for t in group]
            if len(types) == layers:
                windows = tuple(int(config.get("window_size", 256)) if t == "local" else None for t in types)
        return _checked(where, ModelConfig(
            vocab_size=need("vocab_size"), d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=heads,
            head_dim=d // heads, ffn=int(ffn), context=context, norm="layer",
            norm_eps=float(config.get("layer_norm_epsilon", config.get("layer_norm_eps", 1e-5))), activation=act,
            positions="learned", rope_theta=None, tied_head=bool(config.get("tie_word_embeddings", True)),
            attn_windows=windows))
    d = need("hidden_size")
    heads = need("num_attention_heads")
    kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or d // heads)
    hidden_act = str(config.get("hidden_act", config.get("hidden_activation", "silu")))
    if kind in ("gpt_neox", "phi"):
        act = "gelu" if hidden_act == "gelu" else "gelu_tanh"
        rotary = config.get("rotary_pct", config.get("partial_rotary_factor", 1.0))
        rotary_dims = int(head_dim * float(rotary))
        return _checked(where, ModelConfig(
            vocab_size=need("vocab_size"), d_model=d, n_layers=need("num_hidden_layers"), n_heads=heads,
            n_kv_heads=kv, head_dim=head_dim, ffn=need("intermediate_size"),
            context=need("max_position_embeddings"), norm="layer",
            norm_eps=float(config.get("layer_norm_eps", 1e-5)), activation=act, positions="rope",
            rope_theta=float(config.get("rotary_emb_base", config.get("rope_theta", 10000.0))),
            tied_head=bool(config.get("tie_word_embeddings", False)), parallel_residual=True,
            shared_norm=kind == "phi", rotary_dims=None if rotary_dims == head_dim else rotary_dims))
    act = "gelu_tanh_glu" if kind == "gemma" or "gelu" in hidden_act else "silu_glu"
    window = config.get("sliding_window") if config.get("use_sliding_window", kind == "mistral") else None
    layers = need("num_hidden_layers")
    context = need("max_position_embeddings")
    return _checked(where, ModelConfig(
        vocab_size=need("vocab_size"), d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv, head_dim=head_dim,
        ffn=need("intermediate_size"), context=context, norm="rms", norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        activation=act, positions="rope", rope_theta=float(config.get("rope_theta", 10000.0)),
        tied_head=bool(config.get("tie_word_embeddings", kind == "gemma")),
        attn_windows=(int(window),) * layers if window and int(window) < context else None))


def _checked(where: str, cfg: ModelConfig) -> ModelConfig:
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn"):
        if getattr(cfg, name) < 1:
            raise ProjectionError(f"{where}: {name} is {getattr(cfg, name)}; it must be a positive integer")
    if cfg.n_heads % cfg.n_kv_heads:
        raise ProjectionError(f"{where}: {cfg.n_heads} heads do not share {cfg.n_kv_heads} key/value heads evenly")
    return cfg


def llama_config(*, vocab: int, d: int, layers: int, heads: int, kv_heads: int, ffn: int, context: int,
                 tied: bool, theta: float = 10000.0) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                       head_dim=d // heads, ffn=ffn, context=context, norm="rms", norm_eps=1e-5,
                       activation="silu_glu", positions="rope", rope_theta=theta, tied_head=tied)


def reference_shapes() -> dict[str, ModelConfig]:
    """The shapes the issue names (published configurations; no weights needed)."""
    return {
        # karpathy/llama2.c stories15M: dim 288, 6 layers, 6 heads, hidden 768, vocab 32000, seq_len 256, shared head
        "llama2.c 15M": llama_config(vocab=32000, d=288, layers=6, heads=6, kv_heads=6, ffn=768, context=256,
                                     tied=True),
        # HuggingFaceTB/SmolLM-135M config.json
        "SmolLM 135M": llama_config(vocab=49152, d=576, layers=30, heads=9, kv_heads=3, ffn=1536, context=2048,
                                    tied=True),
        # meta-llama/Llama-3.2-1B config.json (context projected at 2048 of its 131072)
        "Llama 3.2 1B": llama_config(vocab=128256, d=2048, layers=16, heads=32, kv_heads=8, ffn=8192,
                                     context=131072, tied=True, theta=500000.0),
        # meta-llama/Llama-3.1-8B config.json
        "Llama 3.1 8B": llama_config(vocab=128256, d=4096, layers=32, heads=32, kv_heads=8, ffn=14336,
                                     context=131072, tied=False, theta=500000.0),
    }


def model_parameters(cfg: ModelConfig) -> int:
    """The model's parameters as Hugging Face counts them: embedding, head unless tied, per layer the projections
    and norms (biases where the family has them), the final norm, learned positions."""
    d, hd = cfg.d_model, cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    biased = cfg.norm == "layer"  # GPT-2 / NeoX / OPT / Phi carry biases; the RMSNorm families none
    attn = d * q + 2 * d * kv + q * d + ((q + 2 * kv + d) if biased else 0)
    mlp = (3 if cfg.gated else 2) * d * cfg.ffn + ((cfg.ffn + d) if biased else 0)
    norms = (1 if cfg.shared_norm else 2) * d * (2 if cfg.norm == "layer" else 1)
    total = cfg.n_layers * (attn + mlp + norms) + d * (2 if cfg.norm == "layer" else 1)
    total += cfg.vocab_size * d * (1 if cfg.tied_head else 2)
    if cfg.positions == "learned":
        total += (cfg.context or 0) * d
    return total


def hf_parameters(config: dict, cfg: ModelConfig) -> int:
    """model_parameters with the biases and offsets a family has beyond that layout: Qwen2's q, k, v biases, Phi's
    head bias, OPT's two extra learned positions; GPT-Neo has no q, k, v biases."""
    qkv = cfg.n_layers * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    kind = config.get("model_type")
    extra = {"qwen2": qkv, "phi": cfg.vocab_size, "opt": 2 * cfg.d_model, "gpt_neo": -qkv}.get(kind, 0)
    return model_parameters(cfg) + extra


# ---- the stand-in QModel --------------------------------------------------------------------------------------

def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.int64, device="meta")


def tensor_bits(scheme: str, name: str) -> tuple[int, str]:
    """(code bits, weight format) a tensor gets under `scheme` in the projection (mixed36: MIXED36_SIX_BIT)."""
    if scheme == "mixed36":
        return (6 if name.rsplit(".", 1)[-1] in MIXED36_SIX_BIT else 3), WEIGHT_FORMAT[scheme]
    return SCHEME_BITS[scheme], WEIGHT_FORMAT[scheme]


def standin_qmodel(cfg: ModelConfig, scheme: str, context: int) -> QModel:
    """A QModel of `cfg` whose tensors have shapes and no storage (torch's meta device): what the schedule and the
    memory inventory read of a QModel, for a model of any size, without its weights."""
    if scheme not in PROJECT_SCHEMES:
        raise ProjectionError(f"unknown scheme {scheme!r}; accepted: {', '.join(PROJECT_SCHEMES)}")
    d, hd = cfg.d_model, cfg.head_dim
    q_out, kv_out = cfg.n_heads * hd, cfg.n_kv_heads * hd

    def lin(name: str, out: int, inp: int) -> QLinear:
        bits, fmt = tensor_bits(scheme, name)
        return QLinear(codes=_meta(out, inp), block_shift=_meta(out, inp), bias=_meta(out), mult=_meta(out),
                       shift=_meta(out), bits=bits, scheme=fmt, in_bits=8, out_bits=8, acc_bits=32, error=0.0)

    def norm() -> QNorm:
        return QNorm(kind=cfg.norm, eps_q=0, mult=_meta(d), shift=_meta(d), out_bits=12)

    def emb(name: str, rows: int) -> QEmbedding:
        bits, fmt = tensor_bits(scheme, name)
        return QEmbedding(codes=_meta(rows, d), block_shift=_meta(rows, d), mult=_meta(rows), shift=_meta(rows),
                          bits=bits, scheme=fmt, error=0.0)

    layers = []
    for i in range(cfg.n_layers):
        p = f"layers.{i}"
        attn_norm = norm()
        layers.append(QLayer(attn_norm=attn_norm, q=lin(f"{p}.q", q_out, d), k=lin(f"{p}.k", kv_out, d),
                             v=lin(f"{p}.v", kv_out, d), o=lin(f"{p}.o", d, q_out), sm_mult=0, sm_shift=0, att_mult=0,
                             att_shift=0, mlp_norm=attn_norm if cfg.shared_norm else norm(),
                             up=lin(f"{p}.up", cfg.ffn, d), down=lin(f"{p}.down", d, cfg.ffn), act_table=_meta(256),
                             gate=lin(f"{p}.gate", cfg.ffn, d) if cfg.gated else None))
    half = (cfg.rotary_dims or hd) // 2 if cfg.positions == "rope" else 0
    return QModel(config=cfg, scheme=scheme, context=context, embed=emb("embed", cfg.vocab_size),
                  layers=tuple(layers), final_norm=norm(), head=lin("head", cfg.vocab_size, d), rsqrt=_meta(1024),
                  exp=_meta(256), rope_cos=_meta(context, half), rope_sin=_meta(context, half), scales={}, steps={},
                  lora=LoraSpec(rank=DEFAULT_LORA.rank, sites=DEFAULT_LORA.sites),
                  pos=emb("pos", context) if cfg.positions == "learned" else None)


def check_plan(qm: QModel, plan: HardwarePlan) -> None:
    """The engine shapes `hardwire compile` accepts (rtl/decoder.py), as one-line errors naming what is accepted;
    rows and lanes past the RTL's 64 are allowed in a projection (labelled so), powers of two still."""
    hd = qm.config.head_dim
    for name, value in (("rows", plan.rows), ("lanes", plan.lanes)):
        if value < 1 or value & (value - 1):
            raise ProjectionError(f"--{name} must be a power of two (1, 2, 4, ...), got {value}")
    if hd % plan.lanes:
        ok = [str(1 << k) for k in range(12) if hd % (1 << k) == 0]
        raise ProjectionError(f"--lanes {plan.lanes} must divide the head width {hd}: accepted {', '.join(ok)}")
    if qm.block_scaled and 32 % plan.lanes:
        raise ProjectionError(f"{qm.scheme} weights take 32-column blocks: --lanes must divide 32, got {plan.lanes}")
    if plan.lanes % plan.softmax_lanes or plan.softmax_lanes & (plan.softmax_lanes - 1):
        raise ProjectionError(f"softmax lanes must be a power of two dividing lanes ({plan.lanes}), "
                              f"got {plan.softmax_lanes}")
    if plan.rows % plan.epilogue_lanes or plan.lanes % plan.epilogue_lanes or \
            plan.epilogue_lanes & (plan.epilogue_lanes - 1):
        raise ProjectionError(f"epilogue lanes must be a power of two dividing rows ({plan.rows}) and lanes "
                              f"({plan.lanes}), got {plan.epilogue_lanes}")


def default_plan(rows: int, lanes: int, head_dim: int) -> HardwarePlan:
    """The engine the projection sizes for rows x lanes: the epilogue as wide as rows and lanes allow, the softmax
    as wide as the lanes (their tables are small in an ASIC), the attention on every row when the rows divide the
    head width, else on the most rows that do."""
    attention = rows
    while head_dim % attention:
        attention //= 2
    return HardwarePlan(rows=rows, lanes=lanes, storage="rom", epilogue_lanes=min(rows, lanes), softmax_lanes=lanes,
                        attention_rows=None if attention == rows else attention)


# ---- the memory inventory -------------------------------------------------------------------------------------

def memory_inventory(qm: QModel, plan: HardwarePlan) -> list[dict]:
    """Every memory of the decoder as (name, kind "rom"/"sram", depth, width, copies): the weight banks, tables and
    KV banks from rtl/plan.py, the LoRA slots from rtl/lora_map.py, the small tables and buffers from their RTL
    widths. Where yosys trims constant bits of a small table, this keeps the full width (a little more area)."""
    cfg = qm.config
    d, hd = cfg.d_model, cfg.head_dim
    qdim, kvdim = cfg.n_heads * hd, cfg.n_kv_heads * hd
    wide, lanes, vec = plan.epilogue_lanes, plan.lanes, plan.vector_lanes
    out: list[dict] = []

    def add(name: str, kind: str, depth: int, width: int, copies: int = 1) -> None:
        out.append({"name": name, "kind": kind, "depth": int(depth), "width": int(width), "copies": copies})

    for name, depth, width in weight_bank_shapes(qm, plan):
        add(f"{name}.mem", "rom", depth, width)
    for name, depth, width in table_shapes(qm, plan):
        add(f"{name}.mem", "rom", depth, width)
    add("embed_scale", "rom", cfg.vocab_size, SCALE_ROW_BITS)
    if qm.pos is not None:
        add("pos_scale", "rom", qm.context, SCALE_ROW_BITS)
    for index, (_, lin) in enumerate(qm.linears()):  # each projection's row parameters, `wide` rows a word
        bias = lin.acc_bits if cfg.norm == "layer" else 0
        add(f"p{index}", "rom", -(-lin.codes.shape[0] // wide), wide * (SCALE_ROW_BITS + bias))
    for e in range(wide):
        add(f"act{e}.rom", "rom", ACT_TABLE_WORDS, 9 if cfg.gated else 8)
    norms = (1 if cfg.shared_norm else 2) * cfg.n_layers + 1  # every norm's channels, the final one's too
    add("norm.coef_rom", "rom", norms * -(-d // vec), vec * NORM_COEF_BITS)
    add("norm.rsqrt_rom", "rom", RSQRT_WORDS, RSQRT_BITS)
    if cfg.positions == "rope":
        half = (cfg.rotary_dims or hd) // 2
        add("rope.cos_rom", "rom", qm.context * half, ROPE_BITS)
        add("rope.sin_rom", "rom", qm.context * half, ROPE_BITS)
    for name, depth, width in kv_bank_shapes(qm, plan):
        add(name, "sram", depth, width)
    for n, slot in enumerate(lora_address_map(qm)):
        add(f"lora.a{n}", "sram", slot.rank * -(-slot.in_features // lanes), lanes * 8)
        add(f"lora.b{n}", "sram", slot.out_features, max(1, slot.rank) * 8, wide)  # a read port per epilogue lane
    add("act", "sram", plan.chunks(max(d, qdim)), lanes * ACT_BITS)
    add("hid", "sram", plan.chunks(cfg.ffn), lanes * ACT_BITS)
    add("qrot", "sram", plan.chunks(qdim), lanes * ACT_BITS)
    add("probs", "sram", plan.chunks(qm.context), lanes * ACT_BITS)
    add("softmax.buf", "sram", -(-qm.context // plan.softmax_lanes), plan.softmax_lanes * SOFTMAX_BUF_BITS)
    add("norm.x_ram", "sram", -(-d // vec), vec * RESID_BITS)
    for name, bits, size, readers in (("resid", RESID_BITS, d, 2), ("gate", 8, cfg.ffn if cfg.gated else 0, 1),
                                      ("raw_q", RAW_BITS, qdim, 2), ("raw_k", RAW_BITS, kvdim, 2)):
        if size:
            for b in range(wide):
                add(f"{name}{b}" if wide > 1 else name, "sram", -(-size // wide), bits, readers)
    return out


def memory_macros(inventory: list[dict], tech: MemoryTech) -> dict:
    """Area, transistors and bits of an inventory as macros (boards/rom_macro.py), deeper ones tiled."""
    totals = {kind: {"bits": 0, "area_um2": 0.0, "transistors": 0, "macros": 0} for kind in ("rom", "sram")}
    weights = {"bits": 0, "area_um2": 0.0, "transistors": 0}
    for mem in inventory:
        full, rest = divmod(mem["depth"], MAX_MACRO_DEPTH)
        tiles = [(MAX_MACRO_DEPTH, full)] if full else []
        if rest:
            tiles.append((rest, 1))
        for depth, count in tiles:
            m = macro(mem["kind"], depth, mem["width"], tech, copies=mem["copies"])
            t = totals[mem["kind"]]
            t["bits"] += count * m["bits"] * mem["copies"]
            t["area_um2"] += count * m["area_um2"]
            t["transistors"] += count * m["transistors"]
            t["macros"] += count * mem["copies"]
            if mem["name"].startswith("weights") or mem["name"] == "embed.mem":
                weights["bits"] += count * m["bits"] * mem["copies"]
                weights["area_um2"] += count * m["area_um2"]
                weights["transistors"] += count * m["transistors"]
    return {"rom": totals["rom"], "sram": totals["sram"], "weights": weights}


# ---- the block cost model -------------------------------------------------------------------------------------

FEATURES = ("fixed", "lane_code_bits", "vector_lanes", "epilogue_lanes", "softmax_lanes")


def features(shape: dict) -> list[float]:
    """The blocks of a build as counts: 1 (the fixed units: control, norm, softmax, RoPE, argmax), the MAC lanes
    times their code bits (the multipliers and adder trees: 8 bits on the attention rows), the norm's output lanes
    (HardwarePlan.vector_lanes), the epilogue lanes (bias, rescale, activation table, destination per lane) and the
    softmax lanes (exponent table, divider per lane)."""
    vector = HardwarePlan(rows=shape["rows"], lanes=shape["lanes"], epilogue_lanes=shape["epilogue_lanes"]).vector_lanes
    return [1.0, float(shape["lanes"] * sum(shape["row_code_bits"])), float(vector), float(shape["epilogue_lanes"]),
            float(shape["softmax_lanes"])]


def plan_shape(qm: QModel, plan: HardwarePlan) -> dict:
    """The shape fields `features` reads, for a plan on a (stand-in or real) QModel."""
    attn = min(plan.attn_rows(qm.config.head_dim), plan.rows)  # row_code_bits: the first attn rows multiply K and V
    bits = [row_code_bits(qm, plan, 0)] * attn + [row_code_bits(qm, plan, plan.rows - 1)] * (plan.rows - attn)
    return {"rows": plan.rows, "lanes": plan.lanes, "epilogue_lanes": plan.epilogue_lanes,
            "softmax_lanes": plan.softmax_lanes, "row_code_bits": bits}


def _width(shape: dict) -> int:
    """The engine's widest row: its lanes times its widest codes (the products one adder tree sums)."""
    return shape["lanes"] * max(shape["row_code_bits"])


@dataclass(frozen=True)
class Fit:
    """The fitted coefficients (logic µm² and transistors with the fanout buffers, per FEATURES) and the path model."""

    area: tuple[float, ...]
    transistors: tuple[float, ...]
    path_ns: tuple[float, float]  # critical path with fanout buffered: a + b log2(lanes x widest code bits)
    points: tuple[str, ...]
    library: str
    corner: str

    def logic(self, shape: dict) -> tuple[float, float]:
        f = features(shape)
        return (float(np.dot(self.area, f)), float(np.dot(self.transistors, f)))

    def path(self, shape: dict) -> float:
        a, b = self.path_ns
        return a + b * math.log2(_width(shape))


def logic_measured(point: dict) -> tuple[float, float]:
    """A build's logic as the projection counts it: the synthesised cells plus the fanout buffers' (measured)."""
    m = point["measured"]
    return (m["logic_area_um2"] + m["fanout_buffer_area_um2"], m["logic_transistors"] + m["fanout_buffer_transistors"])


def load_points(path: Path = BLOCKS_FILE) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python benchmarks/asic_projection.py --measure` to "
                                f"synthesise the fit points")
    return json.loads(path.read_text())["points"]


def fit(points: list[dict]) -> Fit:
    """Least squares over the fit points' logic area and transistors; the path model likewise."""
    use = [p for p in points if p["role"] == "fit"]
    if len(use) <= len(FEATURES):
        raise ValueError(f"the fit needs more than {len(FEATURES)} fit points, has {len(use)}")
    x = np.array([features(p["shape"]) for p in use])
    measured = np.array([logic_measured(p) for p in use])
    area = np.linalg.lstsq(x, measured[:, 0], rcond=None)[0]
    tr = np.linalg.lstsq(x, measured[:, 1], rcond=None)[0]
    slope, intercept = np.polyfit([math.log2(_width(p["shape"])) for p in use],
                                  [p["measured"]["buffered_path_ns"] for p in use], 1)
    return Fit(area=tuple(float(c) for c in area), transistors=tuple(float(c) for c in tr),
               path_ns=(float(intercept), float(slope)), points=tuple(p["name"] for p in use),
               library=use[0]["measured"]["library"], corner=use[0]["measured"]["corner"])


def measured_point(spec: dict, qm: QModel, result: dict, buffered: dict) -> dict:
    """What one small build's synthesis measured (build_asic's report, and buffered_timing's), with its shape."""
    plan = HardwarePlan(rows=spec["rows"], lanes=spec["lanes"], storage="rom",
                        epilogue_lanes=spec.get("epilogue_lanes", 1), softmax_lanes=spec.get("softmax_lanes", 1))
    cfg = qm.config
    shape = {"vocab": cfg.vocab_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
             "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "ffn": cfg.ffn, "context": qm.context,
             "scheme": qm.scheme, "rows": plan.rows, "lanes": plan.lanes, "epilogue_lanes": plan.epilogue_lanes,
             "softmax_lanes": plan.softmax_lanes, "attention_rows": plan.attn_rows(cfg.head_dim),
             "row_code_bits": [row_code_bits(qm, plan, r) for r in range(plan.rows)], "params": qm.n_weights}
    keep = ("logic_area_um2", "logic_transistors", "cell_count", "flip_flops", "critical_path_ns",
            "critical_path_endpoint", "critical_path_depth", "logic_max_clock_mhz", "rom_bits", "rom_area_um2",
            "rom_transistors", "weight_rom_bits", "weight_rom_area_um2", "sram_bits", "sram_area_um2",
            "sram_transistors", "area_um2", "transistors", "clock_mhz", "clock_limited_by", "library", "corner")
    measured = {key: result[key] for key in keep}
    measured.update(buffered)
    measured["memories"] = [{k: m[k] for k in ("name", "kind", "depth", "width", "copies", "area_um2", "transistors")}
                            for m in result["rom"] + result["sram"]]
    return {"name": spec["name"], "role": spec["role"], "shape": shape, "measured": measured}


def predict_build(point: dict, model_fit: Fit, tech: MemoryTech = SKY130) -> dict:
    """The projection of a synthesised point from its shape alone, beside what its synthesis measured."""
    s = point["shape"]
    cfg = llama_config(vocab=s["vocab"], d=s["d_model"], layers=s["n_layers"], heads=s["n_heads"],
                       kv_heads=s["n_kv_heads"], ffn=s["ffn"], context=s["context"], tied=False)
    qm = standin_qmodel(cfg, s["scheme"], s["context"])
    plan = HardwarePlan(rows=s["rows"], lanes=s["lanes"], storage="rom", epilogue_lanes=s["epilogue_lanes"],
                        softmax_lanes=s["softmax_lanes"])
    shape = plan_shape(qm, plan)
    logic_area, logic_tr = model_fit.logic(shape)
    mem = memory_macros(memory_inventory(qm, plan), tech)
    area = logic_area + mem["rom"]["area_um2"] + mem["sram"]["area_um2"]
    path = model_fit.path(shape)
    m = point["measured"]
    measured_logic = logic_measured(point)
    measured_area = measured_logic[0] + m["rom_area_um2"] + m["sram_area_um2"]
    clock = min(1000.0 / path, tech.cycle_mhz)
    measured_clock = min(1000.0 / m["buffered_path_ns"], tech.cycle_mhz)
    return {
        "name": point["name"], "role": point["role"],
        "logic_area_um2": {"projected": logic_area, "measured": measured_logic[0]},
        "area_um2": {"projected": area, "measured": measured_area},
        "transistors": {"projected": logic_tr + mem["rom"]["transistors"] + mem["sram"]["transistors"],
                        "measured": measured_logic[1] + m["rom_transistors"] + m["sram_transistors"]},
        "path_ns": {"projected": path, "measured": m["buffered_path_ns"]},
        "clock_mhz": {"projected": clock, "measured": measured_clock},
        "errors": {"logic_area": logic_area / measured_logic[0] - 1, "area": area / measured_area - 1,
                   "path": path / m["buffered_path_ns"] - 1, "clock": clock / measured_clock - 1},
    }


# ---- the projection -------------------------------------------------------------------------------------------

def fo4_ns(liberty_text: str) -> float:
    """The library's FO4 delay: its smallest inverter driving four copies of itself, at the slew it makes itself
    (boards/liberty.py's NLDM lookup)."""
    from .liberty import parse_library

    inv = "sky130_fd_sc_hd__inv_1"
    lib = parse_library(liberty_text, {inv})
    cell = lib.cells[inv]
    load = 4 * cell.inputs["A"]
    slew = lib.default_slew
    for _ in range(20):  # the slew a chain of FO4 stages settles to
        slew = max(t.lookup(slew, load) for arc in cell.outputs["Y"] for t in arc.slew)
    return max(t.lookup(slew, load) for arc in cell.outputs["Y"] for t in arc.delay)


def project(cfg: ModelConfig, scheme: str, plan: HardwarePlan, model_fit: Fit, *, context: int,
            position: int | None = None, tech: MemoryTech = SKY130, fo4_sky130_ns: float | None = None,
            parameters: int | None = None) -> dict:
    """Area, transistors, clock and tokens/s of `cfg` on `plan` (projected), at sky130 and scaled to a 6/7 nm class
    node (projected, with the stated assumptions)."""
    qm = standin_qmodel(cfg, scheme, context)
    check_plan(qm, plan)
    position = context // 2 if position is None else position
    shape = plan_shape(qm, plan)
    logic_area, logic_tr = model_fit.logic(shape)
    mem = memory_macros(memory_inventory(qm, plan), tech)
    path = model_fit.path(shape)
    limits = {"logic": 1000.0 / path, "rom_read": tech.cycle_mhz, "sram": tech.cycle_mhz}
    limited_by = min(limits, key=limits.get)
    clock = limits[limited_by]
    cycles = cycles_per_token_estimate(qm, plan, position)
    params = parameters if parameters is not None else model_parameters(cfg)
    area = logic_area + mem["rom"]["area_um2"] + mem["sram"]["area_um2"]
    transistors = logic_tr + mem["rom"]["transistors"] + mem["sram"]["transistors"]
    sky = {
        "label": "projected", "node": tech.node, "library": model_fit.library, "corner": model_fit.corner,
        "logic_area_mm2": logic_area / 1e6, "logic_transistors": logic_tr,
        "rom_bits": mem["rom"]["bits"], "rom_area_mm2": mem["rom"]["area_um2"] / 1e6,
        "rom_transistors": mem["rom"]["transistors"],
        "weight_rom_bits": mem["weights"]["bits"], "weight_rom_transistors": mem["weights"]["transistors"],
        "sram_bits": mem["sram"]["bits"], "sram_area_mm2": mem["sram"]["area_um2"] / 1e6,
        "sram_transistors": mem["sram"]["transistors"],
        "area_mm2": area / 1e6, "transistors": transistors, "transistors_per_parameter": transistors / params,
        "critical_path_ns": path, "clock_limits_mhz": limits, "clock_mhz": clock, "clock_limited_by": limited_by,
        "tokens_per_s": clock * 1e6 / cycles,
    }
    result = {
        "model": {"parameters": params, "stored_weights": qm.n_weights, "weight_bits": qm.weight_bits,
                  "avg_weight_bits": qm.avg_weight_bits, "vocab": cfg.vocab_size, "d_model": cfg.d_model,
                  "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
                  "head_dim": cfg.head_dim, "ffn": cfg.ffn, "activation": cfg.activation, "norm": cfg.norm,
                  "positions": cfg.positions, "tied_head": cfg.tied_head, "label": "from the configuration"},
        "scheme": scheme, "context": context, "position": position,
        "engine": {"rows": plan.rows, "lanes": plan.lanes, "epilogue_lanes": plan.epilogue_lanes,
                   "softmax_lanes": plan.softmax_lanes, "attention_rows": plan.attn_rows(cfg.head_dim),
                   "macs_per_cycle": plan.macs_per_cycle, "shape": plan.shape,
                   "within_rtl_limits": plan.rows <= 64 and plan.lanes <= 64},
        "schedule": {"cycles_per_token": cycles, "macs_per_token": macs_per_token(qm, position),
                     "latency_floor_cycles": latency_floor_cycles(qm, plan, position),
                     "label": "from rtl/plan.py's schedule"},
        "sky130": sky,
    }
    if fo4_sky130_ns is not None:
        speed = fo4_sky130_ns * 1000.0 / FO4_7NM_PS
        scaled_clock = clock * speed
        result["scaled"] = {
            "label": "projected, scaled by assumption", "node": SCALED_NODE,
            "area_mm2": transistors / (N6_DENSITY_MTR_MM2 * 1e6), "transistors": transistors,
            "transistors_per_parameter": transistors / params, "clock_mhz": scaled_clock,
            "tokens_per_s": scaled_clock * 1e6 / cycles,
            "speed_ratio": speed, "density_mtr_mm2": N6_DENSITY_MTR_MM2,
        }
    return result


def assumptions(fo4_sky130: float | None) -> list[str]:
    out = [
        "logic: a linear model of the engine's blocks fitted to small sky130 syntheses (benchmarks/results/"
        "asic_blocks.json), a buffer tree on every net of more than 8 inputs counted in; no placement, wires, clock "
        "skew or power grid",
        "memories: boards/rom_macro.py's mask-ROM and SRAM macros (published sky130 SRAM figures, an estimated ROM "
        f"bit cell), deeper than {MAX_MACRO_DEPTH} words tiled into macros of that depth, the macro's read time "
        "kept whatever the memory's size (no global wiring)",
        "mixed36 without weights: attention projections 6 bits, MLP, embedding and head 3 bits",
        "tokens/s for one user: the clock over the schedule's cycles for one token at half the context",
    ]
    if fo4_sky130 is not None:
        out += [f"scaled area: the same transistors at {N6_DENSITY_MTR_MM2:.1f} MTr/mm^2 (TSMC N7 high-density "
                f"logic 91.2 MTr/mm^2, WikiChip; N6 +18% logic density, TSMC): memories and logic alike",
                f"scaled clock: the same paths in FO4 delays, sky130 FO4 {fo4_sky130 * 1000:.1f} ps (its liberty, "
                f"inv_1) against {FO4_7NM_PS:.0f} ps assumed for a 7/6 nm-class FinFET node (not from a checked "
                f"source): x{fo4_sky130 * 1000 / FO4_7NM_PS:.1f}, macros too"]
    return out


# ---- inputs, the table, `hardwire project` --------------------------------------------------------------------

DEFAULT_CONTEXT = 2048  # the KV cache a projection holds unless --context says: the model's, at most this
DEFAULT_WIDTHS = ((1, 8), (8, 16), (64, 64))  # rows x lanes projected when --rows / --lanes are not given
OUTPUT_NAME = "project_asic.json"


def config_from_input(path: Path) -> tuple[ModelConfig, str, int]:
    """The ModelConfig of a Hugging Face config.json, a folder holding one, or a model.onnx (the importer's), and
    the model's parameters (the importer's count, or hf_parameters)."""
    if not path.exists():
        raise ProjectionError(f"{path}: no such file or folder; give a Hugging Face config.json, a folder holding "
                              f"one, or a model.onnx")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ProjectionError(f"{path}: a folder without config.json; give a Hugging Face model folder, its "
                                  f"config.json, or a model.onnx")
        path = path / "config.json"
    if path.suffix == ".onnx":
        from ..frontend import load

        ir = load(path, verify=False)  # the config is what a projection needs; no weights are used
        return ir.config, str(path), ir.n_params
    if path.suffix != ".json":
        raise ProjectionError(f"{path}: not a config.json or a .onnx file; give a Hugging Face config.json, a "
                              f"folder holding one, or a model.onnx")
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ProjectionError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ProjectionError(f"{path}: not a Hugging Face config (a JSON object with model_type)")
    cfg = config_from_hf(config, str(path))
    return cfg, str(path), hf_parameters(config, cfg)


def same_shape(a: ModelConfig, b: ModelConfig) -> bool:
    """The same network (context and RoPE base aside)."""
    fields = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "activation", "norm",
              "positions", "tied_head")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def output_path(source: Path, out: Path | None) -> Path:
    if out is not None:
        return out / OUTPUT_NAME
    return (source if source.is_dir() else source.parent) / OUTPUT_NAME


def load_fit(library: str = "sky130hd") -> tuple[Fit, float]:
    """The fit of the stored points and the library's FO4 delay."""
    from .asic import library_spec
    from .liberty import read_text

    lib = library_spec(library)
    model_fit = fit(load_points())
    if model_fit.library != lib.key:
        raise ProjectionError(f"the stored fit points are {model_fit.library} builds, not {lib.key}")
    return model_fit, fo4_ns(read_text(lib.liberty))


def widths_for(cfg: ModelConfig, scheme: str, rows: int | None, lanes: int | None) -> list[tuple[int, int]]:
    """The (rows, lanes) to project: as given, or DEFAULT_WIDTHS with lanes cut to what the head width (and a block
    scheme's 32 columns) accepts."""
    if rows is not None and lanes is not None:
        return [(rows, lanes)]
    limit = 1
    while cfg.head_dim % (limit * 2) == 0 and limit < 64 and (scheme in ("int8",) or limit < 32):
        limit *= 2
    pairs = DEFAULT_WIDTHS if rows is None and lanes is None else \
        [(r, lanes) for r, _ in DEFAULT_WIDTHS] if rows is None else [(rows, ln) for _, ln in DEFAULT_WIDTHS]
    out = []
    for r, ln in pairs:
        pair = (r, ln if lanes is not None else min(ln, limit))
        if pair not in out:
            out.append(pair)
    return out


def project_model(cfg: ModelConfig, scheme: str, widths: list[tuple[int, int]], model_fit: Fit, fo4: float, *,
                  context: int | None = None, parameters: int | None = None) -> dict:
    """Projections of one configuration at several engine widths, with the fit and the assumptions they rest on."""
    ctx = context if context is not None else min(cfg.context or DEFAULT_CONTEXT, DEFAULT_CONTEXT)
    if ctx < 1:
        raise ProjectionError(f"--context must be a positive number of positions, got {ctx}")
    rows_out = [project(cfg, scheme, default_plan(r, ln, cfg.head_dim), model_fit, context=ctx, fo4_sky130_ns=fo4,
                        parameters=parameters) for r, ln in widths]
    return {
        "date": datetime.date.today().isoformat(), "label": "projected",
        "projections": rows_out,
        "fit": {"points": list(model_fit.points), "library": model_fit.library, "corner": model_fit.corner,
                "area_um2_coefficients": dict(zip(FEATURES, model_fit.area, strict=True)),
                "transistor_coefficients": dict(zip(FEATURES, model_fit.transistors, strict=True)),
                "path_ns": {"intercept": model_fit.path_ns[0], "per_log2_width": model_fit.path_ns[1]},
                "source": str(BLOCKS_FILE.relative_to(BLOCKS_FILE.parent.parent.parent)), "label": "fitted"},
        "fo4_sky130_ps": fo4 * 1000, "assumptions": assumptions(fo4),
    }


def format_table(name: str, result: dict) -> str:
    """The terminal table of project_model's result: every figure projected."""
    first = result["projections"][0]
    model = first["model"]
    lines = [f"{name}: {model['parameters']:,} parameters ({first['scheme']}, {model['avg_weight_bits']:.2f} bits a "
             f"weight with scales), context {first['context']}, tokens/s at position {first['position']}",
             f"all figures projected [{result['fit']['library']}, {result['fit']['corner']}; scaled: {SCALED_NODE}, "
             f"by assumption]",
             f"{'engine':<18}{'MACs/cyc':>9}{'cycles/token':>14} | {'sky130 mm2':>11}{'tr/param':>9}{'MHz':>7}"
             f"{'tokens/s':>10} | {'scaled mm2':>11}{'MHz':>7}{'tokens/s':>10}"]
    for p in result["projections"]:
        s, e = p["sky130"], p["engine"]
        shape = f"{e['rows']} x {e['lanes']}" + ("" if e["within_rtl_limits"] else " (>RTL)")
        line = (f"{shape:<18}{e['macs_per_cycle']:>9,}{p['schedule']['cycles_per_token']:>14,} | "
                f"{s['area_mm2']:>11,.1f}{s['transistors_per_parameter']:>9.2f}{s['clock_mhz']:>7.1f}"
                f"{s['tokens_per_s']:>10,.1f}")
        if "scaled" in p:
            c = p["scaled"]
            line += f" | {c['area_mm2']:>11,.1f}{c['clock_mhz']:>7.0f}{c['tokens_per_s']:>10,.1f}"
        lines.append(line)
    return "\n".join(lines)


def project_command(source: Path, *, rows: int | None, lanes: int | None, scheme: str, context: int | None,
                    library: str, out: Path | None) -> Path:
    """`hardwire project`: the table on the terminal, the JSON beside the input (or in OUT); returns its path."""
    if scheme not in PROJECT_SCHEMES:
        raise ProjectionError(f"unknown --scheme {scheme!r}; accepted: {', '.join(PROJECT_SCHEMES)}")
    for flag, value in (("--rows", rows), ("--lanes", lanes)):
        if value is not None and (value < 1 or value & (value - 1)):
            raise ProjectionError(f"{flag} must be a power of two (1, 2, 4, ...), got {value}")
    if context is not None and context < 1:
        raise ProjectionError(f"--context must be a positive number of positions, got {context}")
    cfg, where, parameters = config_from_input(source)
    model_fit, fo4 = load_fit(library)
    result = project_model(cfg, scheme, widths_for(cfg, scheme, rows, lanes), model_fit, fo4, context=context,
                           parameters=parameters)
    result["source"] = where
    if same_shape(cfg, reference_shapes()["Llama 3.1 8B"]):
        result["hc1"] = HC1  # the chip it follows, beside the projection
    path = output_path(source, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(format_table(where, result))
    if "hc1" in result:
        print(f"beside it, {HC1['name']} ({HC1['label']}): {HC1['model']}, {HC1['node']}, {HC1['area_mm2']} mm2, "
              f"~{HC1['transistors_per_parameter']} transistors a parameter, ~{HC1['tokens_per_s']:,} tokens/s per user")
    print(f"wrote {path}")
    return path


# ---- buffered timing of a synthesised build -------------------------------------------------------------------

BUFFER_CELL = "sky130_fd_sc_hd__buf_4"
MAX_FANOUT = 8


def buffer_fanout(module: dict, library, buffer: str = BUFFER_CELL, max_fanout: int = MAX_FANOUT) -> tuple[dict, int]:
    """A copy of a mapped yosys module whose nets drive at most `max_fanout` inputs: every wider net gets a tree of
    `buffer` cells, as placement's design repair would build (boards/liberty.py times the netlist as synthesis left it,
    where one inverter can drive hundreds of enable pins). Returns the module and the buffers added."""
    cells = {name: {**cell, "connections": {pin: list(bits) for pin, bits in cell["connections"].items()}}
             for name, cell in module["cells"].items()}

    def is_output(cell: dict, pin: str) -> bool:
        lib_cell = library.cells.get(cell["type"])
        if lib_cell is not None:
            return pin in lib_cell.outputs
        return cell.get("port_directions", {}).get(pin) == "output"

    loads: dict[int, list[tuple[str, str, int]]] = {}
    top = 0
    for name, cell in cells.items():
        for pin, bits in cell["connections"].items():
            output = is_output(cell, pin)
            for k, bit in enumerate(bits):
                if isinstance(bit, str):
                    continue
                top = max(top, bit)
                if not output:
                    loads.setdefault(bit, []).append((name, pin, k))
    for port in module.get("ports", {}).values():
        top = max([top] + [b for b in port["bits"] if not isinstance(b, str)])
    added = 0
    for bit, sinks in loads.items():
        level = sinks
        while len(level) > max_fanout:
            parents = []
            for start in range(0, len(level), max_fanout):
                top += 1
                added += 1
                name = f"$fanout_buf{added}"
                for cell_name, pin, k in level[start:start + max_fanout]:
                    cells[cell_name]["connections"][pin][k] = top
                cells[name] = {"type": buffer, "connections": {"A": [bit], "X": [top]}}
                parents.append((name, "A", 0))
            level = parents
    return {**module, "cells": cells}, added


def buffered_timing(folder: Path, library: str = "sky130hd") -> dict:
    """The critical path of a synthesised build (folder/asic/asic_netlist.json) once its wide nets are buffered."""
    from ..rtl.build import TOP_NAME
    from .asic import library_spec
    from .liberty import parse_library, read_text, static_timing

    lib = library_spec(library)
    module = json.loads((folder / "asic" / "asic_netlist.json").read_text())["modules"][TOP_NAME]
    types = {cell["type"] for cell in module["cells"].values()} | {BUFFER_CELL}
    cell_lib = parse_library(read_text(lib.liberty), types)
    buffered, added = buffer_fanout(module, cell_lib)
    timing = static_timing(buffered, cell_lib)
    per_cell = json.loads(lib.transistors.read_text())["transistors"]
    return {"buffered_path_ns": timing["critical_path_ns"], "buffered_path_depth": timing["path_depth"],
            "fanout_buffers": added, "fanout_buffer_area_um2": round(added * cell_lib.cells[BUFFER_CELL].area, 3),
            "fanout_buffer_transistors": added * per_cell[BUFFER_CELL],
            "max_fanout": MAX_FANOUT, "buffer_cell": BUFFER_CELL}
