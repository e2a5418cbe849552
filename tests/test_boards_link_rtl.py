"""BoardCore as RTL, through its UART pins under cocotb + Verilator: a session with garbage between two prompts
(sim/tb_board.py), and the host link (sim/tb_link.py): the receive FIFO and its overflow rule, STATUS's sticky
overflow flag, LORA frames refused for a zero shift, the soak, the real DeviceClient, and the emulator compared reply
for reply.

One Verilator build and one simulator run serve all eight testcases; each pytest test below reports one testcase
(test_uart_soak one per seed). Every reply of the FIFO, overflow, flag, shift, soak and differential testcases is compared byte
for byte and cycle for cycle with the emulator on the board's clock (host/clocked_device.py ClockedDevice).

The soak sends random traffic for SOAK["seconds"] of line time (at the test's 460.8 kHz clock) per seed, for
SOAK["seeds"]; it must meet every reply kind, dropped bytes, bytes arriving while a reply leaves, a RESET stopping a
GENERATE, an ERROR between two TOKENs and a STATUS with the overflow flag. A long soak: HARDWIRE_SOAK_SECONDS=S sets
the line time per seed, HARDWIRE_SOAK_SEEDS=N runs seeds 16 to 15 + N (e.g. `HARDWIRE_SOAK_SECONDS=20
HARDWIRE_SOAK_SEEDS=10 pytest tests/test_boards_link_rtl.py -n 0 -k soak`: under 7 minutes here; docs/protocol.md,
"Soak", has its figures). The pure-Python tests at the end pin the emulator's side of the FIFO rule and its clock, STATUS's
overflow flag and the zero-shift check.
"""

from __future__ import annotations

import functools
import os
import random
import time

import pytest
from break_check import assert_varied
from random_ir import random_adapters, random_ir

from hardwire.boards.host_link import RX_DEPTH
from hardwire.host import protocol
from hardwire.host.clocked_device import ClockedDevice
from hardwire.host.emulator import EmulatedDevice
from hardwire.quant.quantize import quantize
from hardwire.quant.reference import ReferenceDecoder
from hardwire.rtl.plan import HardwarePlan, cycles_per_token_estimate
from hardwire.sim.sim_board import BOARD_TESTCASE, BoardSim

TESTCASES = [BOARD_TESTCASE, "rx_buffer", "rx_overflow", "overflow_flag", "lora_shift", "soak", "client",
             "differential"]  # tb_board's on the fresh sim
CLIENT_PROMPT = [6, 17, 8]  # its 12 tokens vary ([5, 1, 17] gave fifteen 15s: a link that repeated a token passed)
BOARD = {"prompt": [2, 9, 4], "n": 4, "garbage": [random.Random(5).randrange(256) for _ in range(24)]}
SOAK = {"seeds": list(range(16, 16 + int(os.environ.get("HARDWIRE_SOAK_SEEDS", 3)))),
        "seconds": float(os.environ.get("HARDWIRE_SOAK_SECONDS", 2.0)), "prompt": [2, 9, 4], "n": 8}
LANES = 8


@functools.cache
def _qm():
    """Tiny and fast to build, with a 64-token context (so that a FEED of 56 tokens decodes longer than the 642 bytes
    of the overflow testcase take on the line) and varied tokens (GPT-2 style, this seed: a LoRA adapter changes them)."""
    ir = random_ir(family="gpt2", d=16, heads=2, kv_heads=2, ffn=24, vocab=20, context=64, layers=1, seed=0)
    return quantize(ir, "int8", context=64)


@pytest.fixture(scope="module")
def link_sim(tmp_path_factory) -> dict:
    qm = _qm()
    start = time.time()
    sim = BoardSim(qm, tmp_path_factory.mktemp("link_rtl"), lanes=LANES)
    adapters = [{"layer": layer, "site": site, "a": a.a.tolist(), "b": a.b.tolist(), "a_mult": a.a_mult,
                 "a_shift": a.a_shift, "b_mult": a.b_mult, "b_shift": a.b_shift}
                for (layer, site), a in random_adapters(qm, 4).items()]
    spec = {"long_prompt": [(7 * i + 3) % qm.config.vocab_size for i in range(56)], "rx_depth": RX_DEPTH,
            "token_cycles": cycles_per_token_estimate(qm, HardwarePlan(rows=1, lanes=LANES), 0), "soak": SOAK,
            "client": {"prompt": CLIENT_PROMPT, "adapters": adapters}, "board": BOARD}
    built = time.time()
    results = sim.run(TESTCASES, spec)
    print(f"\nboard RTL: build {built - start:.1f} s, eight testcases {time.time() - built:.1f} s; "
          f"soak {results['soak']}")
    return results


def _check(link_sim: dict, name: str) -> dict:
    result = link_sim[name]
    assert result["passed"], f"cocotb testcase {name} failed: {result['failure']}"
    return result


@pytest.mark.verilator
@pytest.mark.xdist_group("link_rtl")
def test_board_uart_cocotb(link_sim):
    """Prompt -> the reference tokens; garbage -> ERROR replies only; quiet, RESET, the prompt -> the same tokens."""
    result = _check(link_sim, BOARD_TESTCASE)
    reference = ReferenceDecoder(_qm()).generate(BOARD["prompt"], BOARD["n"])
    print(f"board session: replies to garbage: {result['garbage_replies']}")
    assert result["first"] == reference and result["second"] == reference
    assert result["garbage_replies"] and all(r.startswith("ERROR ") for r in result["garbage_replies"])


@pytest.mark.verilator
@pytest.mark.xdist_group("link_rtl")
def test_frames_sent_during_a_feed_are_buffered(link_sim):
    result = _check(link_sim, "rx_buffer")
    assert all(w > 0 for w in result["first_reply_after_last_byte_cycles"][1:])


@pytest.mark.verilator
@pytest.mark.xdist_group("link_rtl")
def test_overflow_is_reported_once(link_sim):
    result = _check(link_sim, "rx_overflow")
    feed = 4 + 2 * 56  # the FEED frame; then the held HELLO, then what the FIFO holds, then the dropped bytes
    assert result["answered"] == 130 and result["dropped"] == result["sent"] - feed - 4 - RX_DEPTH == 10


@pytest.mark.verilator
@pytest.mark.xdist_group("link_rtl")
def test_overflow_flag_is_sticky_until_reset(link_sim):
    """The testcase holds every STATUS equal to the emulator's; here: the flag was 0 before the ERROR OVERFLOW, 8 after
    it (through garbage, a refused frame, a HELLO, a FEED), 0 after a RESET, and again after a RESET stopping a GENERATE."""
    result = _check(link_sim, "overflow_flag")
    assert result["flags"] == {"before the error": 0, "after the error": 8, "after garbage": 8,
                               "after a refused frame, a HELLO and a FEED": 8, "after a RESET": 0,
                               "after the second error": 8, "after a RESET that stopped a GENERATE": 0}


@pytest.mark.verilator
@pytest.mark.xdist_group("link_rtl")
def test_lora_frame_with_a_zero_shift_is_refused_whole(link_sim):
    result = _check(link_sim, "lora_shift")
    replies = result["replies"]
    assert result["refused"] == 5 and sum(r == ["ERROR BAD_LORA_SHIFT"] for r in replies.values()) == 4
    assert "ERROR BAD_LORA_SHIFT" in replies["zero shift while generating"]
    assert "ERROR BUSY" in replies["valid LORA while generating"]
    tokens = [int(t.split()[1]) for t in replies["after the refused frames"][2:-1]]
    assert tokens == ReferenceDecoder(_qm()).generate(CLIENT_PROMPT, 6)  # nothing of the refused frames was written


@pytest.mark.verilator
@pytest.mark.xdist_group("link_rtl")
@pytest.mark.parametrize("seed", SOAK["seeds"])
def test_uart_soak(link_sim, seed):
    """Every reply equal to the emulator's (the testcase); here: the random traffic met what it is there to meet."""
    result = next(s for s in _check(link_sim, "soak")["seeds"] if s["seed"] == seed)
    print(f"soak seed {seed}: {result}")
    missing = [kind for kind, n in result["replies"].items() if n == 0]
    assert not missing, f"seed {seed}: the soak's traffic drew no {', '.join(missing)}: {result['replies']}"
    unmet = [what for what in ("dropped", "bytes_while_sending", "generates_stopped", "errors_among_tokens",
                               "status_overflow_flag")
             if result["met"][what] == 0]
    assert not unmet, f"seed {seed}: the soak's traffic met no {', '.join(unmet)}: {result['met']}"


@pytest.mark.verilator
@pytest.mark.xdist_group("link_rtl")
def test_device_client_against_the_rtl(link_sim):
    """The testcase holds the client's 12 tokens (and 8 with LoRA) equal to the reference's; here: they vary."""
    assert_varied(ReferenceDecoder(_qm()).generate(CLIENT_PROMPT, 12))
    _check(link_sim, "client")


@pytest.mark.verilator
@pytest.mark.xdist_group("link_rtl")
def test_emulator_and_rtl_answer_alike(link_sim):
    _check(link_sim, "differential")


# -- the emulator's receive FIFO, without a simulator ---------------------------------------------------------------

def _replies(data: bytes) -> list[str]:
    return [str(r) for r in protocol.FrameParser().push(data)]


def test_emulator_buffers_then_reports_overflow():
    """A FEED decoding for 1 s; behind it one frame waits, the FIFO holds rx_depth bytes, the rest is dropped:
    the held frames are answered after the FEED's ACK, then one ERROR OVERFLOW once the line is quiet."""
    qm = _qm()
    dev = EmulatedDevice(qm, lanes=LANES, frame_timeout=0.01, token_seconds=0.5, rx_depth=16)
    t = 0.0
    out = dev.receive(b"".join(protocol.feed([1, 2])), t)
    for byte in protocol.hello() * 6:  # one held, four in the FIFO (16 bytes), one dropped
        t += 0.001
        out += dev.receive(bytes([byte]), t)
    assert out == b"" and dev.dropped == 4
    assert dev.next_event() == 1.0
    out = dev.poll(1.0)
    hello = protocol.hello_payload(protocol.Hello(protocol.PROTOCOL_VERSION, 20, 64, LANES))
    hello = str(protocol.Response(protocol.Reply.HELLO, hello))
    assert _replies(out) == ["ACK ", *[hello] * 5, "ERROR OVERFLOW"]  # the line has long been quiet
    assert dev.next_event() is None and dev.dropped == 4
    assert _replies(dev.receive(protocol.hello(), 2.0)) == [hello]  # taken again after the report


def test_emulator_without_decode_time_never_overflows():
    """token_seconds 0 (the default, `hardwire emulate`): nothing waits, so any amount of bytes is taken."""
    dev = EmulatedDevice(_qm(), lanes=LANES, rx_depth=16)
    out = dev.receive(b"".join(protocol.feed([1, 2])) + protocol.hello() * 50, 0.0)
    assert len(protocol.FrameParser().push(out)) == 51 and dev.dropped == 0



def test_emulator_on_the_clock_busy_and_line_time():
    """ClockedDevice (the soak's oracle): a HELLO right behind a GENERATE 2 gets BUSY, sent before the first TOKEN
    (which waits for the FEED's ACK to leave; the receiver's errors go first); sent later, it gets BUSY up to one
    cycle and its HELLO reply after the GENERATE's ACK from the next; reply bytes leave one per 10 x divisor + 1
    cycles."""
    qm, divisor = _qm(), 4
    byte = 10 * divisor

    def run(gap: int) -> tuple[list[str], ClockedDevice]:
        dev = ClockedDevice(qm, lanes=LANES, divisor=divisor, timeout=32 * byte)
        data = protocol.reset() + protocol.feed([3])[0] + protocol.generate(2) + protocol.hello()
        for i, b in enumerate(data):
            dev.receive(bytes([b]), i * byte + (gap if i >= len(data) - 4 else 0))
        dev.run_idle()
        return [protocol.Reply(r.op).name for r in protocol.FrameParser().push(bytes(b for _, b in dev.sent))], dev

    replies, dev = run(0)
    assert replies == ["ACK", "ACK", "ERROR", "TOKEN", "TOKEN", "ACK"]
    assert dev.sent[1][0] - dev.sent[0][0] == byte + 1
    low, high = 0, 4000  # BUSY at low, served at high: halve until they are one cycle apart
    assert run(high)[0] == ["ACK", "ACK", "TOKEN", "TOKEN", "ACK", "HELLO"]
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if "ERROR" in run(mid)[0] else (low, mid)
    assert run(low)[0][-1] == "ACK" and run(high)[0][-1] == "HELLO", (low, high)



class _Drive:
    """Either emulator (no clock: EmulatedDevice, times in seconds; on the board's clock: ClockedDevice, cycles) sent
    one piece of bytes at a time, each once the last has been answered and everything it started is done."""

    def __init__(self, dev) -> None:
        self.dev, self.time = dev, 0

    def __call__(self, data: bytes) -> list[protocol.Response]:
        dev = self.dev
        if isinstance(dev, ClockedDevice):
            first = len(dev.sent)
            dev.receive(data, dev.now + 1)
            dev.run_idle()
            return protocol.FrameParser().push(bytes(b for _, b in dev.sent[first:]))
        out = dev.receive(data, self.time)
        while (event := dev.next_event()) is not None:
            self.time = max(self.time, event)
            out += dev.poll(event)
        self.time += 1.0
        return protocol.FrameParser().push(out)


def test_emulators_refuse_a_lora_frame_with_a_zero_shift_whole():
    """A LORA frame with a word whose low 6 bits are 0 bound for an a_shift or b_shift register (after the port's
    address wrap) is ERROR BAD_LORA_SHIFT, checked after CRC, op and length, and none of its words is written; a 0 in
    any other register is stored. Both emulators (the RTL's testcase lora_shift holds the board to ClockedDevice)."""
    from hardwire.rtl.lora_map import lora_addr_bits, lora_address_map, shift_addresses

    qm = _qm()
    bits, slots = lora_addr_bits(qm), lora_address_map(qm)
    assert shift_addresses(qm) == [s.reg_base + k for s in slots for k in (1, 3)]
    q = slots[1]
    reset_regs = {"a_mult": 1 << 14, "a_shift": 15, "b_mult": 1 << 14, "b_shift": 15}

    def lora(start: int, words: list[int]) -> bytes:
        return protocol.frame(protocol.Op.LORA, (start & 0xFFFFFF).to_bytes(3, "little") + b"".join(
            w.to_bytes(2, "little") for w in words))

    refused = [lora(q.reg_base - 2, [5, 6, 7, 3, 9, 0]),  # b_shift 0, the last word; B and a_mult words before it
               lora(q.reg_base, [0, 0]),  # a_mult 0 is fine, a_shift 0 is not
               lora((9 << bits) + q.reg_base + 3, [0x1C0]),  # b_shift 0x1C0: low 6 bits 0, through the port's wrap
               lora((1 << 24) - (1 << bits) + slots[0].reg_base + 1, [0xFFC0, 12])]  # the 24-bit address wraps too
    stored = [lora(q.reg_base, [0, 1, 0, 63]),  # mults 0, shifts 1 and 63
              lora((3 << bits) + q.reg_base + 1, [0x41])]  # a_shift 0x41 keeps 1
    bad_crc = refused[0][:-1] + bytes([refused[0][-1] ^ 1])
    odd = protocol.frame(protocol.Op.LORA, refused[0][3:-2])  # an even length: the zero b_shift's word cut short
    for dev in (EmulatedDevice(qm, lanes=LANES), ClockedDevice(qm, lanes=LANES, divisor=4, timeout=1280)):
        drive = _Drive(dev)
        for frame in refused:
            assert [str(r) for r in drive(frame)] == ["ERROR BAD_LORA_SHIFT"], (type(dev).__name__, frame.hex())
        assert not dev.lora.touched and dev.lora.regs == [reset_regs, reset_regs]
        assert [str(r) for r in drive(bad_crc + odd)] == ["ERROR BAD_CRC", "ERROR BAD_LENGTH"]  # CRC, length first
        assert [str(r) for f in stored for r in drive(f)] == ["ACK "] * 2
        assert dev.lora.regs[1] == {"a_mult": 0, "a_shift": 1, "b_mult": 0, "b_shift": 63}


def test_emulators_overflow_flag_is_sticky_until_reset():
    """STATUS flag bit 3: set when ERROR OVERFLOW is sent (a STATUS answered before it lacks it), kept through other
    errors and commands, cleared by RESET. Both emulators (the RTL's testcase overflow_flag holds the board to
    ClockedDevice, and the soak every STATUS it meets)."""
    over = protocol.Flag.OVERFLOW
    assert over == 8
    qm = _qm()
    for dev in (EmulatedDevice(qm, lanes=LANES, frame_timeout=0.01, token_seconds=0.5, rx_depth=16),
                ClockedDevice(qm, lanes=LANES, divisor=4, timeout=1280, rx_depth=16)):
        drive = _Drive(dev)
        # a FEED, a STATUS waiting behind it, 16 bytes in the FIFO, the rest dropped
        got = drive(protocol.feed([1, 2])[0] + protocol.status() + protocol.hello() * 6)
        kinds = [protocol.Reply(r.op).name for r in got]
        assert kinds[:2] == ["ACK", "STATUS"] and str(got[-1]) == "ERROR OVERFLOW" and dev.dropped > 0, got
        flags = [got[1].status.flags]
        for data in (protocol.status(), b"\x13" + protocol.status(), protocol.frame(0x07) + protocol.hello()
                     + protocol.feed([3])[0] + protocol.status(), protocol.reset() + protocol.status()):
            flags += [r.status.flags for r in drive(data) if r.op == protocol.Reply.STATUS]
        assert flags == [0, over, over, over, 0], (type(dev).__name__, flags)
