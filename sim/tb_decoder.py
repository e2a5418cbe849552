"""cocotb testbench for the generated Verilog: feed tokens, collect tokens, compare with the reference.

The runner (sim/runner.py) passes a JSON spec through HARDWIRE_SIM_SPEC: a list of steps,
the widths, a seed for the random traffic, and where to write the result. Steps:
  {"kind": "generate", "prompt": [...], "n": N, "reference": [...]}: a new sequence; the output
      after every token fed (len(prompt) - 1 predictions inside the prompt, then the N generated
      tokens) is compared with the reference's;
  {"kind": "feed", "token": T, "new_seq": bool}: one token whose outcome (an output token,
      or none with the error flags) is recorded for the caller to judge;
  {"kind": "lora", "writes": [[addr, data], ...]}: writes through the LoRA host port.

Python wakes only around the handshakes: the clock is cocotb's GPI clock (toggled from C++),
and while the decoder works or a stream waits for ready the testbench sleeps on the signal's
rising edge, bounded by a Timer of `watchdog` cycles so that a hung design fails instead of
hanging. Random idle cycles and backpressure are drawn per cycle next to a handshake only,
cycle for cycle as a per-clock loop would (same seed, same records). On the bundled model
over 95% of the run time is the Verilated model's own evaluation (about 20-35k cycles/s on
the 2-core machine), not the testbench. After every token fed the testbench prints a progress line
(progress.sim_progress_line) into the simulator's output, which the runner reads from its log for the bar.
"""

from __future__ import annotations

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import First, ReadOnly, RisingEdge, Timer

from ..progress import sim_progress_line

# bit ranges in the flattened status port (docs/hardware.md)
STATUS_TOKENS, STATUS_CYCLES, STATUS_POSITION = (0, 32), (32, 64), (64, 80)
STATUS_BUSY, STATUS_CONTEXT_FULL, STATUS_BAD_TOKEN = (80, 81), (81, 82), (82, 83)


class DecoderTB:
    """Owns the clock, reset, the token-stream driver, the LoRA-port driver and the output monitor."""

    PERIOD_NS = 10

    def __init__(self, dut: object, token_bits: int, lora_addr_bits: int, seed: int, idle: float, stall: float,
                 watchdog: int) -> None:
        self.dut = dut
        self.token_bits, self.lora_addr_bits = token_bits, lora_addr_bits
        self.rng = random.Random(seed)
        self.idle, self.stall = idle, stall
        self.watchdog = watchdog  # cycles one token may take before the test fails instead of hanging
        self.fed, self.to_feed = 0, 0  # tokens through the decoder so far, and in the whole spec: the progress line

    async def start(self) -> None:
        # the GPI clock toggles from C++ (a Python clock task woke twice a cycle). Python woken by RisingEdge(clk)
        # now runs before the design evaluates that edge, so a status read there gives the count of the cycle
        # before: differences (cycles per token) are unchanged; handshakes and flags are sampled in ReadOnly
        Clock(self.dut.clk, self.PERIOD_NS, unit="ns", impl="gpi").start()
        self.dut.tokens__valid.value = 0
        self.dut.out__ready.value = 0
        self.dut.lora__valid.value = 0
        self.dut.rst.value = 1
        for _ in range(3):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    def status(self, bits: tuple[int, int]) -> int:
        value = int(self.dut.status.value)
        return (value >> bits[0]) & ((1 << (bits[1] - bits[0])) - 1)

    async def _idle(self) -> None:
        while self.rng.random() < self.idle:
            await RisingEdge(self.dut.clk)

    async def _accepted(self, ready: object, what: str) -> None:
        """With valid driven: return after the clock edge that completes the handshake. Ready is sampled in
        ReadOnly; while it is low the testbench sleeps until it rises (the same edge as a per-cycle poll)."""
        while True:
            await ReadOnly()
            if int(ready.value):
                await RisingEdge(self.dut.clk)
                return
            timeout = Timer(self.watchdog * self.PERIOD_NS, unit="ns")
            if await First(RisingEdge(ready), timeout) is timeout:
                raise AssertionError(f"{what}: not accepted within {self.watchdog} cycles")

    async def write_lora(self, writes: list[list[int]]) -> None:
        """One LoRA word per handshake, with random idle cycles between them."""
        for addr, value in writes:
            await self._idle()
            self.dut.lora__payload.value = addr | (value << self.lora_addr_bits)
            self.dut.lora__valid.value = 1
            await self._accepted(self.dut.lora__ready, f"LoRA word {addr:#x}")
            self.dut.lora__valid.value = 0

    async def feed(self, token: int, new_seq: bool) -> int | None:
        """Offer one token (after random idle cycles); return the output token (taken with random
        backpressure), or None when the decoder consumed it without output (an error flag).

        Handshakes are sampled in the ReadOnly phase before the edge that completes them.
        """
        out = await self._feed(token, new_seq)
        self.fed += 1
        print(sim_progress_line(self.fed, self.to_feed), flush=True)
        return out

    async def _feed(self, token: int, new_seq: bool) -> int | None:
        clk = self.dut.clk
        await self._idle()
        self.dut.tokens__payload.value = token | (int(new_seq) << self.token_bits)
        self.dut.tokens__valid.value = 1
        await self._accepted(self.dut.tokens__ready, f"token {token}")
        self.dut.tokens__valid.value = 0
        await RisingEdge(clk)  # busy rises the cycle after the handshake
        await ReadOnly()
        if not int(self.dut.out__valid.value) and self.status(STATUS_BUSY):
            # decoding: sleep until the output appears rather than polling every cycle from Python
            timeout = Timer(self.watchdog * self.PERIOD_NS, unit="ns")
            if await First(RisingEdge(self.dut.out__valid), timeout) is timeout:
                raise AssertionError(f"token {token}: no output within {self.watchdog} cycles")
        else:
            await RisingEdge(clk)  # leave the read-only phase before driving out.ready
        for _ in range(self.watchdog):
            ready = self.rng.random() >= self.stall
            self.dut.out__ready.value = int(ready)
            await ReadOnly()
            valid, payload = int(self.dut.out__valid.value), int(self.dut.out__payload.value)
            quiet = not self.status(STATUS_BUSY) and not valid
            flagged = self.status(STATUS_CONTEXT_FULL) or self.status(STATUS_BAD_TOKEN)
            await RisingEdge(clk)
            if ready and valid:
                self.dut.out__ready.value = 0
                return payload
            if quiet and flagged:
                self.dut.out__ready.value = 0
                return None
        raise AssertionError(f"token {token}: no output and no error flag within {self.watchdog} cycles")

    async def flags(self) -> dict[str, int]:
        """Status after the last handshake has settled (read in ReadOnly, then one clock on)."""
        await ReadOnly()
        flags = {"context_full": self.status(STATUS_CONTEXT_FULL), "bad_token": self.status(STATUS_BAD_TOKEN),
                "position": self.status(STATUS_POSITION), "tokens": self.status(STATUS_TOKENS)}
        await RisingEdge(self.dut.clk)
        return flags

    async def generate(self, prompt: list[int], n: int) -> tuple[list[int], list[int]]:
        """A new sequence: feed the prompt, then each output back until n tokens are generated. -> the output after
        every token fed (the prompt's predictions, then the generated tokens) and the cycles of each feed."""
        outputs: list[int] = []
        cycles: list[int] = []
        while len(outputs) < len(prompt) - 1 + n:
            index = len(cycles)
            token = prompt[index] if index < len(prompt) else outputs[-1]
            before = self.status(STATUS_CYCLES)
            out = await self.feed(token, index == 0)
            cycles.append(self.status(STATUS_CYCLES) - before)
            if out is None:
                where = f"prompt token {index}" if index < len(prompt) else f"generated token {index - len(prompt) + 1}"
                raise AssertionError(f"{where} ({token}) gave no output: {await self.flags()}")
            outputs.append(out)
        return outputs, cycles


@cocotb.test()
async def decode_matches_reference(dut: object) -> None:
    with open(os.environ["HARDWIRE_SIM_SPEC"]) as fh:
        spec = json.load(fh)
    tb = DecoderTB(dut, spec["token_bits"], spec["lora_addr_bits"], spec["seed"], spec["idle"], spec["stall"], spec["watchdog"])
    tb.to_feed = sum(len(s["prompt"]) - 1 + s["n"] if s["kind"] == "generate" else s["kind"] == "feed"
                     for s in spec["steps"])
    await tb.start()
    results: list[dict] = []
    mismatches: list[str] = []
    for step in spec["steps"]:
        if step["kind"] == "lora":
            await tb.write_lora(step["writes"])
            results.append({"kind": "lora", "written": len(step["writes"])})
        elif step["kind"] == "feed":
            out = await tb.feed(step["token"], step["new_seq"])
            results.append({"kind": "feed", "output": out, **(await tb.flags())})
        else:
            outputs, cycles = await tb.generate(step["prompt"], step["n"])
            results.append({"kind": "generate", "outputs": outputs, "tokens": outputs[len(step["prompt"]) - 1:],
                            "reference": step["reference"], "match": outputs == step["reference"], "cycles": cycles})
            if outputs != step["reference"]:
                first = next(i for i, (a, b) in enumerate(zip(outputs, step["reference"], strict=True)) if a != b)
                mismatches.append(f"outputs {outputs} != reference {step['reference']} (first at position {first})")
        with open(spec["result"], "w") as fh:  # written after every step: a failure keeps what ran
            json.dump(results, fh)
    assert not mismatches, "; ".join(mismatches)
