"""Recovering a ModelIR from the dynamic part of an exported graph.

The pass walks the residual stream: token embedding (plus a learned position table),
then residual Adds, each closing a sublayer. A sublayer with a Softmax is attention,
one without is the MLP; inside each, projections are MatMul/Gemm nodes with a constant
operand, and their roles follow from data flow (which one reaches the scores, which
one feeds an activation), not from names, which exporters do not keep. Whatever cannot
be placed raises ModelImportError naming the node. The result is a hypothesis that
proof.py then checks numerically against onnxruntime.

This file walks the stream and assembles the model; recover_sublayers.py reads attention and
the MLP, from the projections and norms that recover_reader.py reads.
"""

from __future__ import annotations

import numpy as np
import onnx

from .errors import ModelImportError
from .graph import GraphView
from .ir import Layer, Linear, ModelConfig, ModelIR, Norm
from .recover_reader import LAYOUT_OPS, attribute, f32_array
from .recover_sublayers import SublayerReader

MASK_LENGTH = 2048  # where a RoPE graph states no context, attention masks are read at this length


def _f32_scalar(value: float) -> float:
    """The shortest decimal that is the same float32 (graphs store 1e-5 as 9.99999974e-06)."""
    return float(np.format_float_positional(np.float32(value), unique=True))


class _Recovery(SublayerReader):
    """The whole model: the embedding, the residual stream's blocks (sequential or parallel), the head."""

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
            elif node.op_type in LAYOUT_OPS and view.shape(node.output[0])[-1:] == table.shape[1:]:
                stream = node.output[0]
            elif node.op_type == "LayerNormalization" and all(view.is_static(i) for i in node.input[1:] if i):
                table = self.embedding_norm(node, table * scale)  # BLOOM's word_embeddings_layernorm
                scale, stream = 1.0, node.output[0]
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

    def embedding_norm(self, node: onnx.NodeProto, table: np.ndarray) -> np.ndarray:
        """TABLE's rows through the LayerNorm NODE of the embedding (BLOOM): a function of the token alone when no
        position is added before it, so it folds into the table, exactly, and the chip needs no norm for it."""
        if int(attribute(node, "axis", -1)) not in (-1, len(self.view.shape(node.input[0])) - 1):
            raise self.fail(node, "a LayerNormalization of the embedding must normalise the last axis")
        weight = self.view.value(node.input[1]).astype(np.float64)
        bias = self.view.value(node.input[2]).astype(np.float64) if len(node.input) > 2 and node.input[2] else 0.0
        eps = float(attribute(node, "epsilon", 1e-5))
        centred = table - table.mean(-1, keepdims=True)
        normed = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * weight + bias
        self.folded.append("LayerNorm of the embedding (into the table; the head keeps the unnormed table)")
        return normed

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
                if len(only) == 1 and only[0].op_type in LAYOUT_OPS and len(view.dynamic_inputs(only[0])) == 1 \
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

    def head(self, stream: str, d_model: int) -> tuple[Norm, str, float, Linear, float | None]:
        """The final norm and the head, with the constant scalars between the head and the logits folded in, and
        the logit soft-cap (Gemma 2: cap * tanh(z / cap)) if a Tanh lies on the way: -> (..., head, cap or None). The
        head then gives z, whatever scalars the graph spreads before and after the Tanh (c * tanh(b * raw) is
        c * tanh(z / c) with z = b c raw)."""
        view = self.view
        reach = view.descendants([stream])
        projs = [n for n in view.nodes if n.output[0] in reach and self.is_projection(n)]
        if len(projs) != 1:
            raise ModelImportError(f"{self.where}: expected one output projection (the LM head) after the last block, "
                                   f"found {len(projs)}")
        norm, kind, eps = self.norm(stream, projs[0].input[0], d_model, projs[0])
        head, out = self.linear(projs[0])
        logits = view.proto.graph.output[0].name
        scale = self.scale_between(out, logits) if logits in view.descendants([out]) else 1.0
        tanhs = [n for n in view.nodes_between({out}, logits) if n.op_type == "Tanh"]
        cap = None
        if len(tanhs) > 1:
            raise self.fail(tanhs[1], "a second tanh of the logits is not supported; supported: one logit soft-cap "
                                      "c * tanh(z / c) (Gemma 2)")
        if tanhs:
            before = self.scale_between(out, tanhs[0].input[0])
            cap = self.scale_between(tanhs[0].output[0], logits)
            if before <= 0 or cap <= 0:
                raise self.fail(tanhs[0], f"a logit soft-cap c * tanh(b * z) with b = {before:g}, c = {cap:g} is not "
                                          "supported; supported: b and c positive (then it is increasing in z)")
            scale = before * cap  # the head gives z = b c raw; the logits are c * tanh(z / c)
        if abs(scale - 1.0) > 1e-6:  # Granite divides the logits by logits_scaling, Cohere multiplies by logit_scale
            self.folded.append(f"logits scale {_f32_scalar(scale):g} (the head's weights times it)")
        else:
            scale = 1.0  # Gemma 2's Div by the cap and Mul by it again
        return norm, kind, eps, self.scaled(head, scale), None if cap is None else _f32_scalar(cap)

    def fold_per_layer(self, factors: list, text: str, folded, skip=lambda i: False) -> None:
        """Record in self.folded each distinct factor (per layer) that FOLDED says was folded, naming its layers
        where not every layer has it."""
        by_factor: dict[object, list[int]] = {}
        for i, factor in enumerate(factors):
            if folded(factor) and not skip(i):
                by_factor.setdefault(factor, []).append(i)
        for factor, where in by_factor.items():
            value = _f32_scalar(factor[0] if isinstance(factor, tuple) else factor)
            which = "" if len(where) == len(factors) else f" in layer{'s' if len(where) > 1 else ''} " \
                f"{', '.join(map(str, where))}"
            self.folded.append(text.format(value) + which)

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
            other = next(x for x in add_mlp.input if x != r_mlp)
            reads = self.view.ancestors(other, stop={r_attn, r_mlp})
            if r_mlp not in reads and r_attn in reads:  # (x + attn(x)) + mlp(x): a parallel block in two Adds (Cohere)
                blocks.append((self.attention(r_attn, add_attn, d_model),
                               self.mlp(r_attn, self.view.producer[other], d_model), True))
                i += 2
                continue
            blocks.append((self.attention(r_attn, add_attn, d_model), self.mlp(r_mlp, add_mlp, d_model), False))
            i += 2
        if not blocks or i != len(steps):
            where = self.fail(steps[-1][1], "") if steps else None
            raise ModelImportError(f"{self.where}: found {len(steps)} residual Adds after the embedding; a decoder "
                                   "needs an attention and an MLP sublayer per block (or one Add of both, for "
                                   "parallel blocks)" + (f" ({where})" if where else ""))
        layers, kinds, epss, rope_thetas, activations, head_dims = [], set(), set(), set(), set(), set()
        layouts, rotary, schedules, qk_norms, alibis, post_norms, caps = set(), set(), set(), set(), set(), set(), set()
        windows = self.windows([att for att, _, _ in blocks], context or (None if positions is None else len(positions)))
        for att, mlp, parallel in blocks:
            shared = parallel and att["normed"] == mlp["normed"]  # Phi: one norm feeds both sublayers
            layouts.add((parallel, shared))
            kinds |= {att["kind"], mlp["kind"]}
            epss |= {att["eps"], mlp["eps"]}
            rope = att["rope"] or {}
            rope_thetas.add(rope.get("theta"))
            rotary.add(rope.get("rotary_dims"))
            schedules.add((rope.get("freqs"), rope.get("interleaved"), rope.get("gain")))
            activations.add(mlp["activation"])
            head_dims.add(att["head_dim"])
            qk_norms.add(att["q_norm"] is not None)
            alibis.add(att["alibi"])
            if att["qk_eps"] is not None:  # the per-head q/k norms: one epsilon with the model's other norms
                epss.add(att["qk_eps"])
            epss |= {e for e in (att["post_eps"], mlp["post_eps"]) if e is not None}
            posts = (att["post"] is not None, mlp["post"] is not None)
            if posts[0] != posts[1] or (parallel and any(posts)):
                node = att["softmax"]
                raise self.fail(node, "a norm of one sublayer's output without one of the other's, or in a parallel "
                                      "block, is not supported; supported: post-sublayer norms of both sublayers of a "
                                      "sequential block (Gemma 2, Gemma 3)")
            post_norms.add(posts[0])
            caps.add(None if att["cap"] is None else _f32_scalar(att["cap"]))
            layers.append(Layer(attn_norm=att["norm"], q=att["q"], k=att["k"], v=att["v"], o=att["o"],
                                mlp_norm=att["norm"] if shared else mlp["norm"], up=mlp["up"], down=mlp["down"],
                                gate=mlp["gate"], q_norm=att["q_norm"], k_norm=att["k_norm"],
                                post_attn_norm=att["post"], post_mlp_norm=mlp["post"]))
        final_norm, kind, eps, head, logit_cap = self.head(steps[-1][1].output[0], d_model)
        kinds.add(kind)
        epss.add(eps)
        for what, seen in (("norm kinds", kinds), ("norm epsilons", epss), ("RoPE bases", rope_thetas),
                           ("activations", activations), ("head widths", head_dims), ("rotary widths", rotary),
                           ("RoPE schedules (frequencies, layout, gain)", schedules),
                           ("block layouts (parallel, shared norm)", layouts), ("per-head q/k norms", qk_norms),
                           ("ALiBi slopes", alibis),
                           ("post-sublayer norms", post_norms), ("attention soft-caps", caps)):
            if len(seen) != 1:
                raise ModelImportError(f"{self.where}: layers differ in {what} ({sorted(map(str, seen))}); "
                                       "hardwire needs one value for the whole model")
        head_dim = head_dims.pop()
        rope_theta = rope_thetas.pop()
        rotary_dims = rotary.pop()
        parallel, shared = layouts.pop()
        rope_freqs, interleaved, gain = schedules.pop()
        if interleaved:
            self.folded.append("interleaved RoPE (pairs (2i, 2i + 1): q and k's rows reordered to rotate-half)")
        if gain is not None and gain != 1.0:
            rows = "q and k's norm gains" if next(iter(qk_norms)) else "q and k's rotated rows"
            self.folded.append(f"RoPE attention factor {gain:.6g} (cos and sin times it: {rows} times it)")
        alibi = alibis.pop()
        schemes = [name for name, there in (("RoPE", rope_theta is not None), ("a learned table", positions is not None),
                                            ("ALiBi", alibi is not None)) if there]
        if len(schemes) != 1:
            raise ModelImportError(f"{self.where}: expected exactly one positional scheme (RoPE, a learned table or "
                                   f"ALiBi), found {' and '.join(schemes) or 'none'}")
        self.fold_per_layer([(att["out_scale"], mlp["out_scale"]) for att, mlp, _ in blocks],
                            "residual multiplier {:g} (o's and down's weights times it)",
                            lambda f: f[0] == f[1] and f[0] != 1.0)
        for part, which in ((0, "attention"), (1, "MLP")):  # the two sublayers scaled differently
            self.fold_per_layer([(att["out_scale"], mlp["out_scale"])[part] for att, mlp, _ in blocks],
                                f"{which} output scale {{:g}} ({'o' if part == 0 else 'down'}'s weights times it)",
                                lambda f: f != 1.0, skip=lambda i: blocks[i][0]["out_scale"] == blocks[i][1]["out_scale"])
        by_factor: dict[float, list[int]] = {}  # q's extra factor (the scale times sqrt(head_dim)) -> layers
        for i, (att, _, _) in enumerate(blocks):
            factor = float(np.float32(att["score_scale"] * np.sqrt(head_dim)))
            if abs(factor - 1) > 1e-5:
                by_factor.setdefault(factor, []).append(i)
        for factor, where in by_factor.items():
            which = "" if len(where) == len(blocks) else f" in layer{'s' if len(where) > 1 else ''} " \
                f"{', '.join(map(str, where))}"
            into = "q's norm gain" if blocks[where[0]][0]["q_norm"] is not None else "q's weights"
            self.folded.append(f"score scale {factor / np.sqrt(head_dim):g} instead of 1/sqrt(head_dim){which} "
                               f"({into} times {factor:g})")
        first = layers[0]
        tied = head.weight.shape == embed.shape and np.array_equal(head.weight, embed)
        config = ModelConfig(
            vocab_size=embed.shape[0], d_model=d_model, n_layers=len(layers),
            n_heads=first.q.shape[0] // head_dim, n_kv_heads=first.k.shape[0] // head_dim, head_dim=head_dim,
            ffn=first.up.shape[0], context=context if context is not None else
            (positions.shape[0] if positions is not None else None),
            norm=kinds.pop(), norm_eps=_f32_scalar(epss.pop()), activation=activations.pop(),
            positions="rope" if rope_theta is not None else "learned" if positions is not None else "alibi",
            rope_theta=rope_theta, tied_head=tied, alibi_slopes=alibi,
            parallel_residual=parallel, shared_norm=shared,
            rotary_dims=rotary_dims if rotary_dims is not None and rotary_dims != head_dim else None,
            attn_windows=tuple(windows) if any(w is not None for w in windows) else None, rope_freqs=rope_freqs,
            qk_norm=qk_norms.pop(), post_norms=post_norms.pop(), attn_softcap=caps.pop(), logit_softcap=logit_cap,
            folded=tuple(self.folded))
        embed32 = f32_array(embed)
        return ModelIR(config=config, embed=embed32, layers=tuple(layers), final_norm=final_norm,
                       head=Linear(embed32, head.bias) if tied else head,
                       pos_embed=None if positions is None else f32_array(positions))


def recover(view: GraphView, context: int | None) -> ModelIR:
    """Place every part of the decoder found in VIEW; raise ModelImportError naming what does not fit."""
    return _Recovery(view).run(context)
