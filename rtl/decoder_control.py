"""The token's registers, created before the stages: the schedule, built last, sets them, and the
epilogue and the RoPE driver read the layer, the head and the KV slot they select.
"""

from __future__ import annotations

from amaranth.hdl import Signal

from ..quant.qmodel import QModel
from .plan import layer_windows


class Control:
    """The token, position, layer and head registers, the status counters, the sticky error flags and the
    schedule's own counters. The constructor declares them; the schedule drives them."""

    def __init__(self, qm: QModel, token_bits: int) -> None:
        cfg = qm.config
        self.token = Signal(token_bits)
        self.position = Signal(range(qm.context + 1))
        # a windowed layer keeps K and V in a ring of w slots (position p in slot p mod w): a counter per window
        # that moves with the position, and the slot the running layer writes (set with layer_sel)
        self.windows = layer_windows(qm)
        self.ring = {w: Signal(range(max(2, w)), name=f"ring{w}")
                     for w in sorted({w for w in self.windows if w is not None})}
        self.kv_slot = Signal.like(self.position)
        # selectors keep at least one bit: a zero-width signal is written as [-1:0], which Verilog tools refuse
        self.layer_sel = Signal(range(max(2, cfg.n_layers)))  # also selects the softmax's and activations' site
        self.head = Signal(range(max(2, cfg.n_heads)))
        self.busy, self.context_full, self.bad_token = Signal(), Signal(), Signal()
        self.tokens_done, self.cycles = Signal(32), Signal(32)
        self.emb_i, self.emb_o = Signal(range(cfg.d_model + 1)), Signal(range(cfg.d_model + 1))  # embedding in, out
        self.out_token, self.token_ready = Signal(token_bits), Signal()  # the argmax's answer, until EMIT
