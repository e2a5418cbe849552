"""The two sublayers of a decoder block, read off the graph: attention (which projection is q, k or v by where it
flows, a fused qkv cut where its Split cuts, the score scale, the causal or windowed mask, RoPE and partial rotary)
and the MLP (gated or not, and its activation).
"""

from __future__ import annotations

import numpy as np
import onnx

from .ir import Activation, Linear, Norm
from .recover_alibi import AlibiReader
from .recover_reader import LAYOUT_OPS, attribute, f32_array

ACTIVATION_OPS = {"Sigmoid", "Tanh", "Erf", "Gelu", "Relu"}
NORM_OPS = {"ReduceMean", "LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization", "Sqrt",
            "Reciprocal"}  # a norm (exported whole or decomposed)
MASK_FLOOR = -1e4  # an additive mask entry at or below this removes the key: exp() of it is 0 in float32


def rope_rows(lin: Linear, head_dim: int, rotary_dims: int, interleaved: bool, gain: float) -> Linear:
    """q or k's projection with RoPE's layout and gain folded into its rows: an interleaved head's rotated dims
    (pairs (2i, 2i + 1)) reordered to rotate-half's pairs (i, i + r/2), which leaves q . k unchanged when q and k
    are reordered alike; and the rotated rows times the tables' gain g (YaRN: cos and sin times g rotate g x)."""
    if not interleaved and gain == 1.0:
        return lin
    order = np.concatenate((np.arange(0, rotary_dims, 2), np.arange(1, rotary_dims, 2), np.arange(rotary_dims, head_dim))) \
        if interleaved else np.arange(head_dim)
    scale = np.where(np.arange(head_dim) < rotary_dims, gain, 1.0)
    heads = lin.weight.shape[0] // head_dim
    rows = np.concatenate([h * head_dim + order for h in range(heads)])
    scale = np.tile(scale, heads)
    return Linear(f32_array(lin.weight[rows].astype(np.float64) * scale[:, None]),
                  None if lin.bias is None else f32_array(lin.bias[rows].astype(np.float64) * scale))


def rope_gains(norm: Norm, head_dim: int, rotary_dims: int, interleaved: bool, gain: float) -> Norm:
    """A per-head q/k norm's gain with RoPE's layout and gain folded in, as rope_rows folds them into q's and k's
    rows where no norm lies between (the norm would undo a factor on its input): reordered alike, the rotated dims
    times the tables' gain."""
    order = np.concatenate((np.arange(0, rotary_dims, 2), np.arange(1, rotary_dims, 2), np.arange(rotary_dims, head_dim))) \
        if interleaved else np.arange(head_dim)
    scale = np.where(np.arange(head_dim) < rotary_dims, gain, 1.0)
    return Norm(f32_array(norm.weight[order].astype(np.float64) * scale))


class SublayerReader(AlibiReader):
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
        elif len(inputs) == 1:  # fused qkv (GPT-2's c_attn, GPT-NeoX's per-head qkv, Phi-3's qkv_proj): cut where
            lin, out = self.linear(inputs[0])  # its Split or its Slices cut
            pieces = self.fused_pieces(out)
            if len(pieces) != 3:
                raise self.fail(inputs[0], f"a fused qkv projection must be cut into three (by a Split or by Slices), "
                                           f"found {len(pieces)} pieces")
            for piece, rows in pieces:
                parts[role(piece)] = Linear(f32_array(lin.weight[rows]), None if lin.bias is None else f32_array(lin.bias[rows]))
                outs[role(piece)] = piece
        if sorted(parts) != ["k", "q", "v"]:
            raise self.fail(inputs[0], f"could not tell q, k and v apart among {len(inputs)} projections "
                                       "(expected q reaching the scores' left operand, k the right, v neither)")
        head_dim = view.shape(score_mm.input[0])[-1]
        heads, qk_eps = self.head_norms(outs, score_mm, head_dim)  # per-head q/k norms (Qwen3, Gemma 3), or {}
        normed = {part: heads[part][1] if heads else outs[part] for part in ("q", "k")}  # what RoPE and the scale read
        self.refuse_unmapped(normed, score_mm)
        cap = self.score_cap(normed, score_mm, softmax)  # Gemma 2's attention soft-cap, or None
        o, o_out = self.linear(outputs[0])
        post, post_eps, out_scale = self.post_norm(o_out, end, d_model, "attention")  # Gemma 2 and 3's, or none
        o = self.scaled(o, out_scale)  # Granite's residual multiplier: folded into o
        rope = self.rope(nodes, score_mm, head_dim)
        alibi, bias = self.alibi(score_mm, softmax, parts["q"].weight.shape[0] // head_dim)
        q_norm, k_norm = (heads[part][0] if heads else None for part in ("q", "k"))
        if rope is not None:
            for name in ("q", "k"):  # behind a head norm the tables' gain scales the norm's output: its gain takes it
                parts[name] = rope_rows(parts[name], head_dim, rope["rotary_dims"], rope["interleaved"],
                                        1.0 if heads else rope["gain"])
            if heads:
                q_norm, k_norm = (rope_gains(n, head_dim, rope["rotary_dims"], rope["interleaved"], rope["gain"])
                                  for n in (q_norm, k_norm))
        scale = self.score_scale(normed, score_mm, softmax)
        factor = scale * np.sqrt(head_dim)  # the float forward divides by sqrt(head_dim): q carries the rest
        if abs(factor - 1) > 1e-5 and heads:  # behind q's head norm: into its gain (a factor before it would cancel)
            q_norm = Norm(f32_array(q_norm.weight.astype(np.float64) * factor))
        elif abs(factor - 1) > 1e-5:
            q = parts["q"]
            parts["q"] = Linear(f32_array(q.weight.astype(np.float64) * factor),
                                None if q.bias is None else f32_array(q.bias.astype(np.float64) * factor))
        return dict(norm=norm, kind=kind, eps=eps, head_dim=head_dim, rope=rope, o=o, out_scale=out_scale,
                    normed=first_in, score_scale=scale, mask=self.mask(score_mm, softmax, bias), softmax=softmax,
                    alibi=alibi, q_norm=q_norm, k_norm=k_norm, qk_eps=qk_eps, post=post, post_eps=post_eps, cap=cap,
                    **parts)

    def head_norms(self, outs: dict[str, str], score_mm: onnx.NodeProto,
                   head_dim: int) -> tuple[dict[str, tuple[Norm, str]], float | None]:
        """The per-head RMSNorms of q and k between their projections and the scores (Qwen3, Gemma 3): per part,
        (its gain, the value that carries its output), and their epsilon; ({}, None) when neither has one. Read by
        data flow: a ReduceMean on the way, over the last axis of head_dim elements, the Mul of its input by the
        reciprocal square root, then (through Casts) the Mul by a constant of head_dim gains. A norm of only one
        of them, a LayerNorm, or one over all heads together (OLMo-2's) is refused by name."""
        view = self.view
        found: dict[str, tuple[Norm, str]] = {}
        epss = set()
        for part, operand in (("q", score_mm.input[0]), ("k", score_mm.input[1])):
            path = view.nodes_between({outs[part]}, operand)
            mean = next((n for n in path if n.op_type in NORM_OPS), None)
            if mean is None:
                continue
            what = f"a norm of {part} before the scores"
            if mean.op_type != "ReduceMean":
                raise self.fail(mean, f"{what} as one {mean.op_type} op is not supported; supported: a per-head "
                                      "RMSNorm spelled out (ReduceMean of the squares, Sqrt, Reciprocal: Qwen3, Gemma 3)")
            width = view.shape(mean.input[0])[-1]
            if width != head_dim:
                raise self.fail(mean, f"{what} over {width} elements, not one head's {head_dim} (OLMo-2 normalises all "
                                      "heads of q and k together) is not supported; supported: a per-head q/k norm "
                                      "(Qwen3, Gemma 3)")
            after = view.descendants([mean.output[0]])
            scaling = next((n for n in path if n.op_type == "Mul" and len(view.dynamic_inputs(n)) == 2
                            and sum(i in after for i in n.input) == 1), None)  # x * rsqrt(mean(x^2) + eps)
            if scaling is None:
                raise self.fail(mean, f"{what}: no product of its input by the reciprocal square root of the mean")
            end = scaling.output[0]
            while len(view.consumers[end]) == 1:  # Casts, then the gain
                node = view.consumers[end][0]
                static = view.static_inputs(node)
                gain = node.op_type == "Mul" and len(static) == 1 and view.value(static[0]).size == head_dim
                if node.op_type != "Cast" and not gain:
                    break
                end = node.output[0]
                if gain:
                    break
            norm, kind, eps = self.norm(outs[part], end, head_dim, mean)
            if kind != "rms" or norm.bias is not None:
                raise self.fail(mean, f"{what} that centres or adds a bias (a LayerNorm of each head) is not "
                                      "supported; supported: a per-head RMSNorm (Qwen3, Gemma 3)")
            found[part] = (norm, end)
            epss.add(eps)
        if len(found) == 1:
            (part, (_, end)), = found.items()
            raise self.fail(view.producer[end], f"a norm of {part} before the scores without one of "
                                                f"{'k' if part == 'q' else 'q'} is not supported; supported: a per-head "
                                                "norm of both (Qwen3, Gemma 3)")
        if len(epss) > 1:
            raise self.fail(score_mm, f"the norms of q and k have different epsilons ({sorted(epss)})")
        return found, (epss.pop() if epss else None)

    def refuse_unmapped(self, outs: dict[str, str], score_mm: onnx.NodeProto) -> None:
        """Refuse, by name, what attention may hold that the IR has no field for: a second norm on q or k (after the
        per-head norm head_norms read: OUTS are their outputs)."""
        view = self.view
        for part, operand in (("q", score_mm.input[0]), ("k", score_mm.input[1])):
            norm = next((n for n in view.nodes_between({outs[part]}, operand) if n.op_type in NORM_OPS), None)
            if norm is not None:
                raise self.fail(norm, f"a second norm of {part} before the scores is not supported; supported: one "
                                      "per-head q/k norm (Qwen3, Gemma 3)")

    def score_cap(self, outs: dict[str, str], score_mm: onnx.NodeProto, softmax: onnx.NodeProto) -> float | None:
        """Gemma 2's attention soft-cap, c * tanh(s / c) of the scaled scores s before the softmax, or None: c is the
        product of the constant scalars after the Tanh; those before it (q's, k's and the scores') must be the score
        scale over c, so that the scalars all together are the score scale (score_scale folds it as for any model)."""
        view = self.view
        tanhs = [n for n in view.nodes_between({score_mm.output[0]}, softmax.input[0]) if n.op_type == "Tanh"]
        if not tanhs:
            return None
        if len(tanhs) > 1:
            raise self.fail(tanhs[1], "a second tanh of the scores is not supported; supported: one attention "
                                      "soft-cap c * tanh(s / c) (Gemma 2)")
        cap = self.scale_between(tanhs[0].output[0], softmax.input[0])
        before = self.score_scale(outs, score_mm, softmax) / cap
        if cap <= 0 or before <= 0:
            raise self.fail(tanhs[0], f"an attention soft-cap c * tanh(b * q.k) with b = {before:g}, c = {cap:g} is "
                                      "not supported; supported: b and c positive (then it is increasing)")
        return cap

    def post_norm(self, out: str, end: onnx.NodeProto, d_model: int,
                  sublayer: str) -> tuple[Norm | None, float | None, float]:
        """The norm between a sublayer's output projection (its value OUT) and the residual Add END, if any (Gemma 2
        and 3 norm the attention's and the MLP's outputs: the "sandwich" norms), and the constant scalars on the way:
        -> (its gain or None, its epsilon, the scale to fold into the projection when there is no norm). An RMSNorm
        only, with no scalar beside it (one before it the norm would undo, one after it would belong in the gain:
        neither family has one, so neither is guessed)."""
        view = self.view
        nodes = view.nodes_between({out}, end.output[0])
        first = next((n for n in nodes if n.op_type in NORM_OPS), None)
        if first is None:
            return None, None, self.scale_between(out, end.output[0])
        reach = view.descendants([out]) | {out}
        added = next(i for i in end.input if i in reach)  # what the Add adds: the normed output
        norm, kind, eps = self.norm(out, added, d_model, first)
        what = f"a norm of the {sublayer}'s output before the residual Add (a post-sublayer norm: Gemma 2, Gemma 3)"
        if kind != "rms" or norm.bias is not None:
            raise self.fail(first, f"{what} that centres or adds a bias (a LayerNorm) is not supported; supported: an "
                                   "RMSNorm")
        scale = self.scale_between(out, end.output[0])
        if scale != 1.0:
            raise self.fail(first, f"{what} with a constant factor {scale:g} beside it is not supported")
        return norm, eps, 1.0

    def fused_pieces(self, out: str, strict: bool = True) -> list[tuple[str, np.ndarray]]:
        """(piece, its projection rows) for each piece that a Split, a Slice or a Gather of constant indices (BLOOM)
        cuts from the fused projection's output OUT, after any reshapes and transposes: found by carrying each
        element's index (token * rows + row) of OUT through them; rows in the order of the piece's elements (heads,
        then dims). Every row must land in exactly one piece. Another op on the way is refused, or (not STRICT: an
        MLP's up projection) means no cut."""
        view = self.view
        value = view.value(out)
        rows = value.shape[-1]
        stack, cut = [(out, np.arange(value.size).reshape(value.shape))], []
        while stack:
            name, index = stack.pop()
            for node in view.consumers[name]:
                if node.op_type == "Split":
                    axis = int(attribute(node, "axis", 0))
                    bounds = np.cumsum([view.shape(piece)[axis] for piece in node.output])[:-1]
                    cut.extend(zip(node.output, np.split(index, bounds, axis=axis), strict=True))
                elif node.op_type == "Slice" and all(view.is_static(i) for i in node.input[1:] if i):
                    starts, ends = view.value(node.input[1]), view.value(node.input[2])
                    axes = view.value(node.input[3]) if len(node.input) > 3 and node.input[3] else range(len(starts))
                    steps = view.value(node.input[4]) if len(node.input) > 4 and node.input[4] else [1] * len(starts)
                    where = [slice(None)] * index.ndim
                    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
                        where[int(axis) % index.ndim] = slice(int(start), int(end), int(step))
                    cut.append((node.output[0], index[tuple(where)]))
                elif node.op_type == "Gather" and node.input[0] == name and view.is_static(node.input[1]):
                    axis = int(attribute(node, "axis", 0))  # BLOOM selects q, k, v of each head: fused[..., i, :]
                    cut.append((node.output[0], np.take(index, view.value(node.input[1]), axis=axis)))
                elif node.op_type in LAYOUT_OPS and len(view.dynamic_inputs(node)) == 1:
                    moved = np.transpose(index, attribute(node, "perm", None)) if node.op_type == "Transpose" \
                        else index.reshape(view.shape(node.output[0]))
                    stack.append((node.output[0], moved))
                elif not strict:
                    return []
                else:
                    raise self.fail(node, "only reshapes and transposes may lie between a fused projection and the "
                                          "Split or Slices that cut it")
        pieces = []
        for piece, part in cut:
            flat = part.reshape(-1)
            pieces.append((piece, flat[flat // rows == 0] % rows))  # the first token's elements
        if pieces and not np.array_equal(np.sort(np.concatenate([r for _, r in pieces])), np.arange(rows)):
            raise self.fail(view.producer[out], "the pieces cut from a fused projection do not take each of its rows "
                                                "once")
        return pieces

    def score_scale(self, outs: dict[str, str], score_mm: onnx.NodeProto, softmax: onnx.NodeProto) -> float:
        """The product of the constant scalars that multiply q, k or the scores before the softmax."""
        view = self.view
        nodes = {id(n): n for start, end in ((outs["q"], score_mm.input[0]), (outs["k"], score_mm.input[1]),
                                             (score_mm.output[0], softmax.input[0]))
                 for n in view.nodes_between({start}, end)}
        scale = 1.0
        for node in nodes.values():
            factor = self.scalar(node)
            scale *= 1.0 if factor is None else factor
        return scale

    def mask(self, score_mm: onnx.NodeProto, softmax: onnx.NodeProto,
             alibi: str | None = None) -> list[tuple[str, str, bool]]:
        """The masks between the scores and the softmax: (op, constant's name, whether the scores are Where's X); the
        ALiBi bias (its constant ALIBI) is not one."""
        view = self.view
        found = []
        for node in view.nodes_between({score_mm.output[0]}, softmax.input[0]):
            static = [i for i in view.static_inputs(node) if view.value(i).size > 1 and i != alibi]
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

    def rope(self, nodes: list[onnx.NodeProto], score_mm: onnx.NodeProto, head_dim: int) -> dict | None:
        """RoPE from the cos/sin tables multiplied into q, or None when q is not rotated: dict(theta, rotary_dims,
        freqs, interleaved, gain). Partial rotary (GPT-NeoX, Phi, GPT-J) rotates the first dims of each head, with
        tables that wide. The angle per position of each pair is read from the tables, whatever schedule made it
        (Llama 3, linear, YaRN): freqs is None when it is base^(-2i/dims), else the frequencies (the graph's own
        constant where one holds them). Interleaved tables (GPT-J, Cohere: pairs (2i, 2i + 1)) and tables scaled
        by an attention factor (YaRN: cos and sin times g) are read too; attention() folds both into q and k."""
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
                    tables.append((name, value.reshape(-1, width).astype(np.float64)))
        if not tables:
            return None
        if len({t.shape[1] for _, t in tables}) != 1:
            raise self.fail(score_mm, "q is multiplied by position tables of different widths")
        rd = tables[0][1].shape[1]  # the rotated dims: all of a head's, or its first ones
        cos = next((t for _, t in tables if t[0, 0] > 0 and np.allclose(t[0], t[0, 0], rtol=1e-6)), None)
        gain = 1.0 if cos is None else float(cos[0, 0])  # cos at position 0: 1, or YaRN's attention factor
        sin_name, sin = next(((n, t) for n, t in tables if np.allclose(t[0], 0.0)), (None, None))
        if cos is None or sin is None or len(cos) < 2:
            raise self.fail(score_mm, "q is multiplied by position tables that are not RoPE cos/sin tables")
        half = rd // 2
        if np.allclose(cos[:, :half], cos[:, half:], atol=1e-6) and np.allclose(sin[:, :half], sin[:, half:], atol=1e-6):
            interleaved, c, s = False, cos[:, :half], sin[:, :half]
        elif np.allclose(cos[:, 0::2], cos[:, 1::2], atol=1e-6) and np.allclose(sin[:, 0::2], sin[:, 1::2], atol=1e-6):
            interleaved, c, s = True, cos[:, 0::2], sin[:, 0::2]
        else:
            raise self.fail(score_mm, "RoPE tables pair a head's dims neither as (i, i + d/2) (rotate-half) nor as "
                                      "(2i, 2i + 1) (interleaved)")
        if not np.allclose(np.hypot(c, s), gain, rtol=1e-5):
            raise self.fail(score_mm, "RoPE cos/sin tables whose amplitude varies with the position or the pair "
                                      "(a rotation scales every pair alike)")
        last = len(c) - 1
        coarse = np.arctan2(s[1], c[1])  # angle per position step, within (-pi, pi]
        turns = np.round((last * coarse - np.arctan2(s[last], c[last])) / (2 * np.pi))
        freqs = (np.arctan2(s[last], c[last]) + 2 * np.pi * turns) / last  # refined over the probe's positions
        freqs = self.graph_constant(sin_name, freqs)
        p = np.arange(len(c))[:, None]
        if not (np.allclose(c, gain * np.cos(p * freqs), atol=2e-5 * gain)
                and np.allclose(s, gain * np.sin(p * freqs), atol=2e-5 * gain)):
            raise self.fail(score_mm, "RoPE tables whose angles do not grow linearly with the position (a frequency "
                                      "per pair); supported: any fixed frequency per pair")
        # the base pair 1 implies: the model's where the schedule keeps the fast pairs (Llama 3, YaRN on real head
        # widths), only a label where freqs says otherwise
        theta = float(freqs[1] ** (-rd / 2)) if half > 1 and freqs[1] > 0 else 10000.0
        nearest = round(theta)
        theta = float(nearest) if abs(theta - nearest) < 1e-4 * theta else theta
        formula = half > 1 and np.allclose(freqs, theta ** (-np.arange(half) * 2 / rd), rtol=1e-4)
        return dict(theta=theta, rotary_dims=rd, freqs=None if formula else tuple(float(f) for f in freqs),
                    interleaved=interleaved, gain=gain)

    def mlp(self, residual: str, end: onnx.NodeProto, d_model: int) -> dict:
        view = self.view
        nodes = view.nodes_between({residual}, end.output[0])
        projs = self.projections(nodes)
        if not projs:
            raise self.fail(end, "expected an MLP (projections) in the sublayer closed by this residual Add")
        first_in = projs[0].input[0]
        inputs = [p for p in projs if p.input[0] == first_in]
        outputs = [p for p in projs if p.input[0] != first_in]
        fused = self.fused_pieces(self.linear(inputs[0])[1], strict=False) if len(inputs) == 1 else []
        if len(outputs) != 1 or len(inputs) not in (1, 2):
            raise self.fail(projs[-1], f"expected an MLP of up (and gate) then down projections, found "
                                       f"{len(inputs)} input and {len(outputs)} output projections")
        if len(fused) not in (0, 2):
            raise self.fail(inputs[0], f"a fused MLP projection must be cut in two (gate and up), found {len(fused)} "
                                       "pieces")
        norm, kind, eps = self.norm(residual, first_in, d_model, projs[0])
        ops = {n.op_type for n in nodes}
        gate = None
        if len(inputs) == 2 or fused:  # gate and up, or both in one projection cut in two (Phi-3's gate_up_proj)
            gelu = next((n for n in nodes if n.op_type == "Gelu"), None)
            if "Sigmoid" in ops:
                activation: Activation = "silu_glu"
            elif "Tanh" in ops or (gelu is not None and attribute(gelu, "approximate", b"none") in (b"tanh", "tanh")):
                activation = "gelu_tanh_glu"
            else:
                raise self.fail(inputs[0], "a gated MLP is supported with SiLU (SwiGLU) or GELU-tanh (GeGLU) only")
            if fused:
                lin = self.linear(inputs[0])[0]
                outs = [(Linear(f32_array(lin.weight[rows]), None if lin.bias is None else f32_array(lin.bias[rows])),
                         piece) for piece, rows in fused]
            else:
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
        down, down_out = self.linear(outputs[0])
        post, post_eps, out_scale = self.post_norm(down_out, end, d_model, "MLP")  # Gemma 2 and 3's, or none
        return dict(norm=norm, kind=kind, eps=eps, up=up, gate=gate, down=self.scaled(down, out_scale),
                    activation=activation, normed=first_in, out_scale=out_scale, post=post, post_eps=post_eps)

