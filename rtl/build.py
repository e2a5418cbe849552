"""From a QModel to a build folder: Verilog, the QModel itself and a report.

Everything written is a pure function of the inputs, so two compiles of the same model
and options give byte-identical files.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import verilog

from ..quant.qmodel import QModel
from .decoder import Decoder
from .mac_array import LATENCY as MAC_LATENCY

TOP_NAME = "hardwire_decoder"
_MV_OVERHEAD = MAC_LATENCY + 3 + 4  # MAC pipeline, rescale, start and hand-over states


def macs_per_token(qm: QModel, position: int) -> int:
    """Multiply-accumulates for one token at `position` (0-based): projections, head, attention."""
    cfg = qm.config
    weights = sum(int(lin.codes.numel()) for _, lin in qm.linears())
    attention = 2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * (position + 1)  # q·k and p·v
    return weights + attention


def cycles_per_token_estimate(qm: QModel, lanes: int, position: int) -> int:
    """The static schedule's cycle count for one token at `position`, phase by phase (docs/hardware.md)."""
    cfg = qm.config
    d, hd = cfg.d_model, cfg.head_dim

    def chunks(n: int) -> int:
        return -(-n // lanes)

    def matvec(rows: int, cols: int) -> int:
        return rows * chunks(cols) + _MV_OVERHEAD

    # every norm is loaded by the residual write before it (embedding, O, DOWN); what is left is its tail:
    # the sums' drain and the d outputs (LayerNorm: also its second pass over the vector)
    norm = (2 * d + 13 if cfg.norm == "layer" else d + 12) + 3
    n = position + 1
    total = chunks(d) * (lanes + 1) * (2 if cfg.positions == "learned" else 1) + 4  # embedding (+ positions)
    for layer in qm.layers:
        total += 2 * norm
        total += sum(matvec(*getattr(layer, p).codes.shape) for p in ("q", "k", "v", "o", "up", "down"))
        total += matvec(*layer.gate.codes.shape) if layer.gate is not None else 0
        if cfg.positions == "rope":  # q rotates during the K projection, k during V; only an overhang costs
            rope_q, rope_k = cfg.n_heads * hd + 4, cfg.n_kv_heads * hd + 4
            total += max(0, rope_q - matvec(*layer.k.codes.shape)) + max(0, rope_k - matvec(*layer.v.codes.shape)) + 3
        else:
            total += (cfg.n_heads + cfg.n_kv_heads) * hd + 4
        per_head = matvec(n, hd) + (2 * n + 20) + matvec(hd, n)  # the softmax loads while SCORES runs
        total += cfg.n_heads * per_head
        if qm.lora.rank:  # each adapted projection first runs LoRA A: rank rows over its inputs
            total += sum(matvec(qm.lora.rank, getattr(layer, site).codes.shape[1]) for site in qm.lora.sites
                         if getattr(layer, site) is not None)
    total += norm + matvec(*qm.head.codes.shape) + 8  # final norm, head, argmax, emit
    return total


@dataclass(frozen=True)
class BuildReport:
    params: int  # weights stored on the chip (tied heads count twice: the final norm gain unties them)
    weight_bits: int  # code bits
    avg_weight_bits: float
    weight_storage_bits: int  # bits in the weight stores as built (padding, MXFP4 shifts included)
    scheme: str
    storage: str
    lanes: int
    context: int
    position: int  # the position the per-token figures are stated at
    macs_per_token: int
    cycles_per_token_estimate: int
    lane_bound_cycles: int  # macs_per_token / lanes: what a schedule with no overhead would take
    kv_cache_bits: int
    verilog_seconds: float

    def summary(self) -> str:
        ratio = self.cycles_per_token_estimate / self.lane_bound_cycles
        return "\n".join([
            f"scheme {self.scheme}, {self.params:,} weights, {self.weight_bits:,} code bits "
            f"({self.avg_weight_bits:.2f} bits/weight), {self.storage} storage of {self.weight_storage_bits:,} bits",
            f"KV cache {self.kv_cache_bits:,} bits ({self.context} positions)",
            f"at position {self.position}: {self.macs_per_token:,} MACs/token, {self.lanes} lanes -> "
            f"{self.cycles_per_token_estimate:,} cycles/token estimated ({ratio:.2f} x the lane bound of "
            f"{self.lane_bound_cycles:,})",
        ])


def compile_to(qm: QModel, out: Path, *, lanes: int, storage: str, position: int | None = None,
               progress: bool = True, vocab: tuple[str, ...] | None = None) -> BuildReport:
    """Write out/decoder.v, out/qmodel.{npz,json}, out/report.json (and out/vocab.json); return the report."""
    out.mkdir(parents=True, exist_ok=True)
    decoder = Decoder(qm, lanes=lanes, storage=storage)
    start = time.time()
    if progress:
        print(f"generating Verilog ({storage} storage, {lanes} lanes) ...", flush=True)
    text = verilog.convert(decoder, name=TOP_NAME, emit_src=False)
    elapsed = time.time() - start
    (out / "decoder.v").write_text(text)
    qm.save(out)
    if vocab is not None:  # lets `hardwire sim --prompt TEXT` encode text for a character model
        (out / "vocab.json").write_text(json.dumps(list(vocab)) + "\n")
    position = qm.context // 2 if position is None else position
    cfg = qm.config
    macs = macs_per_token(qm, position)
    stores = [lin for _, lin in qm.linears()] + [qm.embed] + ([qm.pos] if qm.pos is not None else [])
    storage_bits = 0
    for table in stores:
        rows, cols = table.codes.shape
        word = lanes * table.bits + (5 if table.scheme == "mxfp4" else 0)
        storage_bits += rows * -(-cols // lanes) * word
    report = BuildReport(
        params=qm.n_weights, weight_bits=qm.weight_bits, avg_weight_bits=round(qm.avg_weight_bits, 4),
        weight_storage_bits=storage_bits, scheme=qm.scheme, storage=storage, lanes=lanes, context=qm.context,
        position=position, macs_per_token=macs, cycles_per_token_estimate=cycles_per_token_estimate(qm, lanes, position),
        lane_bound_cycles=-(-macs // lanes), kv_cache_bits=2 * cfg.n_layers * qm.context * cfg.n_kv_heads * cfg.head_dim * 8,
        verilog_seconds=round(elapsed, 1))
    fields = {k: v for k, v in report.__dict__.items() if k != "verilog_seconds"}  # byte-identical reruns
    (out / "report.json").write_text(json.dumps(fields, indent=1) + "\n")
    return report
