"""cocotb testbench for the generated Verilog: feed tokens, collect tokens, compare with the reference.

The runner (sim/runner.py) passes a JSON spec through HARDWIRE_SIM_SPEC: the token
sequence to feed, how many to generate, the reference tokens, the widths, a seed, and
where to write the result. Every generated token is compared with the reference one.
"""

from __future__ import annotations

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

STATUS_TOKENS, STATUS_CYCLES = (0, 32), (32, 64)  # bit ranges in the flattened status port (docs/hardware.md)


class DecoderTB:
    """Owns the clock, reset, the token-stream driver and the output monitor."""

    def __init__(self, dut: object, token_bits: int, seed: int, idle: float, stall: float) -> None:
        self.dut = dut
        self.token_bits = token_bits
        self.rng = random.Random(seed)
        self.idle, self.stall = idle, stall

    async def start(self) -> None:
        cocotb.start_soon(Clock(self.dut.clk, 10, unit="ns").start())
        self.dut.tokens__valid.value = 0
        self.dut.out__ready.value = 0
        self.dut.lora__valid.value = 0  # no LoRA writes: the zero adapters of reset
        self.dut.rst.value = 1
        for _ in range(3):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    def status(self, bits: tuple[int, int]) -> int:
        value = int(self.dut.status.value)
        return (value >> bits[0]) & ((1 << (bits[1] - bits[0])) - 1)

    async def feed(self, token: int, new_seq: bool) -> int:
        """Offer one token (after random idle cycles); return the output token (with random backpressure).

        Handshakes are sampled in the ReadOnly phase before the edge that completes them.
        """
        clk = self.dut.clk
        while self.rng.random() < self.idle:
            await RisingEdge(clk)
        self.dut.tokens__payload.value = token | (int(new_seq) << self.token_bits)
        self.dut.tokens__valid.value = 1
        while True:
            await ReadOnly()
            accepted = int(self.dut.tokens__ready.value)
            await RisingEdge(clk)
            if accepted:
                break
        self.dut.tokens__valid.value = 0
        while True:
            ready = self.rng.random() >= self.stall
            self.dut.out__ready.value = int(ready)
            await ReadOnly()
            valid, payload = int(self.dut.out__valid.value), int(self.dut.out__payload.value)
            await RisingEdge(clk)
            if ready and valid:
                self.dut.out__ready.value = 0
                return payload


@cocotb.test()
async def decode_matches_reference(dut: object) -> None:
    with open(os.environ["HARDWIRE_SIM_SPEC"]) as fh:
        spec = json.load(fh)
    tb = DecoderTB(dut, spec["token_bits"], spec["seed"], spec["idle"], spec["stall"])
    await tb.start()
    tokens: list[int] = []
    cycles: list[int] = []
    for index, token in enumerate(spec["prompt"]):
        before = tb.status(STATUS_CYCLES)
        out = await tb.feed(token, index == 0)
        cycles.append(tb.status(STATUS_CYCLES) - before)
        if index == len(spec["prompt"]) - 1:
            tokens.append(out)
    while len(tokens) < spec["n"]:
        before = tb.status(STATUS_CYCLES)
        tokens.append(await tb.feed(tokens[-1], False))
        cycles.append(tb.status(STATUS_CYCLES) - before)
    result = {"tokens": tokens, "reference_tokens": spec["reference_tokens"],
              "match": tokens == spec["reference_tokens"], "cycles": cycles,
              "decoded": tb.status(STATUS_TOKENS)}
    with open(spec["result"], "w") as fh:
        json.dump(result, fh)
    assert tokens == spec["reference_tokens"], f"tokens {tokens} != reference {spec['reference_tokens']}"
