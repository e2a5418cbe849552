"""ModelIR -> QModel: weight codes, activation scales, multipliers, shifts and tables.

Floats live here and only here: every constant the integer decoder uses is computed
once, from the folded float model and its calibration, and written down as integers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import torch

from ..frontend.float_model import float_forward
from ..frontend.ir import Linear, ModelConfig, ModelIR
from ..progress import track
from .blocks import SCORE_BITS
from .calibrate import Calibration, calibrate, self_generated
from .divergence import kl_per_token
from .fixedpoint import bits_for, multiplier, multipliers
from .fold import fold_norms, fold_post_signs, fold_qk_signs, qk_signs
from .gptq import gptq
from .partial_rotary import reorder_rotary_rows
from .qmodel import LoraSpec, QEmbedding, QLayer, QLinear, QModel, QNorm
from .tables import (
    EXP_STEP,
    NORM_OUT_FRAC,
    PROB_BITS,
    ROPE_IN_FRAC,
    cap_units,
    exp_table,
    gelu_table,
    rope_tables,
    rsqrt_table,
    silu_table,
    tanh_cap_table,
)
from .weights import (
    QuantizationError,
    QuantizedWeight,
    allocate_bits,
    quantize_int,
    quantize_int_group,
    quantize_mxfp4,
    scale_bits,
)

SCHEMES = ("int8", "int4", "int3", "mixed36", "mxfp4")
# the weight format of each scheme: below 8 bits one row scale is too coarse, so the integer schemes take a
# power-of-two exponent per 32 inputs (int_group); int8 has the resolution without it
WEIGHT_FORMAT = {"int8": "int", "int4": "int_group", "int3": "int_group", "mixed36": "int_group", "mxfp4": "mxfp4"}
RESIDUAL_HEADROOM = 2.0  # calibrated residual max maps to 2**14: one bit of headroom in int16
LOGIT_BITS_USED = 20  # calibrated logit max maps to 2**20 inside int32
MAX_ACC_BITS = 48
CALIBRATION_SEQUENCES = 32  # self-generated: 4,096 tokens for the bundled model
MAX_BLOCK_SHIFT = 24  # MXFP4: largest left shift of a block relative to its row
DEFAULT_LORA = LoraSpec(rank=4, sites=("q", "v"))  # the usual LoRA placement, small enough to cost little SRAM
NO_LORA = LoraSpec(rank=0, sites=())  # no adapter slots: a chain's boards, `compile --no-lora`
_PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
_INPUT_SITE = {"q": "attn_norm", "k": "attn_norm", "v": "attn_norm", "o": "attn_out", "gate": "mlp_norm",
               "up": "mlp_norm", "down": "hidden"}


def _round_half_up(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5)


def _weights(ir: ModelIR) -> dict[str, np.ndarray]:
    """name -> float (rows, cols) of every tensor the chip stores, from a folded IR."""
    out = {"embed": ir.embed}
    if ir.pos_embed is not None:
        out["pos"] = ir.pos_embed
    for i, layer in enumerate(ir.layers):
        for part in _PROJECTIONS:
            lin = getattr(layer, part)
            if lin is not None:
                out[f"layers.{i}.{part}"] = lin.weight
    out["head"] = ir.head.weight
    return out


def _input_site(name: str) -> str | None:
    """Calibration site of a tensor's matmul input; None for lookup tables (embeddings)."""
    if name in ("embed", "pos"):
        return None
    if name == "head":
        return "final_norm"
    _, i, part = name.split(".")
    return f"layers.{i}.{_INPUT_SITE[part]}"


def _quantize(name: str, w: np.ndarray, scheme: str, bits: int, cal: Calibration,
              in_scale: np.ndarray | None = None) -> QuantizedWeight:
    """Codes for w * in_scale (the integer inputs' steps folded into the columns): round-to-nearest
    scales, then GPTQ re-rounding against the Hessian of the integer inputs."""
    site = _input_site(name)
    s = np.ones(w.shape[1]) if in_scale is None else in_scale
    scaled = w.astype(np.float64) * s[None, :]
    importance = None if site is None else cal.mean_sq[site] / s**2
    if scheme == "mxfp4":
        base = quantize_mxfp4(scaled, importance)
    elif scheme == "int_group":
        base = quantize_int_group(scaled, bits, importance)
    else:
        base = quantize_int(scaled, bits, importance)
    return base if site is None else gptq(scaled, cal.gram[site] / np.outer(s, s), base)


def _with_weight(ir: ModelIR, name: str, w: np.ndarray) -> ModelIR:
    w = w.astype(np.float32)
    if name == "embed":
        return dataclasses.replace(ir, embed=w)
    if name == "pos":
        return dataclasses.replace(ir, pos_embed=w)
    if name == "head":
        return dataclasses.replace(ir, head=Linear(w, ir.head.bias))
    _, i, part = name.split(".")
    layers = list(ir.layers)
    lin = getattr(layers[int(i)], part)
    layers[int(i)] = dataclasses.replace(layers[int(i)], **{part: Linear(w, lin.bias)})
    return dataclasses.replace(ir, layers=tuple(layers))


def _stored_weight(name: str, w: np.ndarray, scheme: str, bits: int, cal: Calibration,
                   in_scale: np.ndarray | None) -> np.ndarray:
    """The float weights that `_quantize`'s codes stand for, the input steps unfolded again."""
    fake = _quantize(name, w, scheme, bits, cal, in_scale).dequantize()
    return fake if in_scale is None else fake / in_scale[None, :]


def sensitivity(folded: ModelIR, cal: Calibration, in_steps: Callable[[str], np.ndarray | None],
                bits: int = 3, weight_format: str = "int_group", progress: bool = False) -> dict[str, float]:
    """Per tensor: KL(float || model with only that tensor at `bits`) on the calibration text.

    The tensor is quantised exactly as it will be stored (input steps folded in), then unfolded.
    progress: a bar per tensor (one float model run each: the long part of mixed36).
    """
    reference = float_forward(folded, cal.ids)
    out = {}
    for name, w in track(_weights(folded).items(), f"sensitivity at {bits} bits", unit="tensors", enabled=progress,
                         name=lambda item: item[0]):
        fake = _stored_weight(name, w, weight_format, bits, cal, in_steps(name))
        out[name] = kl_per_token(reference, float_forward(_with_weight(folded, name, fake), cal.ids))
    return out


def input_steps(folded: ModelIR, steps: dict[str, np.ndarray], name: str) -> np.ndarray | None:
    """The step of every input column of tensor `name` (None for the embeddings, which are lookups)."""
    site = _input_site(name)
    return None if site is None else np.broadcast_to(steps[site], _weights(folded)[name].shape[1:])


def rounded_weights(folded: ModelIR, cal: Calibration, scheme: str, avg_bits: float = 4.0) -> ModelIR:
    """The folded float model with every weight replaced by what its codes stand for under `scheme`.

    The same codes `quantize` stores (input steps folded in, GPTQ), unfolded again: the
    weights' share of the error budget, with every activation still float.
    """
    steps = activation_steps(folded.config, cal)
    weight_scheme = WEIGHT_FORMAT[scheme]
    bits = choose_bits(scheme, folded, cal, avg_bits, lambda name: input_steps(folded, steps, name))
    out = folded
    for name, w in _weights(folded).items():
        out = _with_weight(out, name, _stored_weight(name, w, weight_scheme, bits[name], cal,
                                                     input_steps(folded, steps, name)))
    return out


def _expand_shift(qw: QuantizedWeight) -> torch.Tensor:
    if qw.block_shift is None:
        return torch.zeros(qw.codes.shape, dtype=torch.int64)
    cols = qw.codes.shape[1]
    return torch.from_numpy(np.repeat(qw.block_shift.astype(np.int64), QuantizedWeight.BLOCK, axis=1)[:, :cols])


def _qlinear(name: str, qw: QuantizedWeight, bias: np.ndarray | None, s_out: np.ndarray, out_bits: int,
             in_bits: int = 8) -> QLinear:
    """A projection whose input steps are folded into qw: one accumulator unit is row_scale[o]."""
    codes = torch.from_numpy(qw.codes.astype(np.int64))
    shift = _expand_shift(qw)
    if shift.numel() and int(shift.max()) > MAX_BLOCK_SHIFT:
        raise QuantizationError(f"{name}: MXFP4 block exponents of one row spread over {int(shift.max())} binades; "
                                f"the datapath shifts at most {MAX_BLOCK_SHIFT}")
    acc_scale = qw.row_scale  # float value of one accumulator unit, per output row
    bias_int = np.zeros(codes.shape[0]) if bias is None else _round_half_up(bias.astype(np.float64) / acc_scale)
    bias_t = torch.from_numpy(bias_int.astype(np.int64))
    live = (codes != 0).any(1).numpy() | (bias_int != 0)  # an all-zero row outputs 0 whatever its multiplier
    mult, shr = _multipliers(np.where(live, acc_scale / np.broadcast_to(s_out, acc_scale.shape), 1.0), name)
    bound = int(((codes << shift).abs().sum(1) * (1 << (in_bits - 1)) + bias_t.abs()).max())  # worst-case |acc|
    acc_bits = max(bits_for(bound), 16)
    if acc_bits > MAX_ACC_BITS:
        raise QuantizationError(f"{name}: worst-case accumulator needs {acc_bits} bits, over the {MAX_ACC_BITS}-bit limit")
    return QLinear(codes=codes, block_shift=shift, bias=bias_t, mult=mult, shift=shr, bits=qw.bits, scheme=qw.scheme,
                   in_bits=in_bits, out_bits=out_bits, acc_bits=acc_bits, error=qw.error)


def _multipliers(scales: np.ndarray, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        return multipliers(list(scales), name)
    except ValueError as err:
        raise QuantizationError(f"{name}: a rescale is out of the datapath's range ({err})") from err


def _qembedding(name: str, qw: QuantizedWeight, s_x: float) -> QEmbedding:
    if qw.block_shift is not None and qw.block_shift.size and int(qw.block_shift.max()) > MAX_BLOCK_SHIFT:
        raise QuantizationError(f"{name}: MXFP4 block exponents of one row spread over {int(qw.block_shift.max())} "
                                f"binades; the datapath shifts at most {MAX_BLOCK_SHIFT}")
    live = (qw.codes != 0).any(1)
    mult, shr = _multipliers(np.where(live, qw.row_scale / s_x, 1.0), name)
    return QEmbedding(codes=torch.from_numpy(qw.codes.astype(np.int64)), block_shift=_expand_shift(qw), mult=mult,
                      shift=shr, bits=qw.bits, scheme=qw.scheme, error=qw.error)


def _qnorm(kind: str, eps: float, d: int, s_x: float, s_out: np.ndarray, out_bits: int = 8) -> QNorm:
    k = d if kind == "layer" else 1  # LayerNorm centres as d*x - sum(x)
    worst = d * (2 * k * (1 << 15)) ** 2  # |u| <= 2k * 2**15 for an int16 residual
    if worst >= 1 << 63:
        raise QuantizationError(f"{kind} norm of width {d}: the sum of squares could reach {worst}, over the "
                                "int63 the datapath holds")
    eps_q = max(1, math.floor(eps * d * k * k / (s_x * s_x) + 0.5))
    mult, shift = _multipliers(math.sqrt(d) / (2**15 * s_out), "norm")
    return QNorm(kind=kind, eps_q=eps_q, mult=mult, shift=shift, out_bits=out_bits)


def _qalibi(slopes: tuple[float, ...], s_q: float, s_k: float, hd: int, context: int) -> torch.Tensor:
    """ALiBi's slopes in score units (numerics §6): one score unit is s_q * s_k / sqrt(hd) of the model's scaled
    scores, so slope_h * t becomes alibi[h] * t with alibi[h] = round(slope_h * sqrt(hd) / (s_q * s_k)). The
    rounding costs at most half a unit per key step: far below the exponent table's 1/16 nat once rescaled."""
    alibi = [math.floor(s * math.sqrt(hd) / (s_q * s_k) + 0.5) for s in slopes]
    worst = max(abs(a) for a in alibi) * (context - 1) + hd * (1 << 14)
    if worst >= 1 << (SCORE_BITS - 1):
        raise QuantizationError(f"ALiBi: slopes of up to {max(map(abs, alibi))} score units over {context} positions "
                                f"reach {worst}, over the int{SCORE_BITS} scores")
    return torch.tensor(alibi, dtype=torch.int64)


def _qhead_norm(eps: float, hd: int, s_in: float, s_out: float, gain: np.ndarray, out_bits: int,
                what: str = "q/k norm") -> QNorm:
    """A norm with its gain on the chip: a per-head q/k norm (numerics §6: §4's RMSNorm over one head's hd elements of
    int12 at step s_in, to int12 at s_out) or a post-sublayer norm (§5: d_model elements of int16 to int16), the
    gain's magnitude folded into the per-channel multipliers (fold_qk_signs, fold_post_signs moved its sign into the
    projection's rows). A gain of exactly 0 gets a vanishing multiplier (1, shift 62): its output is 0. Input and
    output have the same width, out_bits."""
    eps_q = max(1, math.floor(eps * hd / (s_in * s_in) + 0.5))
    if eps_q + hd * (1 << 2 * (out_bits - 1)) >= 1 << 62:
        raise QuantizationError(f"{what}: epsilon {eps} is {eps_q} in sum-of-squares units at the projection's step "
                                f"{s_in:.3g}, over the int63 the datapath holds")
    gain = np.abs(np.asarray(gain, dtype=np.float64))
    scale = np.where(gain > 0, math.sqrt(hd) * gain / (2**15 * s_out), 2.0**-80)
    mult, shift = _multipliers(scale, what)
    return QNorm(kind="rms", eps_q=eps_q, mult=mult, shift=shift, out_bits=out_bits)


def choose_bits(scheme: str, folded: ModelIR, cal: Calibration, avg_bits: float,
                in_steps: Callable[[str], np.ndarray | None], progress: bool = False) -> dict[str, int]:
    """Code width per tensor. mixed36: 3 or 6 bits by sensitivity, the codes and their scales together within
    avg_bits per weight."""
    weights = _weights(folded)
    if scheme == "mixed36":
        sens = sensitivity(folded, cal, in_steps, progress=progress)
        n = sum(int(w.size) for w in weights.values())
        side = sum(scale_bits(*w.shape, WEIGHT_FORMAT[scheme]) for w in weights.values())
        if avg_bits - side / n < 3:
            raise QuantizationError(f"avg_bits {avg_bits} leaves less than 3 bits per weight for the codes: the scales "
                                    f"take {side / n:.3f} bits per weight; accepted: avg_bits >= {3 + side / n:.3f}")
        return allocate_bits({name: int(w.size) for name, w in weights.items()}, sens, avg_bits - side / n)
    width = {"int8": 8, "int4": 4, "int3": 3, "mxfp4": 4}[scheme]
    return dict.fromkeys(weights, width)


def residual_and_logit_scales(cal: Calibration) -> dict[str, float]:
    """The int16 residual's step (one bit of headroom over the calibrated max) and the int32 logits' step."""
    return {"residual": max(cal.amax["residual"], 1e-12) * RESIDUAL_HEADROOM / 2**15,
            "logits": max(cal.amax["logits"], 1e-12) / 2**LOGIT_BITS_USED}


def activation_steps(cfg: ModelConfig, cal: Calibration, progress: bool = False) -> dict[str, np.ndarray]:
    """site -> the integer step of every channel there (a scalar site broadcasts one step).

    Matvec inputs (the norm outputs, a gated MLP's up) get SmoothQuant's per-channel steps, which
    fold into the weights that read them (a norm's 16 times finer than its int8 clip: norms write int12); the
    sites that feed the KV cache, the softmax and the tables get one int8 step each. The hidden step of a gated
    MLP is s_gate / 2 * s_up: SILU[g] * u is kept exact. progress: a bar per layer (each site's clipping range
    is a search over every value calibration saw there).
    """
    d, gated = cfg.d_model, cfg.gated
    steps: dict[str, np.ndarray] = {}
    for i in track(range(cfg.n_layers), "calibration ranges", unit="layers", enabled=progress):
        n = f"layers.{i}"
        for site in ("attn_norm", "mlp_norm"):  # int12: 16x finer than the calibrated int8 steps
            steps[f"{n}.{site}"] = cal.channel_scales(f"{n}.{site}", d) / 2**NORM_OUT_FRAC
        for site in ("q", "k", "v", "attn_out", "gate")[: 5 if gated else 4]:
            steps[f"{n}.{site}"] = np.array([cal.int8_scale(f"{n}.{site}")])
        if cfg.qk_norm:  # q and k as projected, before their per-head norms (int12 at a 16x finer step, §6)
            for site in ("q_proj", "k_proj"):
                steps[f"{n}.{site}"] = np.array([cal.int8_scale(f"{n}.{site}")])
        if cfg.post_norms:  # o's and down's outputs into their post-sublayer norms: int16, calibrated as the residual
            for site in ("o_out", "down_out"):
                steps[f"{n}.{site}"] = np.array([max(cal.amax[f"{n}.{site}"], 1e-12) * RESIDUAL_HEADROOM / 2**15])
        if gated:
            steps[f"{n}.up"] = cal.channel_scales(f"{n}.up", cfg.ffn)
            steps[f"{n}.hidden"] = steps[f"{n}.gate"] / 2 * steps[f"{n}.up"]  # SILU out at half the gate's step
        else:  # the GELU table needs one input and one output step
            steps[f"{n}.up"] = np.array([cal.int8_scale(f"{n}.up")])
            steps[f"{n}.hidden"] = np.array([cal.int8_scale(f"{n}.hidden")])
    steps["final_norm"] = cal.channel_scales("final_norm", d) / 2**NORM_OUT_FRAC
    return steps


QUANT_ACTIVATIONS = ("silu_glu", "gelu_tanh_glu", "gelu", "gelu_tanh", "relu")  # each one 256-entry table
SUPPORTED_FEATURES = ("sequential or parallel pre-norm blocks (one norm or two)",
                      "RoPE on every head dim or the first ones (partial rotary), learned positions, or ALiBi",
                      "causal attention, optionally windowed", f"activations {', '.join(QUANT_ACTIVATIONS)}")
# ModelConfig.features the chip implements (each a prefix of the feature's text)
IMPLEMENTED_FEATURES = ("parallel residual", "shared norm", "partial rotary", "windowed attention",
                        "RoPE schedule", "per-head q/k norm", "ALiBi", "logit soft-capping", "post-sublayer norms",
                        "attention soft-capping")


def check_supported(ir: ModelIR, context: int) -> None:
    """Refuse an IR with a feature the integer decoder (quantiser, reference, RTL) does not implement, by name:
    the frontend recovers and proves more than the chip computes, and nothing may compile such a model wrongly.
    Windowed attention (GPT-Neo's local layers, Mistral's sliding window) it implements, at any context."""
    cfg = ir.config
    missing = [f for f in cfg.features if not f.startswith(IMPLEMENTED_FEATURES)]
    if cfg.activation not in QUANT_ACTIVATIONS:
        missing.append(f"activation {cfg.activation}")
    if cfg.alibi_slopes is not None and any(w is not None and w < context for w in cfg.layer_windows):
        missing.append("ALiBi with windowed attention (the chip's ring of keys does not hold their positions)")
    if cfg.alibi_slopes is not None and cfg.attn_softcap is not None:  # no family has both: their order is unsettled
        missing.append("ALiBi with attention soft-capping")
    if missing:
        raise QuantizationError(f"{ir.source or 'the model'}: the integer decoder does not implement "
                                f"{'; '.join(missing)} yet (the import recovered and proved it; quantisation, the "
                                f"reference and the RTL do not); supported: {'; '.join(SUPPORTED_FEATURES)}")


def default_calibration(ir: ModelIR, context: int | None = None, progress: bool = False) -> torch.Tensor:
    """The calibration text quantize() uses when given none: sequences the float model writes itself (no corpus
    needed), as long as the context allows up to 128 tokens; the same for every scheme. -> (sequences, length)."""
    context = context or ir.config.context or 128
    return self_generated(fold_norms(ir), sequences=CALIBRATION_SEQUENCES, length=min(context, 128), progress=progress)


def quantize(ir: ModelIR, scheme: str = "int8", *, avg_bits: float = 4.0, calib_ids: torch.Tensor | None = None,
             context: int | None = None, lora: LoraSpec = DEFAULT_LORA, progress: bool = False) -> QModel:
    """Quantise a ModelIR into the integer program the hardware runs.

    progress: bars for the long parts (calibration text, calibration ranges, sensitivity, weights per tensor).
    """
    if scheme not in SCHEMES:
        raise QuantizationError(f"unknown scheme '{scheme}'; accepted: {', '.join(SCHEMES)}")
    cfg = ir.config
    context = context or cfg.context or 128
    check_supported(ir, context)  # before any work: a feature the chip lacks is refused, never approximated
    if cfg.positions == "learned" and context > ir.pos_embed.shape[0]:
        raise QuantizationError(f"context {context} exceeds the model's {ir.pos_embed.shape[0]} learned positions")
    bad = [s for s in lora.sites if s not in _PROJECTIONS or (s == "gate" and not cfg.gated)]
    if bad:
        raise QuantizationError(f"LoRA sites {bad} are not projections of this model; accepted: "
                                f"{', '.join(p for p in _PROJECTIONS if p != 'gate' or cfg.gated)}")
    folded = fold_norms(ir)  # norm gains and biases into the projections
    if calib_ids is None:
        calib_ids = default_calibration(ir, context, progress)
    cal = calibrate(folded, calib_ids)  # activation ranges at every integer site
    weight_scheme = WEIGHT_FORMAT[scheme]
    d, gated = cfg.d_model, cfg.gated
    scales = residual_and_logit_scales(cal)
    s_x = scales["residual"]
    steps = activation_steps(cfg, cal, progress)
    scales.update({site: float(np.max(v)) for site, v in steps.items()})  # reports: the coarsest step

    def in_steps(name: str) -> np.ndarray | None:
        return input_steps(folded, steps, name)

    bits = choose_bits(scheme, folded, cal, avg_bits, in_steps, progress)  # per-tensor widths (mixed36: by sensitivity)
    raw_frac = ROPE_IN_FRAC if cfg.positions == "rope" else 0  # q, k into RoPE: int12 at a 16x finer step
    raw_bits, raw_scale = 8 + raw_frac, 2**raw_frac
    norm_bits = 8 + NORM_OUT_FRAC  # every norm output, so every projection that reads one: int12
    rotary = reorder_rotary_rows(folded)  # partial rotary: q and k's rows in the RoPE unit's pairs
    stored = fold_post_signs(fold_qk_signs(rotary))  # per-head q/k and post-sublayer norms: gains' signs into rows
    qw = {n: _quantize(n, w, weight_scheme, bits[n], cal, in_steps(n))
          for n, w in track(_weights(stored).items(), f"quantising weights ({scheme})", unit="tensors",
                            enabled=progress, name=lambda item: item[0])}
    layers = []
    for i, layer in enumerate(stored.layers):
        n = f"layers.{i}"

        def lin(part: str, s_out: np.ndarray, out_bits: int, in_bits: int = norm_bits, n: str = n,
                layer=layer) -> QLinear | None:
            src = getattr(layer, part)
            return None if src is None else _qlinear(f"{n}.{part}", qw[f"{n}.{part}"], src.bias, s_out, out_bits, in_bits)

        s = {site: steps.get(f"{n}.{site}") for site in ("q", "k", "v", "attn_out", "gate", "up", "hidden")}
        # q and k out of their projections: at their own steps when a per-head norm reads them, else RoPE's input
        raw = {part: steps[f"{n}.{part}_proj" if cfg.qk_norm else f"{n}.{part}"] / raw_scale for part in ("q", "k")}
        head_norms = {}
        if cfg.qk_norm:
            head_norms = {f"{part}_norm": _qhead_norm(cfg.norm_eps, cfg.head_dim, float(raw[part][0]),
                                                      float(s[part][0]) / raw_scale,
                                                      getattr(layer, f"{part}_norm").weight, raw_bits)
                          for part in ("q", "k")}
        post = {}  # o and down write int16 at their own steps; the post norms bring them to the residual's (§5)
        s_post = {part: np.array([s_x]) for part in ("o", "down")}
        if cfg.post_norms:
            s_post = {"o": steps[f"{n}.o_out"], "down": steps[f"{n}.down_out"]}
            post = {f"post_{sub}_norm": _qhead_norm(cfg.norm_eps, d, float(s_post[part][0]), s_x,
                                                    getattr(layer, f"post_{sub}_norm").weight, 16, "post-sublayer norm")
                    for sub, part in (("attn", "o"), ("mlp", "down"))}
        s_scores = float(s["q"][0] * s["k"][0]) / math.sqrt(cfg.head_dim)  # one integer score, in nats
        cap = {}
        if cfg.attn_softcap is not None:  # scores -> units of c / K, capped by the table, then the softmax (§6)
            unit = cfg.attn_softcap / cap_units(cfg.attn_softcap)
            cap_mult, cap_shift = multiplier(s_scores / unit, "attention soft-cap")
            cap, s_scores = {"cap_mult": cap_mult, "cap_shift": cap_shift}, unit
        sm_mult, sm_shift = multiplier(s_scores / EXP_STEP, "softmax")
        att_mult, att_shift = multiplier(float(s["v"][0]) / (2**PROB_BITS * float(s["attn_out"][0])), "attention output")
        if gated:
            table = silu_table(float(s["gate"][0]), cfg.activation)
        else:
            table = gelu_table(float(s["up"][0]), float(s["hidden"][0]),
                               approximate="relu" if cfg.activation == "relu" else cfg.activation == "gelu_tanh")
        layers.append(QLayer(
            attn_norm=_qnorm(cfg.norm, cfg.norm_eps, d, s_x, steps[f"{n}.attn_norm"], norm_bits),
            q=lin("q", raw["q"], raw_bits), k=lin("k", raw["k"], raw_bits), v=lin("v", s["v"], 8), **head_norms,
            o=lin("o", s_post["o"], 16, 8), **post,
            sm_mult=sm_mult, sm_shift=sm_shift, att_mult=att_mult, att_shift=att_shift, **cap,
            alibi=None if cfg.alibi_slopes is None else _qalibi(cfg.alibi_slopes, float(s["q"][0]), float(s["k"][0]),
                                                                cfg.head_dim, context),
            mlp_norm=_qnorm(cfg.norm, cfg.norm_eps, d, s_x, steps[f"{n}.mlp_norm"], norm_bits),
            gate=lin("gate", s["gate"], 8) if gated else None, up=lin("up", s["up"], 8),
            down=lin("down", s_post["down"], 16, 16 if gated else 8), act_table=table))  # o, down: not norm outputs
    head = _qlinear("head", qw["head"], folded.head.bias, np.array([scales["logits"]]), 32, norm_bits)

    def out_step(i: int, part: str) -> np.ndarray | float:
        """The step of a projection's output rows: the residual's for o and down (or their post-sublayer norm's input
        step), q and k's finer RoPE input step (or their per-head norm's input step); negative on the rows whose gain's
        sign fold_qk_signs or fold_post_signs moved there."""
        if part in ("o", "down") and cfg.post_norms:  # into the post norm: its own step, the gain's sign on the row
            gain = getattr(rotary.layers[i], "post_attn_norm" if part == "o" else "post_mlp_norm").weight
            return steps[f"layers.{i}.{part}_out"] * np.where(gain < 0, -1.0, 1.0)
        if part in ("o", "down"):
            return s_x
        if part in ("q", "k") and cfg.qk_norm:
            layer = rotary.layers[i]
            heads = cfg.n_heads if part == "q" else cfg.n_kv_heads
            return steps[f"layers.{i}.{part}_proj"] / raw_scale * qk_signs(getattr(layer, f"{part}_norm"), heads)
        return steps[f"layers.{i}.{part}"] / (raw_scale if part in ("q", "k") else 1)

    io_steps = {f"layers.{i}.{p}": (in_steps(f"layers.{i}.{p}").tolist(),
                                    np.broadcast_to(out_step(i, p), lin.codes.shape[:1]).tolist())
                for i, layer in enumerate(layers) for p in _PROJECTIONS if (lin := getattr(layer, p)) is not None}
    if cfg.positions == "rope":
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, context, cfg.rotary_dims, cfg.rope_freqs)
    else:
        cos = sin = torch.zeros((0, cfg.head_dim // 2), dtype=torch.int64)
    pos = None
    if cfg.positions == "learned":
        pos_w = _quantize("pos", ir.pos_embed[:context], weight_scheme, bits["pos"], cal)
        pos = _qembedding("pos", pos_w, s_x)
    return QModel(config=cfg, scheme=scheme, context=context, embed=_qembedding("embed", qw["embed"], s_x),
                  layers=tuple(layers),
                  final_norm=_qnorm(cfg.norm, cfg.norm_eps, d, s_x, steps["final_norm"], norm_bits),
                  head=head, rsqrt=rsqrt_table(), exp=exp_table(), rope_cos=cos, rope_sin=sin, scales=scales,
                  steps=io_steps, lora=lora, pos=pos,
                  cap_table=None if cfg.attn_softcap is None else tanh_cap_table(cap_units(cfg.attn_softcap)))
