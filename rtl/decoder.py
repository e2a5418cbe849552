"""Decoder: the whole model as one circuit, running a static schedule per token.

One token in, one token out (the argmax after it). Weights sit in weight banks (ROM or
constant logic), the KV cache in SRAM banks shared by the layers, and every multiply-accumulate
of the token, projections and attention alike, runs on one row-parallel engine (`rows` row
units of `lanes` MACs) fed by a single address generator. The schedule is fixed at compile
time: a Python loop over the QModel unrolls it into the states of one FSM (no run-time
scheduling, as in TileRT). LoRA adapters (numerics §9) live in writable SRAM loaded through
the `lora` port between tokens (rtl/lora_bank.py); an adapted projection first runs A over its
input (rank rows) into sixteen-bit registers, then adds B t to each output row before its
saturation. The circuit is built in stages joined by typed records in Decoder.elaborate (rtl/datapath.py
lists them); docs/hardware.md draws the data flow; docs/numerics.md is what every block computes.
"""

from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..quant.qmodel import QModel
from ..quant.quantize import WEIGHT_FORMAT
from .datapath import ACT_BITS, MAX_LORA_RANK, Dims, Mode, Source
from .decoder_control import Control
from .decoder_engine import Product, build_engine
from .decoder_epilogue import build_epilogue
from .decoder_memories import build_buffers, build_kv_cache, build_vectors, build_weights
from .decoder_schedule import ScheduleIn, build_schedule
from .decoder_side import NormLink, build_head_norm_driver, build_norm_feeder, build_rope_driver
from .decoder_units import Units, build_units
from .lora_bank import LoraBank
from .lora_map import lora_addr_bits
from .plan import HardwarePlan

__all__ = ["ACT_BITS", "MAX_LORA_RANK", "Decoder", "Mode", "Source", "residual_layout", "status_layout",
           "token_layout"]


def token_layout(vocab: int) -> data.StructLayout:
    return data.StructLayout({"token": unsigned(max(1, (vocab - 1).bit_length())), "new_seq": 1})


def residual_layout() -> data.StructLayout:
    """An element of the residual passed between a chain's boards; new_seq: the token starts a sequence."""
    return data.StructLayout({"value": signed(16), "new_seq": 1})


def status_layout() -> data.StructLayout:
    return data.StructLayout({"tokens": unsigned(32), "cycles": unsigned(32), "position": unsigned(16),
                              "busy": 1, "context_full": 1, "bad_token": 1})


def _check(qm: QModel, rows: int, lanes: int, storage: str, attention_rows: int | None, softmax_lanes: int,
           dsp_rows: int | None, epilogue_lanes: int) -> None:
    cfg = qm.config
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 64 or rows & (rows - 1):
        raise ValueError(f"rows must be a power of two from 1 to 64, got {rows!r}")
    if attention_rows is not None:
        ok = [a for a in range(1, rows + 1) if not a & (a - 1) and cfg.head_dim % a == 0]
        if attention_rows not in ok:
            raise ValueError(f"attention rows must be a power of two that divides the head width {cfg.head_dim} and is "
                             f"at most rows ({rows}), got {attention_rows!r}; accepted: {', '.join(map(str, ok))}")
    if storage not in ("rom", "logic"):
        raise ValueError(f"storage must be 'rom' or 'logic', got {storage!r}")
    if dsp_rows is not None and (isinstance(dsp_rows, bool) or not isinstance(dsp_rows, int) or
                                 not 0 <= dsp_rows <= rows):
        raise ValueError(f"DSP rows must be None (all) or a count from 0 to rows ({rows}), got {dsp_rows!r}")
    if lanes < 1 or lanes & (lanes - 1) or lanes > 64:
        raise ValueError(f"lanes must be a power of two from 1 to 64, got {lanes}")
    if cfg.head_dim % lanes:
        raise ValueError(f"lanes {lanes} must divide the head width {cfg.head_dim}: the attention products read "
                         f"whole heads; accepted lanes for this model: "
                         f"{', '.join(str(1 << k) for k in range(7) if cfg.head_dim % (1 << k) == 0)}")
    if qm.block_scaled and 32 % lanes:
        raise ValueError(f"{qm.scheme} ({WEIGHT_FORMAT[qm.scheme]} weights) needs lanes dividing its 32-column blocks, "
                         f"got {lanes}")
    if qm.lora.rank > MAX_LORA_RANK and qm.lora.sites:
        raise ValueError(f"LoRA rank {qm.lora.rank} is more than the {MAX_LORA_RANK} products the epilogue forms per "
                         f"output row (B t); quantize with a rank of at most {MAX_LORA_RANK}")
    for site in qm.lora.sites:
        if qm.lora.rank and any(getattr(layer, site, None) is None for layer in qm.layers):
            raise ValueError(f"LoRA site {site!r} is not a projection of every layer of this model")
    if isinstance(softmax_lanes, bool) or softmax_lanes not in [1 << k for k in range(7)] or lanes % softmax_lanes:
        raise ValueError(f"softmax lanes must be a power of two that divides lanes ({lanes}), got {softmax_lanes!r}")
    if (isinstance(epilogue_lanes, bool) or epilogue_lanes not in [1 << k for k in range(7)] or rows % epilogue_lanes
            or lanes % epilogue_lanes):
        raise ValueError(f"epilogue lanes must be a power of two that divides rows ({rows}) and lanes ({lanes}), "
                         f"got {epilogue_lanes!r}")


class Decoder(wiring.Component):
    """Token stream in (with a new-sequence flag), next-token stream out, status counters."""

    def __init__(self, qm: QModel, *, rows: int = 1, lanes: int = 8, storage: str = "rom",
                 attention_rows: int | None = None, softmax_lanes: int = 1, dsp_rows: int | None = None,
                 epilogue_lanes: int = 1) -> None:
        try:
            _check(qm, rows, lanes, storage, attention_rows, softmax_lanes, dsp_rows, epilogue_lanes)
        except ValueError:
            self._MustUse__silence = True
            raise
        self.qm, self.rows, self.lanes, self.storage = qm, rows, lanes, storage
        self.plan = HardwarePlan(rows=rows, lanes=lanes, storage=storage, attention_rows=attention_rows,
                                 softmax_lanes=softmax_lanes, dsp_rows=dsp_rows, epilogue_lanes=epilogue_lanes)
        cfg = qm.config
        self.token_bits = max(1, (cfg.vocab_size - 1).bit_length())
        ports = {
            "tokens": In(stream.Signature(token_layout(cfg.vocab_size))),
            "out": Out(stream.Signature(unsigned(self.token_bits))),
            "status": Out(status_layout()),
            "lora": In(stream.Signature(data.StructLayout({"addr": unsigned(lora_addr_bits(qm)),
                                                           "data": unsigned(16)}))),
        }
        if qm.stage is not None:  # one board of a chain (quant/chain.py): the residual in from the board before, out
            ports["resid_in"] = In(stream.Signature(residual_layout()))  # to the board after
            ports["resid_out"] = Out(stream.Signature(residual_layout()))
        super().__init__(ports)

    def elaborate(self, platform: object) -> Elaboratable:
        """The stages in order, each a function of the records it reads; the records that flow backwards (the
        token's and the product's registers, the residual's link to the norm) are made before their readers."""
        m, qm = Module(), self.qm
        dims = Dims.of(qm, self.plan)
        # memories and units: nothing sequenced yet
        weights = build_weights(m, qm, dims)
        buffers = build_buffers(m, qm, dims)
        kv = build_kv_cache(m, qm, dims)
        vectors = build_vectors(m, qm, dims)
        units = build_units(m, qm, dims, weights.acc_bits)
        self.banks, self.memories = weights.banks, {**buffers.memories, **kv.memories, **vectors.memories}
        # the token's registers: the schedule sets them, the epilogue and the RoPE driver read them
        control = Control(qm, self.token_bits)
        self._status(m, control, units)
        m.submodules.lora = lora = LoraBank(qm, lanes=self.lanes, lanes_out=self.plan.epilogue_lanes)
        # adapter writes only between tokens; the host waits while busy
        m.d.comb += [lora.write.valid.eq(self.lora.valid), lora.write.payload.eq(self.lora.payload),
                     self.lora.ready.eq(lora.write.ready), lora.accept.eq(~control.busy)]
        self.memories.update(lora.memories)
        # a product: the schedule sets its registers, the engine walks it, the epilogue sends its rows on
        product = Product(qm, dims, weights, kv)
        engine = build_engine(m, dims, product, weights.banks, buffers, kv, units, lora)
        link = NormLink(dims.wide)  # the residual update into the norm unit: the feeder drives its ready
        epilogue = build_epilogue(m, qm, dims, product, engine, weights, buffers, kv, vectors, units, control, lora,
                                  link)
        # beside the schedule, started by it: the norm feeder, the RoPE driver
        feeder = build_norm_feeder(m, dims, units.norm_unit, units.norm_names, vectors, buffers, link)
        rope = build_rope_driver(m, qm, dims, units.rope, vectors, buffers, kv, control)
        head_norm = build_head_norm_driver(m, qm, dims, units.head_norm, vectors)
        self.fsm = build_schedule(m, ScheduleIn(  # for testbenches and waveforms: the schedule state
            qm=qm, dims=dims, tokens=self.tokens, out=self.out, resid_in=getattr(self, "resid_in", None),
            resid_out=getattr(self, "resid_out", None), control=control, product=product, epilogue=epilogue,
            feeder=feeder, rope=rope, link=link, weights=weights, units=units, buffers=buffers, kv=kv, vectors=vectors,
            lora=lora, head_norm=head_norm))
        return m

    def _status(self, m: Module, control: Control, units: Units) -> None:
        """The layer selects the softmax's scale and the activation table; the status port reports the counters."""
        m.d.comb += units.softmax.site.eq(control.layer_sel)  # the layer's score scale
        m.d.comb += [unit.site.eq(control.layer_sel) for unit in units.acts]  # the layer's activation table
        m.d.sync += control.cycles.eq(control.cycles + 1)
        m.d.comb += [self.status.tokens.eq(control.tokens_done), self.status.cycles.eq(control.cycles),
                     self.status.position.eq(control.position), self.status.busy.eq(control.busy),
                     self.status.context_full.eq(control.context_full), self.status.bad_token.eq(control.bad_token)]
