"""ALiBi read off the graph (BLOOM, MPT): a constant added to the scores that grows linearly with the key position,
one slope per head, in place of any position embedding.

The bias depends on the sequence length only, so the probe holds it as a constant, like a causal mask; it is told
from a mask by its values (finite, above the mask floor, varying along the keys) and read by data flow: whatever
node names the exporter gave it. Its slopes are taken exactly from the graph constant the bias is computed from where
one holds them (BLOOM's `slopes` tensor), else from the probe's values.
"""

from __future__ import annotations

import numpy as np
import onnx

from .recover_reader import GraphReader

MASK_FLOOR = -1e4  # an additive entry at or below this removes a key (recover_sublayers.MASK_FLOOR)
SLOPE_RTOL = 1e-5  # how closely every probed entry must follow slope_h * key (+ a constant per row)


class AlibiReader(GraphReader):
    """The ALiBi bias between the scores and the softmax, if any."""

    def alibi(self, score_mm: onnx.NodeProto, softmax: onnx.NodeProto, heads: int) -> tuple[tuple[float, ...] | None,
                                                                                              str | None]:
        """(slope per query head, the name of the bias constant) or (None, None) without ALiBi. The slope is the
        bias per key position after any factor between the Add and the softmax (a scale after the bias scales it
        too). A constant added to the scores that varies along the keys but not linearly, or not per head, is
        refused by name."""
        view = self.view
        found = []
        for node in view.nodes_between({score_mm.output[0]}, softmax.input[0]):
            static = [i for i in view.static_inputs(node) if view.value(i).size > 1]
            if node.op_type != "Add" or not static:
                continue
            value = view.value(static[0]).astype(np.float64)
            if not np.isfinite(value).all() or value.min() <= MASK_FLOOR:
                continue  # a mask (removes keys), read by SublayerReader.mask
            if np.ptp(value, axis=-1).max() == 0:
                continue  # the same for every key: a mask of zeros, nothing to the softmax
            found.append((node, static[0]))
        if not found:
            return None, None
        if len(found) > 1:
            raise self.fail(found[1][0], "a second bias on the scores that varies with the key position is not "
                                         "supported; supported: one ALiBi bias (BLOOM, MPT)")
        node, name = found[0]
        dynamic = view.dynamic_inputs(node)[0]
        scores = np.broadcast_to(view.value(name), np.broadcast_shapes(view.shape(name), view.shape(dynamic)))
        t_q, t_k = scores.shape[-2:]
        grid = scores.reshape(-1, t_q, t_k).astype(np.float64)  # (heads or 1, queries, keys) at the probe's batch 1
        if len(grid) not in (1, heads):
            raise self.fail(node, f"a bias on the scores with {len(grid)} rows of scores, not one per head ({heads}) "
                                  "or one for all heads: not ALiBi; supported: ALiBi (slope_h * key position)")
        rel = grid - grid[:, :, :1]  # the constant of each row does not reach the softmax
        keys = np.arange(t_k, dtype=np.float64)
        fitted = rel[:, 0, -1] / keys[-1]  # (heads,)
        if not np.allclose(rel, fitted[:, None, None] * keys, rtol=SLOPE_RTOL, atol=SLOPE_RTOL * np.abs(rel).max()):
            raise self.fail(node, "a bias on the scores that does not grow linearly with the key position (one slope "
                                  "per head, the same for every query) is not supported; supported: ALiBi (BLOOM, MPT)")
        slopes = self.graph_constant(name, fitted) * self.scale_between(node.output[0], softmax.input[0])
        return tuple(float(s) for s in np.broadcast_to(slopes, (heads,))), name
