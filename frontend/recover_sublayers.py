"""The two sublayers of a decoder block, read off the graph: attention (which projection is q, k or v by where it
flows, a fused qkv cut where its Split cuts, the score scale, the causal or windowed mask, RoPE and partial rotary)
and the MLP (gated or not, and its activation).
"""

from __future__ import annotations

import numpy as np
import onnx

from .ir import Activation, Linear
from .recover_reader import LAYOUT_OPS, GraphReader, attribute, f32_array

ACTIVATION_OPS = {"Sigmoid", "Tanh", "Erf", "Gelu", "Relu"}
MASK_FLOOR = -1e4  # an additive mask entry at or below this removes the key: exp() of it is 0 in float32


class SublayerReader(GraphReader):
    """Attention and the MLP, each between a residual value and the node that closes the sublayer."""

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
                parts[role(piece)] = Linear(f32_array(lin.weight[rows]), None if lin.bias is None else f32_array(lin.bias[rows]))
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
            parts["q"] = Linear(f32_array(q.weight.astype(np.float64) * factor),
                                None if q.bias is None else f32_array(q.bias.astype(np.float64) * factor))
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
            if node.op_type not in LAYOUT_OPS or len(view.dynamic_inputs(node)) != 1:
                raise self.fail(node, "only reshapes and transposes may lie between a fused qkv projection and its Split")
            if node.op_type == "Transpose":
                index = np.transpose(index, attribute(node, "perm", None))
            else:
                index = index.reshape(view.shape(node.output[0]))
        axis = int(attribute(split, "axis", 0))
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
            allowed &= grid > MASK_FLOOR if op == "Add" else (grid if x else ~grid)
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
            elif "Tanh" in ops or (gelu is not None and attribute(gelu, "approximate", b"none") in (b"tanh", "tanh")):
                activation = "gelu_tanh_glu"
            else:
                raise self.fail(inputs[0], "a gated MLP is supported with SiLU (SwiGLU) or GELU-tanh (GeGLU) only")
            outs = [self.linear(p) for p in inputs]
            inside = {o for n in nodes if n.op_type in ACTIVATION_OPS for o in n.output}
            gated = [bool(view.descendants([out]) & inside) for _, out in outs]
            if sorted(gated) != [False, True]:
                raise self.fail(inputs[0], "could not tell the gate projection (feeding the activation) from up")
            gate, up = (outs[0][0], outs[1][0]) if gated[0] else (outs[1][0], outs[0][0])
        else:
            up, _ = self.linear(inputs[0])
            gelu = next((n for n in nodes if n.op_type == "Gelu"), None)
            if gelu is not None:
                activation = "gelu_tanh" if attribute(gelu, "approximate", b"none") in (b"tanh", "tanh") else "gelu"
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

