"""Recovering a ModelIR from the dynamic part of an exported graph.

The pass walks the residual stream: token embedding (plus a learned position table),
then residual Adds, each closing a sublayer. A sublayer with a Softmax is attention,
one without is the MLP; inside each, projections are MatMul/Gemm nodes with a constant
operand, and their roles follow from data flow (which one reaches the scores, which
one feeds an activation), not from names, which exporters do not keep. Whatever cannot
be placed raises ModelImportError naming the node. The result is a hypothesis that
proof.py then checks numerically against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .errors import ModelImportError
from .graph import GraphView
from .ir import Activation, Layer, Linear, ModelConfig, ModelIR, Norm

_ACTIVATION_OPS = {"Sigmoid", "Tanh", "Erf", "Gelu"}


def _f32(array: np.ndarray) -> np.ndarray:
    out = np.ascontiguousarray(array, dtype=np.float32)
    out.setflags(write=False)
    return out


def _f32_scalar(value: float) -> float:
    """The shortest decimal that is the same float32 (graphs store 1e-5 as 9.99999974e-06)."""
    return float(np.format_float_positional(np.float32(value), unique=True))


def _attr(node: onnx.NodeProto, name: str, default: object) -> object:
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


class _Recovery:
    def __init__(self, view: GraphView) -> None:
        self.view = view
        self.where = view.where

    def fail(self, node: onnx.NodeProto | None, why: str) -> ModelImportError:
        place = f"could not place {self.view.label(node)}: " if node is not None else ""
        return ModelImportError(f"{self.where}: {place}{why}")

    # -- projections -----------------------------------------------------------------

    def is_projection(self, node: onnx.NodeProto) -> bool:
        if node.op_type not in ("MatMul", "Gemm"):
            return False
        static = self.view.static_inputs(node)
        return len(self.view.dynamic_inputs(node)) == 1 and len(static) >= 1 and self.view.value(node.input[1]).ndim == 2

    def linear(self, node: onnx.NodeProto) -> tuple[Linear, str]:
        """The projection's weight (out, in) and bias, and the value that carries its result."""
        view = self.view
        if not view.is_static(node.input[1]) or node.input[0] not in view.dynamic:
            raise self.fail(node, "a projection must multiply activations (left) by a constant matrix (right)")
        b = view.value(node.input[1]).astype(np.float64)
        bias = None
        if node.op_type == "MatMul":
            weight = b.T
        else:
            if _attr(node, "transA", 0):
                raise self.fail(node, "Gemm with transA=1 is not supported")
            weight = (b if _attr(node, "transB", 0) else b.T) * float(_attr(node, "alpha", 1.0))
            if len(node.input) > 2 and node.input[2]:
                if not view.is_static(node.input[2]):
                    raise self.fail(node, "Gemm bias must be a constant")
                bias = np.broadcast_to(view.value(node.input[2]), weight.shape[:1]) * float(_attr(node, "beta", 1.0))
        out = node.output[0]
        follow = [out] + [c.output[0] for c in view.consumers[out] if c.op_type == "Reshape"]
        for name in follow:
            for consumer in view.consumers[name]:
                static = view.static_inputs(consumer)
                if consumer.op_type == "Add" and len(static) == 1 and view.value(static[0]).size == weight.shape[0] \
                        and view.shape(static[0])[-1:] == weight.shape[:1]:
                    extra = view.value(static[0]).reshape(-1).astype(np.float64)
                    bias = extra if bias is None else bias + extra
                    return Linear(_f32(weight), _f32(bias)), consumer.output[0]
        return Linear(_f32(weight), None if bias is None else _f32(bias)), out

    # -- norms -----------------------------------------------------------------------

    def norm(self, residual: str, normed: str, d_model: int, consumer: onnx.NodeProto) -> tuple[Norm, str, float]:
        view = self.view
        nodes = view.nodes_between({residual}, normed)
        if not nodes:
            raise self.fail(consumer, "no normalisation between the residual stream and this projection; "
                                      "supported: RMSNorm and LayerNorm before each sublayer (pre-norm)")
        for node in nodes:
            if node.op_type == "LayerNormalization":
                if int(_attr(node, "axis", -1)) not in (-1, len(view.shape(node.input[0])) - 1):
                    raise self.fail(node, "LayerNormalization must normalise the last axis")
                weight = view.value(node.input[1])
                bias = view.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
                eps = float(_attr(node, "epsilon", 1e-5))
                return Norm(_f32(weight), None if bias is None else _f32(bias)), "layer", eps
        kind = "layer" if any(n.op_type == "Sub" for n in nodes) else "rms"
        if not any(n.op_type == "ReduceMean" for n in nodes):
            raise self.fail(nodes[-1], "expected a normalisation (ReduceMean over the last axis) before this projection")
        eps = None
        weight = np.ones(d_model)
        bias = None
        for node in nodes:
            static = view.static_inputs(node)
            if len(static) != 1:
                continue
            value = view.value(static[0])
            dyn = view.dynamic_inputs(node)
            feeds_from_mean = bool(dyn) and dyn[0] in view.producer and view.producer[dyn[0]].op_type == "ReduceMean"
            if node.op_type == "Add" and value.size == 1 and feeds_from_mean:
                eps = float(value.reshape(()))
            elif node.op_type == "Mul" and value.shape[-1:] == (d_model,) and value.size == d_model:
                weight = value.reshape(-1)
            elif node.op_type == "Add" and value.shape[-1:] == (d_model,) and value.size == d_model:
                bias = value.reshape(-1)
        if eps is None:
            raise self.fail(nodes[-1], "could not find the norm's epsilon (an Add of a constant to the mean of squares)")
        return Norm(_f32(weight), None if bias is None else _f32(bias)), kind, eps

    # -- sublayers -------------------------------------------------------------------

    def projections(self, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
        return [n for n in nodes if self.is_projection(n)]

    def attention(self, residual: str, end: onnx.NodeProto, d_model: int) -> dict:
        view = self.view
        nodes = view.nodes_between({residual}, end.output[0])
        projs = self.projections(nodes)
        softmax = next(n for n in nodes if n.op_type == "Softmax")
        before = view.ancestors(softmax.input[0], stop={residual})
        score_mm = next((n for n in nodes if n.op_type == "MatMul" and len(view.dynamic_inputs(n)) == 2
                         and n.output[0] in before), None)
        if score_mm is None or len(projs) < 2:
            raise self.fail(softmax, "expected attention: softmax(q @ k^T) @ v between projections")
        first_in = projs[0].input[0]
        inputs = [p for p in projs if p.input[0] == first_in]
        outputs = [p for p in projs if p.input[0] != first_in]
        if len(outputs) != 1:
            raise self.fail(outputs[-1] if outputs else projs[-1], "expected exactly one output projection after attention")
        norm, kind, eps = self.norm(residual, first_in, d_model, projs[0])

        def role(value: str) -> str:
            reach = view.descendants([value])
            if score_mm.input[0] in reach and score_mm.input[1] not in reach:
                return "q"
            if score_mm.input[1] in reach and score_mm.input[0] not in reach:
                return "k"
            if score_mm.input[0] not in reach and score_mm.input[1] not in reach:
                return "v"
            return "?"

        parts: dict[str, Linear] = {}
        if len(inputs) == 3:
            for proj in inputs:
                lin, out = self.linear(proj)
                parts[role(out)] = lin
        elif len(inputs) == 1:  # fused qkv (GPT-2's c_attn): split by the Split that follows
            lin, out = self.linear(inputs[0])
            split = next((n for n in nodes if n.op_type == "Split" and out in view.ancestors(n.input[0], stop=set())), None)
            if split is None or len(split.output) != 3:
                raise self.fail(inputs[0], "a fused qkv projection must be followed by a Split into three")
            start = 0
            for piece in split.output:
                width = view.shape(piece)[-1]
                rows = slice(start, start + width)
                parts[role(piece)] = Linear(_f32(lin.weight[rows]), None if lin.bias is None else _f32(lin.bias[rows]))
                start += width
        if sorted(parts) != ["k", "q", "v"]:
            raise self.fail(inputs[0], f"could not tell q, k and v apart among {len(inputs)} projections "
                                       "(expected q reaching the scores' left operand, k the right, v neither)")
        o, _ = self.linear(outputs[0])
        head_dim = view.shape(score_mm.input[0])[-1]
        rope = self.rope(nodes, parts, score_mm, head_dim)
        return dict(norm=norm, kind=kind, eps=eps, head_dim=head_dim, rope=rope, o=o, **parts)

    def rope(self, nodes: list[onnx.NodeProto], parts: dict, score_mm: onnx.NodeProto, head_dim: int) -> float | None:
        """RoPE base from the cos/sin tables multiplied into q, or None when q is not rotated."""
        view = self.view
        q_path = view.ancestors(score_mm.input[0], stop=set())
        tables = []
        for node in nodes:
            if node.op_type != "Mul" or not any(d in q_path for d in view.dynamic_inputs(node)):
                continue
            for name in view.static_inputs(node):
                value = view.value(name)
                if value.ndim >= 2 and value.shape[-1] == head_dim and value.size > head_dim:
                    tables.append(value.reshape(-1, head_dim).astype(np.float64))
        if not tables:
            return None
        cos = next((t for t in tables if np.allclose(t[0], 1.0)), None)
        sin = next((t for t in tables if np.allclose(t[0], 0.0)), None)
        if cos is None or sin is None or len(cos) < 2:
            raise self.fail(score_mm, "q is multiplied by position tables that are not RoPE cos/sin tables")
        half = head_dim // 2
        if not (np.allclose(cos[:, :half], cos[:, half:], atol=1e-6) and np.allclose(sin[:, :half], sin[:, half:], atol=1e-6)):
            raise self.fail(score_mm, "RoPE tables are not in the rotate-half layout (interleaved RoPE is not supported)")
        freqs = np.arctan2(sin[1, :half], cos[1, :half])  # angle per position step
        theta = float(freqs[1] ** (-head_dim / 2)) if half > 1 else 10000.0
        expected = theta ** (-np.arange(half) * 2 / head_dim)
        if not np.allclose(freqs, expected, rtol=1e-4):
            raise self.fail(score_mm, "RoPE frequencies are not base^(-2i/head_dim); scaled RoPE variants are not supported")
        nearest = round(theta)
        return float(nearest) if abs(theta - nearest) < 1e-4 * theta else theta

    def mlp(self, residual: str, end: onnx.NodeProto, d_model: int) -> dict:
        view = self.view
        nodes = view.nodes_between({residual}, end.output[0])
        projs = self.projections(nodes)
        if not projs:
            raise self.fail(end, "expected an MLP (projections) in the sublayer closed by this residual Add")
        first_in = projs[0].input[0]
        inputs = [p for p in projs if p.input[0] == first_in]
        outputs = [p for p in projs if p.input[0] != first_in]
        if len(outputs) != 1 or len(inputs) not in (1, 2):
            raise self.fail(projs[-1], f"expected an MLP of up (and gate) then down projections, found "
                                       f"{len(inputs)} input and {len(outputs)} output projections")
        norm, kind, eps = self.norm(residual, first_in, d_model, projs[0])
        ops = {n.op_type for n in nodes}
        gate = None
        if len(inputs) == 2:
            if "Sigmoid" not in ops:
                raise self.fail(inputs[0], "a gated MLP is supported with SiLU (SwiGLU) only")
            activation: Activation = "silu_glu"
            outs = [self.linear(p) for p in inputs]
            gated = [any(c.op_type in _ACTIVATION_OPS for c in view.consumers[out]) for _, out in outs]
            if sorted(gated) != [False, True]:
                raise self.fail(inputs[0], "could not tell the gate projection (feeding the activation) from up")
            gate, up = (outs[0][0], outs[1][0]) if gated[0] else (outs[1][0], outs[0][0])
        else:
            up, _ = self.linear(inputs[0])
            gelu = next((n for n in nodes if n.op_type == "Gelu"), None)
            if gelu is not None:
                activation = "gelu_tanh" if _attr(gelu, "approximate", b"none") in (b"tanh", "tanh") else "gelu"
            elif "Tanh" in ops:
                activation = "gelu_tanh"
            elif "Erf" in ops:
                activation = "gelu"
            else:
                raise self.fail(inputs[0], "an ungated MLP is supported with GELU (exact or tanh) only")
        down, _ = self.linear(outputs[0])
        return dict(norm=norm, kind=kind, eps=eps, up=up, gate=gate, down=down, activation=activation)

    # -- the whole model -------------------------------------------------------------

    def embedding(self) -> tuple[np.ndarray, str, np.ndarray | None]:
        view = self.view
        for node in view.nodes:
            if node.op_type == "Gather" and len(node.input) == 2 and view.is_static(node.input[0]) \
                    and node.input[1] in view.dynamic and view.value(node.input[0]).ndim == 2:
                table, stream = view.value(node.input[0]), node.output[0]
                break
        else:
            raise ModelImportError(f"{self.where}: no token embedding found (a Gather of a constant (vocab, d_model) "
                                   "table by the token ids); this is not a decoder-only language model")
        positions = None
        for consumer in view.consumers[stream]:
            static = view.static_inputs(consumer)
            if consumer.op_type == "Add" and len(static) == 1:
                source = view.producer.get(static[0])
                while source is not None and source.op_type != "Gather" and source.input:
                    source = view.producer.get(source.input[0])
                if source is None or view.value(source.input[0]).ndim != 2:
                    raise self.fail(consumer, "a constant added to the embedding must be a learned position table")
                positions, stream = view.value(source.input[0]), consumer.output[0]
                break
        return table, stream, positions

    def residual_adds(self, stream: str) -> list[tuple[str, onnx.NodeProto]]:
        view = self.view
        steps = []
        while True:
            add = next((c for c in view.consumers[stream] if c.op_type == "Add"
                        and len(view.dynamic_inputs(c)) == 2 and len(set(c.input)) == 2), None)
            if add is None:
                return steps
            steps.append((stream, add))
            stream = add.output[0]

    def head(self, stream: str, d_model: int) -> tuple[Norm, str, float, Linear]:
        view = self.view
        reach = view.descendants([stream])
        projs = [n for n in view.nodes if n.output[0] in reach and self.is_projection(n)]
        if len(projs) != 1:
            raise ModelImportError(f"{self.where}: expected one output projection (the LM head) after the last block, "
                                   f"found {len(projs)}")
        norm, kind, eps = self.norm(stream, projs[0].input[0], d_model, projs[0])
        head, _ = self.linear(projs[0])
        return norm, kind, eps, head

    def run(self, context: int | None) -> ModelIR:
        embed, stream, positions = self.embedding()
        d_model = embed.shape[1]
        steps = self.residual_adds(stream)
        if not steps or len(steps) % 2:
            where = self.fail(steps[-1][1], "") if steps else None
            raise ModelImportError(f"{self.where}: found {len(steps)} residual Adds after the embedding; a decoder "
                                   "needs an attention and an MLP sublayer per block" + (f" ({where})" if where else ""))
        layers, kinds, epss, rope_thetas, activations, head_dims = [], set(), set(), set(), set(), set()
        for (r_attn, add_attn), (r_mlp, add_mlp) in zip(steps[0::2], steps[1::2], strict=True):
            if not any(n.op_type == "Softmax" for n in self.view.nodes_between({r_attn}, add_attn.output[0])):
                raise self.fail(add_attn, "expected an attention sublayer (with a Softmax) before this residual Add")
            att = self.attention(r_attn, add_attn, d_model)
            mlp = self.mlp(r_mlp, add_mlp, d_model)
            kinds |= {att["kind"], mlp["kind"]}
            epss |= {att["eps"], mlp["eps"]}
            rope_thetas.add(att["rope"])
            activations.add(mlp["activation"])
            head_dims.add(att["head_dim"])
            layers.append(Layer(attn_norm=att["norm"], q=att["q"], k=att["k"], v=att["v"], o=att["o"],
                                mlp_norm=mlp["norm"], up=mlp["up"], down=mlp["down"], gate=mlp["gate"]))
        final_norm, kind, eps, head = self.head(steps[-1][1].output[0], d_model)
        kinds.add(kind)
        epss.add(eps)
        for what, seen in (("norm kinds", kinds), ("norm epsilons", epss), ("RoPE bases", rope_thetas),
                           ("activations", activations), ("head widths", head_dims)):
            if len(seen) != 1:
                raise ModelImportError(f"{self.where}: layers differ in {what} ({sorted(map(str, seen))}); "
                                       "hardwire needs one value for the whole model")
        head_dim = head_dims.pop()
        rope_theta = rope_thetas.pop()
        if (rope_theta is None) == (positions is None):
            raise ModelImportError(f"{self.where}: expected exactly one positional scheme (RoPE or a learned table), "
                                   f"found {'both' if positions is not None else 'neither'}")
        first = layers[0]
        tied = head.weight.shape == embed.shape and np.array_equal(head.weight, embed)
        config = ModelConfig(
            vocab_size=embed.shape[0], d_model=d_model, n_layers=len(layers),
            n_heads=first.q.shape[0] // head_dim, n_kv_heads=first.k.shape[0] // head_dim, head_dim=head_dim,
            ffn=first.up.shape[0], context=context if context is not None else
            (positions.shape[0] if positions is not None else None),
            norm=kinds.pop(), norm_eps=_f32_scalar(epss.pop()), activation=activations.pop(),
            positions="rope" if rope_theta is not None else "learned", rope_theta=rope_theta, tied_head=tied)
        embed32 = _f32(embed)
        return ModelIR(config=config, embed=embed32, layers=tuple(layers), final_norm=final_norm,
                       head=Linear(embed32, head.bias) if tied else head,
                       pos_embed=None if positions is None else _f32(positions))


def recover(view: GraphView, context: int | None) -> ModelIR:
    """Place every part of the decoder found in VIEW; raise ModelImportError naming what does not fit."""
    return _Recovery(view).run(context)
