"""A chain of boards as one circuit, for simulation: each board's decoder, and the links between them.

Board k runs its stage of the model (quant/chain.py) and passes the residual, an int16 element a
cycle, to board k + 1 through a link: 17 wires (the element and the new-sequence flag) with
valid and ready, registered where it leaves one board and where it enters the next
(LINK_STAGES skid buffers). The first board takes the tokens and checks them (out of range, past
the context); the last gives the next token. The chain has the single decoder's ports and status,
so the cocotb testbench and `hardwire sim` run it unchanged. What is not modelled: the boards'
separate clocks (the link would cross clock domains through a small FIFO on each receiving board).
"""

from __future__ import annotations

from itertools import pairwise

from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring

from ..quant.qmodel import QModel
from .decoder import Decoder, residual_layout
from .plan import HardwarePlan, cycles_per_token_estimate
from .skid_buffer import LATENCY as SKID_LATENCY
from .skid_buffer import SkidBuffer

LINK_STAGES = 2  # registers on a link: one where the residual leaves a board, one where it enters the next
LINK_LATENCY = LINK_STAGES * SKID_LATENCY
HOP_CYCLES = LINK_LATENCY + 1  # a hop beyond the residual's elements: the link's registers, the receiver's hand-over


def chain_cycles(stages: list[QModel], plan: HardwarePlan, position: int) -> int:
    """Cycles of one token through the chain, from the first board taking it to the last giving the next: each
    board's schedule, one after another (a token waits for the one before it), and each link's registers plus the
    cycle the receiving board takes to see the first element."""
    return sum(cycles_per_token_estimate(qm, plan, position) for qm in stages) + (len(stages) - 1) * HOP_CYCLES


class Chain(wiring.Component):
    """The boards of `stages` (stage models of one QModel, in order) with the same engine shape each, linked."""

    def __init__(self, stages: list[QModel], **shape: object) -> None:
        if len(stages) < 2 or any(qm.stage is None for qm in stages):
            raise ValueError("a chain takes two or more stage models (quant.chain.stages)")
        if any(qm.lora.rank and qm.lora.sites for qm in stages):
            raise ValueError("a chain does not load LoRA adapters (its lora port is closed): quantise without LoRA "
                             "slots (LoraSpec(rank=0, sites=()))")
        self.boards = [Decoder(qm, **shape) for qm in stages]
        first, last = self.boards[0], self.boards[-1]
        members = first.signature.members
        super().__init__({"tokens": members["tokens"], "out": last.signature.members["out"],
                          "status": members["status"], "lora": members["lora"]})

    def elaborate(self, platform: object) -> Elaboratable:
        m = Module()
        for k, board in enumerate(self.boards):
            m.submodules[f"board{k}"] = board
        first, last = self.boards[0], self.boards[-1]
        wiring.connect(m, wiring.flipped(self.tokens), first.tokens)
        wiring.connect(m, last.out, wiring.flipped(self.out))
        in_flight = []
        for k, (sender, receiver) in enumerate(pairwise(self.boards)):
            port = sender.resid_out
            for stage in range(LINK_STAGES):
                m.submodules[f"link{k}_{stage}"] = reg = SkidBuffer(residual_layout())
                wiring.connect(m, port, reg.i)
                port = reg.o
                in_flight.append(reg.o.valid)
            wiring.connect(m, port, receiver.resid_in)
        # the chain's status: the first board's flags and position, the last board's tokens, busy while any board
        # works or a residual is on a link (the first board is idle again before the last one has started)
        busy = 0
        for flag in [board.status.busy for board in self.boards] + in_flight:
            busy = busy | flag
        m.d.comb += [self.status.eq(first.status), self.status.tokens.eq(last.status.tokens), self.status.busy.eq(busy)]
        m.d.comb += self.lora.ready.eq(0)  # adapters are not loaded into a chain (cli compile --boards drops them)
        return m
