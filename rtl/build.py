"""From a QModel to a build folder: Verilog, the QModel itself and a report.

Everything written is a pure function of the inputs, so two compiles of the same model
and options give byte-identical files.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from amaranth.back import verilog

from ..quant.chain import stages
from ..quant.qmodel import QLinear, QModel
from .chain import HOP_CYCLES, Chain, chain_cycles
from .decoder import Decoder
from .plan import HardwarePlan, cycles_per_token_estimate, latency_floor_cycles, macs_per_token, table_shapes, weight_bank_shapes

__all__ = ["TOP_NAME", "BuildReport", "compile_to", "cycles_per_token_estimate", "macs_per_token"]

TOP_NAME = "hardwire_decoder"
# the reference board for the block-RAM bandwidth bound: the ULX3S-85F's 208 DP16KD, one 36-bit read port each
REFERENCE_PORT_BITS = 208 * 36


@dataclass(frozen=True)
class BuildReport:
    params: int  # weights stored on the chip (tied heads count twice: the final norm gain unties them)
    weight_bits: int  # code bits
    avg_weight_bits: float
    weight_storage_bits: int  # bits in the weight stores as built (padding, MXFP4 shifts included)
    scheme: str
    storage: str
    rows: int  # row units of the engine
    attention_rows: int | None  # rows of the attention products as asked (None: the default, HardwarePlan.attn_rows)
    softmax_lanes: int  # elements per cycle of the softmax's exponent and output passes
    dsp_rows: int | None  # row units on hard multipliers (None: all), the rest shift-add
    epilogue_lanes: int  # output rows per cycle through the epilogue
    lanes: int  # MACs per row unit and cycle
    context: int
    position: int  # the position the per-token figures are stated at
    macs_per_token: int
    cycles_per_token_estimate: int
    mac_bound_cycles: int  # macs_per_token / (rows x lanes): what a schedule with no overhead would take
    bram_bound_cycles: int  # weight bits / the ULX3S-85F's block-RAM port bits per cycle: no design streams faster
    latency_floor_cycles: int  # the dependency chain of one token with unlimited MACs
    kv_cache_bits: int
    verilog_seconds: float
    tensor_formats: dict[str, str] = field(default_factory=dict)  # every stored tensor: codes, scales, in/out widths
    head_macs: int = 0  # the LM head's share of macs_per_token (vocab x d_model)
    vocab_weight_bits: int = 0  # the embedding's and the head's share of weight_bits
    boards: int = 1  # a chain of boards (quant/chain.py) or one
    stages: list[list[int]] = field(default_factory=list)  # each board's layers [first, end) on a chain
    link_cycles: int = 0  # of cycles_per_token_estimate: the residual's way over the links, beyond its elements

    def vocab_summary(self) -> str:
        return (f"vocabulary: the head takes {self.head_macs:,} of {self.macs_per_token:,} MACs/token "
                f"({self.head_macs / self.macs_per_token:.0%}), the embedding and head {self.vocab_weight_bits:,} of "
                f"{self.weight_bits:,} code bits ({self.vocab_weight_bits / self.weight_bits:.0%})")

    def summary(self) -> str:
        ratio = self.cycles_per_token_estimate / self.mac_bound_cycles
        shape = HardwarePlan(self.rows, self.lanes, attention_rows=self.attention_rows,
                             softmax_lanes=self.softmax_lanes, dsp_rows=self.dsp_rows,
                             epilogue_lanes=self.epilogue_lanes).shape
        return "\n".join([
            f"scheme {self.scheme}, {self.params:,} weights, {self.weight_bits:,} code bits "
            f"({self.avg_weight_bits:.2f} bits/weight), {self.storage} storage of {self.weight_storage_bits:,} bits",
            f"KV cache {self.kv_cache_bits:,} bits ({self.context} positions)",
            f"at position {self.position}: {self.macs_per_token:,} MACs/token, {shape} "
            f"-> {self.cycles_per_token_estimate:,} cycles/token estimated ({ratio:.2f} x the MAC bound of "
            f"{self.mac_bound_cycles:,}; latency floor {self.latency_floor_cycles:,}, block-RAM bound "
            f"{self.bram_bound_cycles:,})",
            self.vocab_summary(),
        ])


def tensor_formats(qm: QModel) -> dict[str, str]:
    """name -> how its weights are stored and what it reads and writes, e.g. `int4 codes, a scale per row; int12 in,
    int12 out` for q (docs/numerics.md §11, §13)."""
    out = {}
    for name, t in qm.weight_tensors():
        codes = {"mxfp4": "mxfp4 (E2M1) codes, a shared power-of-two exponent per 32 columns and a scale per row",
                 "int_group": f"int{t.bits} codes, a power-of-two exponent (0..7) per 32 columns and a scale per row",
                 "int": f"int{t.bits} codes, a scale per row"}[t.scheme]
        io = f"; int{t.in_bits} in, int{t.out_bits} out" if isinstance(t, QLinear) else "; looked up, int16 out"
        out[name] = codes + io
    return out


def compile_to(qm: QModel, out: Path, *, lanes: int, storage: str, rows: int = 1, attention_rows: int | None = None,
               softmax_lanes: int = 1, dsp_rows: int | None = None, epilogue_lanes: int = 1, position: int | None = None,
               progress: bool = True, vocab: tuple[str, ...] | None = None, boards: int = 1) -> BuildReport:
    """Write out/decoder.v, out/qmodel.{npz,json}, out/report.json (and out/vocab.json); return the report.

    Those files depend only on the model and the options: two runs give the same bytes (whatever the process's
    PYTHONHASHSEED, folder or time). What was measured (seconds) goes to out/timings.json instead.
    boards > 1: the model split by layers over a chain of that many boards (quant/chain.py, rtl/chain.py), the
    Verilog the whole chain with its links; each board has the engine shape given.
    """
    out.mkdir(parents=True, exist_ok=True)
    shape = dict(rows=rows, lanes=lanes, storage=storage, attention_rows=attention_rows, softmax_lanes=softmax_lanes,
                 dsp_rows=dsp_rows, epilogue_lanes=epilogue_lanes)
    parts = stages(qm, boards) if boards > 1 else []
    top = Chain(parts, **shape) if parts else Decoder(qm, **shape)
    plan = top.boards[0].plan if parts else top.plan
    start = time.time()
    if progress:
        ranges = ", ".join(f"{p.stage.first_layer}..{p.stage.end_layer - 1}" for p in parts)
        on = f", {boards} boards: layers {ranges}" if parts else ""
        print(f"generating Verilog ({storage} storage, {plan.shape}{on}) ...", flush=True)
    text = verilog.convert(top, name=TOP_NAME, emit_src=False)
    elapsed = time.time() - start
    (out / "decoder.v").write_text(text)
    qm.save(out)
    if vocab is not None:  # lets `hardwire sim --prompt TEXT` encode text for a character model
        (out / "vocab.json").write_text(json.dumps(list(vocab)) + "\n")
    position = qm.context // 2 if position is None else position
    cfg = qm.config
    macs = macs_per_token(qm, position)
    storage_bits = sum(depth * width for _, depth, width in table_shapes(qm, plan) + weight_bank_shapes(qm, plan))
    report = BuildReport(
        params=qm.n_weights, weight_bits=qm.weight_bits, avg_weight_bits=round(qm.avg_weight_bits, 4),
        weight_storage_bits=storage_bits, scheme=qm.scheme, storage=storage, rows=rows, lanes=lanes,
        attention_rows=attention_rows, softmax_lanes=softmax_lanes, dsp_rows=dsp_rows, epilogue_lanes=epilogue_lanes,
        context=qm.context, position=position, macs_per_token=macs,
        cycles_per_token_estimate=(chain_cycles(parts, plan, position) if parts
                                   else cycles_per_token_estimate(qm, plan, position)),
        mac_bound_cycles=-(-macs // plan.macs_per_cycle), bram_bound_cycles=-(-qm.weight_bits // REFERENCE_PORT_BITS),
        latency_floor_cycles=latency_floor_cycles(qm, plan, position),
        kv_cache_bits=2 * cfg.n_layers * qm.context * cfg.n_kv_heads * cfg.head_dim * 8,
        verilog_seconds=round(elapsed, 1), tensor_formats=tensor_formats(qm), head_macs=int(qm.head.codes.numel()),
        vocab_weight_bits=sum(int(t.codes.numel()) * t.bits for name, t in qm.weight_tensors() if name in ("embed", "head")),
        boards=max(1, len(parts)), stages=[[p.stage.first_layer, p.stage.end_layer] for p in parts],
        link_cycles=(len(parts) - 1) * HOP_CYCLES if parts else 0)
    measured = {"verilog_seconds"}  # differs between identical runs: kept out of report.json
    fields = {k: v for k, v in report.__dict__.items() if k not in measured}
    (out / "report.json").write_text(json.dumps(fields, indent=1) + "\n")
    (out / "timings.json").write_text(json.dumps({k: report.__dict__[k] for k in sorted(measured)}, indent=1) + "\n")
    return report
