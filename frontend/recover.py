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

_ACTIVATION_OPS = {"Sigmoid", "Tanh", "Erf", "Gelu", "Relu"}
_LAYOUT_OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten"}
MASK_LENGTH = 2048  # where a RoPE graph states no context, attention masks are read at this length
_MASK_FLOOR = -1e4  # an additive mask entry at or below this removes the key: exp() of it is 0 in float32


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
        self.folded: list[str] = []  # what import folded into existing IR fields, for ModelConfig.folded

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
        outs: dict[str, str] = {}  # role -> the value that carries the projection's result
        if len(inputs) == 3:
            for proj in inputs:
                lin, out = self.linear(proj)
                parts[role(out)] = lin
                outs[role(out)] = out
        elif len(inputs) == 1:  # fused qkv (GPT-2's c_attn, GPT-NeoX's per-head qkv): cut where its Split cuts
            lin, out = self.linear(inputs[0])
            split = next((n for n in nodes if n.op_type == "Split" and out in view.ancestors(n.input[0], stop=set())), None)
            if split is None or len(split.output) != 3:
                raise self.fail(inputs[0], "a fused qkv projection must be followed by a Split into three")
            for piece, rows in zip(split.output, self.split_rows(out, split), strict=True):
                parts[role(piece)] = Linear(_f32(lin.weight[rows]), None if lin.bias is None else _f32(lin.bias[rows]))
                outs[role(piece)] = piece
        if sorted(parts) != ["k", "q", "v"]:
            raise self.fail(inputs[0], f"could not tell q, k and v apart among {len(inputs)} projections "
                                       "(expected q reaching the scores' left operand, k the right, v neither)")
        o, _ = self.linear(outputs[0])
        head_dim = view.shape(score_mm.input[0])[-1]
        rope, rotary_dims = self.rope(nodes, parts, score_mm, head_dim)
        scale = self.score_scale(outs, score_mm, softmax)
        factor = scale * np.sqrt(head_dim)  # the float forward divides by sqrt(head_dim): q carries the rest
        if abs(factor - 1) > 1e-5:
            q = parts["q"]
            parts["q"] = Linear(_f32(q.weight.astype(np.float64) * factor),
                                None if q.bias is None else _f32(q.bias.astype(np.float64) * factor))
        return dict(norm=norm, kind=kind, eps=eps, head_dim=head_dim, rope=rope, rotary_dims=rotary_dims, o=o,
                    normed=first_in, score_scale=scale, mask=self.mask(score_mm, softmax), softmax=softmax, **parts)

    def split_rows(self, out: str, split: onnx.NodeProto) -> list[np.ndarray]:
        """The projection rows of each piece of SPLIT, found by carrying each element's index (token * rows + row)
        of OUT through the layout ops in between; rows in the order of the piece's elements (heads, then dims)."""
        view = self.view
        value = view.value(out)
        rows = value.shape[-1]
        index = np.arange(value.size).reshape(value.shape)
        for node in view.nodes_between({out}, split.input[0]):
            if node.op_type not in _LAYOUT_OPS or len(view.dynamic_inputs(node)) != 1:
                raise self.fail(node, "only reshapes and transposes may lie between a fused qkv projection and its Split")
            if node.op_type == "Transpose":
                index = np.transpose(index, _attr(node, "perm", None))
            else:
                index = index.reshape(view.shape(node.output[0]))
        axis = int(_attr(split, "axis", 0))
        bounds = np.cumsum([view.shape(piece)[axis] for piece in split.output])[:-1]
        pieces = []
        for part in np.split(index, bounds, axis=axis):
            flat = part.reshape(-1)
            first = flat[flat // rows == 0] % rows  # the first token's elements
            pieces.append(first)
        return pieces

    def score_scale(self, outs: dict[str, str], score_mm: onnx.NodeProto, softmax: onnx.NodeProto) -> float:
        """The product of the constant scalars that multiply q, k or the scores before the softmax."""
        view = self.view
        nodes = {id(n): n for start, end in ((outs["q"], score_mm.input[0]), (outs["k"], score_mm.input[1]),
                                             (score_mm.output[0], softmax.input[0]))
                 for n in view.nodes_between({start}, end)}
        scale = 1.0
        for node in nodes.values():
            static = view.static_inputs(node)
            if node.op_type not in ("Mul", "Div") or len(static) != 1 or view.value(static[0]).size != 1:
                continue
            value = float(view.value(static[0]).reshape(()))
            scale *= 1 / value if node.op_type == "Div" and node.input[1] == static[0] else value
        return scale

    def mask(self, score_mm: onnx.NodeProto, softmax: onnx.NodeProto) -> list[tuple[str, str, bool]]:
        """The masks between the scores and the softmax: (op, constant's name, whether the scores are Where's X)."""
        view = self.view
        found = []
        for node in view.nodes_between({score_mm.output[0]}, softmax.input[0]):
            static = [i for i in view.static_inputs(node) if view.value(i).size > 1]
            if node.op_type == "Add" and static:
                found.append(("Add", static[0], True))
            elif node.op_type == "Where" and node.input[0] in static:
                found.append(("Where", node.input[0], node.input[1] in view.dynamic))
        return found

    def window(self, masks: list[tuple[str, str, bool]], values: dict[str, np.ndarray], t: int,
               softmax: onnx.NodeProto) -> int | None:
        """The attention window the masks (their VALUES at length T) leave: None when every query sees all earlier
        keys (causal), w when it sees the last w (itself included)."""
        allowed = np.ones((t, t), dtype=bool)
        for op, name, x in masks:
            value = values[name]
            grid = np.broadcast_to(value, (*value.shape[:-2], t, t)).reshape(-1, t, t)[0]
            allowed &= grid > _MASK_FLOOR if op == "Add" else (grid if x else ~grid)
        query, key = np.arange(t)[:, None], np.arange(t)[None, :]
        causal = key <= query
        if not np.array_equal(allowed & causal, allowed) or not allowed.diagonal().all():
            raise self.fail(softmax, "the attention mask is neither causal nor a causal window (a query sees keys "
                                     "its position does not allow); supported: causal attention, optionally windowed")
        seen = (allowed & causal).sum(axis=1)  # keys each query sees
        w = int(seen[-1])
        if w == t:
            if np.array_equal(allowed, causal):
                return None
        elif np.array_equal(allowed, causal & (key > query - w)):
            return w
        raise self.fail(softmax, "the attention mask is neither causal nor a causal window (a query sees keys "
                                 "its position does not allow); supported: causal attention, optionally windowed")

    def rope(self, nodes: list[onnx.NodeProto], parts: dict, score_mm: onnx.NodeProto,
             head_dim: int) -> tuple[float | None, int | None]:
        """(RoPE base, rotated dims per head) from the cos/sin tables multiplied into q, or (None, None) when q
        is not rotated. Partial rotary (GPT-NeoX, Phi) rotates the first dims of each head, with tables that wide."""
        view = self.view
        q_path = view.ancestors(score_mm.input[0], stop=set())
        tables = []
        for node in nodes:
            if node.op_type != "Mul" or not any(d in q_path for d in view.dynamic_inputs(node)):
                continue
            for name in view.static_inputs(node):
                value = view.value(name)
                width = value.shape[-1] if value.ndim >= 2 else 0
                if 2 <= width <= head_dim and width % 2 == 0 and value.size > width:
                    tables.append(value.reshape(-1, width).astype(np.float64))
        if not tables:
            return None, None
        if len({t.shape[1] for t in tables}) != 1:
            raise self.fail(score_mm, "q is multiplied by position tables of different widths")
        head_dim = tables[0].shape[1]  # the rotated dims: all of a head's, or its first ones
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
        return (float(nearest) if abs(theta - nearest) < 1e-4 * theta else theta), head_dim

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
            gelu = next((n for n in nodes if n.op_type == "Gelu"), None)
            if "Sigmoid" in ops:
                activation: Activation = "silu_glu"
            elif "Tanh" in ops or (gelu is not None and _attr(gelu, "approximate", b"none") in (b"tanh", "tanh")):
                activation = "gelu_tanh_glu"
            else:
                raise self.fail(inputs[0], "a gated MLP is supported with SiLU (SwiGLU) or GELU-tanh (GeGLU) only")
            outs = [self.linear(p) for p in inputs]
            inside = {o for n in nodes if n.op_type in _ACTIVATION_OPS for o in n.output}
            gated = [bool(view.descendants([out]) & inside) for _, out in outs]
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
            elif "Relu" in ops:
                activation = "relu"
            else:
                raise self.fail(inputs[0], "an ungated MLP is supported with GELU (exact or tanh) or ReLU only")
        down, _ = self.linear(outputs[0])
        return dict(norm=norm, kind=kind, eps=eps, up=up, gate=gate, down=down, activation=activation, normed=first_in)

    # -- the whole model -------------------------------------------------------------

    def embedding(self) -> tuple[np.ndarray, str, np.ndarray | None]:
        """(token table, the residual stream's first value, learned position table or None).

        A constant scalar multiplying the embedding (Gemma's sqrt(d_model)) is folded into the table; a learned
        position table whose rows are added from an offset (OPT's 2) is sliced to start at position 0.
        """
        view = self.view
        for node in view.nodes:
            if node.op_type == "Gather" and len(node.input) == 2 and view.is_static(node.input[0]) \
                    and node.input[1] in view.dynamic and view.value(node.input[0]).ndim == 2:
                table, stream = view.value(node.input[0]).astype(np.float64), node.output[0]
                break
        else:
            raise ModelImportError(f"{self.where}: no token embedding found (a Gather of a constant (vocab, d_model) "
                                   "table by the token ids); this is not a decoder-only language model")
        scale = 1.0
        while len(view.consumers[stream]) == 1:  # the unscaled embedding is used nowhere else
            node = view.consumers[stream][0]
            static = view.static_inputs(node)
            scalar = len(static) == 1 and view.value(static[0]).size == 1
            if scalar and (node.op_type == "Mul" or (node.op_type == "Div" and node.input[1] == static[0])):
                value = float(view.value(static[0]).reshape(()))
                scale *= 1 / value if node.op_type == "Div" else value
                stream = node.output[0]
            elif node.op_type in _LAYOUT_OPS and view.shape(node.output[0])[-1:] == table.shape[1:]:
                stream = node.output[0]
            else:
                break
        if scale != 1.0:
            table = table * scale
            self.folded.append(f"embedding scale {scale:g} (into the table)")
        positions = None
        for consumer in view.consumers[stream]:
            static = view.static_inputs(consumer)
            if consumer.op_type == "Add" and len(static) == 1:
                source = view.producer.get(static[0])
                while source is not None and source.op_type != "Gather" and source.input:
                    source = view.producer.get(source.input[0])
                if source is None or view.value(source.input[0]).ndim != 2:
                    raise self.fail(consumer, "a constant added to the embedding must be a learned position table")
                full = view.value(source.input[0])
                added = view.value(static[0]).reshape(-1, full.shape[1])
                t = len(added)
                offset = next((o for o in range(full.shape[0] - t + 1) if np.array_equal(full[o:o + t], added)), None)
                if offset is None:
                    raise self.fail(consumer, "the constant added to the embedding is not consecutive rows of a "
                                              "learned position table")
                if offset:
                    self.folded.append(f"position offset {offset} (table sliced from row {offset})")
                positions, stream = full[offset:], consumer.output[0]
                break
        return table, stream, positions

    def residual_adds(self, stream: str) -> list[tuple[str, onnx.NodeProto]]:
        """(residual value, the Add that closes a sublayer on it) along the stream; reshapes of the stream
        (OPT flattens it around the MLP) are followed."""
        view = self.view
        steps = []
        while True:
            add = next((c for c in view.consumers[stream] if c.op_type == "Add"
                        and len(view.dynamic_inputs(c)) == 2 and len(set(c.input)) == 2), None)
            if add is None:
                only = view.consumers[stream]
                if len(only) == 1 and only[0].op_type in _LAYOUT_OPS and len(view.dynamic_inputs(only[0])) == 1 \
                        and view.shape(only[0].output[0])[-1:] == view.shape(stream)[-1:]:
                    stream = only[0].output[0]
                    continue
                return steps
            steps.append((stream, add))
            stream = add.output[0]

    def windows(self, blocks: list[dict], context: int | None) -> list[int | None]:
        """Each layer's attention window, from its masks evaluated at the model's context (MASK_LENGTH when the
        graph does not say): a window longer than the probe is invisible at the probe's length."""
        length = context or MASK_LENGTH
        names = sorted({name for att in blocks for _, name, _ in att["mask"]})
        values = self.view.evaluate_at(names, length) if names else {}
        return [self.window(att["mask"], values, length, att["softmax"]) for att in blocks]

    def parallel(self, residual: str, add: onnx.NodeProto) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
        """(attention's last node, the MLP's last node) when ADD adds both sublayers' sum to the residual
        (a parallel block: GPT-NeoX, Phi); None for a sequential block."""
        view = self.view
        other = next(i for i in add.input if i != residual)
        inner = view.producer.get(other)
        if inner is None or inner.op_type != "Add" or len(view.dynamic_inputs(inner)) != 2:
            return None
        branches = [view.producer[i] for i in inner.input]
        softmax = [any(n.op_type == "Softmax" for n in view.nodes_between({residual}, b.output[0])) for b in branches]
        if sorted(softmax) != [False, True]:
            return None
        return (branches[0], branches[1]) if softmax[0] else (branches[1], branches[0])

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
        blocks = []  # (attention, mlp, parallel) per block
        i = 0
        while i < len(steps):
            r_attn, add_attn = steps[i]
            if not any(n.op_type == "Softmax" for n in self.view.nodes_between({r_attn}, add_attn.output[0])):
                raise self.fail(add_attn, "expected an attention sublayer (with a Softmax) before this residual Add")
            branches = self.parallel(r_attn, add_attn)
            if branches is not None:  # x + attn(norm1(x)) + mlp(norm2(x)): one Add closes the block
                blocks.append((self.attention(r_attn, branches[0], d_model), self.mlp(r_attn, branches[1], d_model), True))
                i += 1
                continue
            if i + 1 == len(steps):
                break
            r_mlp, add_mlp = steps[i + 1]
            blocks.append((self.attention(r_attn, add_attn, d_model), self.mlp(r_mlp, add_mlp, d_model), False))
            i += 2
        if not blocks or i != len(steps):
            where = self.fail(steps[-1][1], "") if steps else None
            raise ModelImportError(f"{self.where}: found {len(steps)} residual Adds after the embedding; a decoder "
                                   "needs an attention and an MLP sublayer per block (or one Add of both, for "
                                   "parallel blocks)" + (f" ({where})" if where else ""))
        layers, kinds, epss, rope_thetas, activations, head_dims = [], set(), set(), set(), set(), set()
        layouts, rotary = set(), set()
        windows = self.windows([att for att, _, _ in blocks], context or (None if positions is None else len(positions)))
        for att, mlp, parallel in blocks:
            shared = parallel and att["normed"] == mlp["normed"]  # Phi: one norm feeds both sublayers
            layouts.add((parallel, shared))
            kinds |= {att["kind"], mlp["kind"]}
            epss |= {att["eps"], mlp["eps"]}
            rope_thetas.add(att["rope"])
            rotary.add(att["rotary_dims"])
            activations.add(mlp["activation"])
            head_dims.add(att["head_dim"])
            layers.append(Layer(attn_norm=att["norm"], q=att["q"], k=att["k"], v=att["v"], o=att["o"],
                                mlp_norm=att["norm"] if shared else mlp["norm"], up=mlp["up"], down=mlp["down"],
                                gate=mlp["gate"]))
        final_norm, kind, eps, head = self.head(steps[-1][1].output[0], d_model)
        kinds.add(kind)
        epss.add(eps)
        for what, seen in (("norm kinds", kinds), ("norm epsilons", epss), ("RoPE bases", rope_thetas),
                           ("activations", activations), ("head widths", head_dims), ("rotary widths", rotary),
                           ("block layouts (parallel, shared norm)", layouts)):
            if len(seen) != 1:
                raise ModelImportError(f"{self.where}: layers differ in {what} ({sorted(map(str, seen))}); "
                                       "hardwire needs one value for the whole model")
        head_dim = head_dims.pop()
        rope_theta = rope_thetas.pop()
        rotary_dims = rotary.pop()
        parallel, shared = layouts.pop()
        if (rope_theta is None) == (positions is None):
            raise ModelImportError(f"{self.where}: expected exactly one positional scheme (RoPE or a learned table), "
                                   f"found {'both' if positions is not None else 'neither'}")
        by_factor: dict[float, list[int]] = {}  # q's extra factor (the scale times sqrt(head_dim)) -> layers
        for i, (att, _, _) in enumerate(blocks):
            factor = float(np.float32(att["score_scale"] * np.sqrt(head_dim)))
            if abs(factor - 1) > 1e-5:
                by_factor.setdefault(factor, []).append(i)
        for factor, where in by_factor.items():
            which = "" if len(where) == len(blocks) else f" in layer{'s' if len(where) > 1 else ''} " \
                f"{', '.join(map(str, where))}"
            self.folded.append(f"score scale {factor / np.sqrt(head_dim):g} instead of 1/sqrt(head_dim){which} "
                               f"(q's weights times {factor:g})")
        first = layers[0]
        tied = head.weight.shape == embed.shape and np.array_equal(head.weight, embed)
        config = ModelConfig(
            vocab_size=embed.shape[0], d_model=d_model, n_layers=len(layers),
            n_heads=first.q.shape[0] // head_dim, n_kv_heads=first.k.shape[0] // head_dim, head_dim=head_dim,
            ffn=first.up.shape[0], context=context if context is not None else
            (positions.shape[0] if positions is not None else None),
            norm=kinds.pop(), norm_eps=_f32_scalar(epss.pop()), activation=activations.pop(),
            positions="rope" if rope_theta is not None else "learned", rope_theta=rope_theta, tied_head=tied,
            parallel_residual=parallel, shared_norm=shared,
            rotary_dims=rotary_dims if rotary_dims is not None and rotary_dims != head_dim else None,
            attn_windows=tuple(windows) if any(w is not None for w in windows) else None,
            folded=tuple(self.folded))
        embed32 = _f32(embed)
        return ModelIR(config=config, embed=embed32, layers=tuple(layers), final_norm=final_norm,
                       head=Linear(embed32, head.bias) if tied else head,
                       pos_embed=None if positions is None else _f32(positions))


def recover(view: GraphView, context: int | None) -> ModelIR:
    """Place every part of the decoder found in VIEW; raise ModelImportError naming what does not fit."""
    return _Recovery(view).run(context)
