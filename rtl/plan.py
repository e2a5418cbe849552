"""The hardware plan and the schedule of one token as data.

`HardwarePlan` is what sizes the chip (rows x lanes MACs per cycle, weight storage).
`schedule(qm, plan, position)` lists the phases one token goes through, in order, each with
the multiply-accumulates it does, the cycles it takes in the RTL and the part of those
cycles that is fixed latency (pipeline fill, table lookups), whatever the MAC count. Every
figure that describes the chip reads this list: `macs_per_token`,
`cycles_per_token_estimate`, the latency floor, and the memory inventory the board fit
check counts (`weight_bank_shapes`, `kv_bank_shapes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..quant.qmodel import QModel
from .argmax import LATENCY as ARGMAX_LATENCY
from .mac_array import LATENCY as MAC_LATENCY
from .norm import INPUT_STAGE as NORM_INPUT_STAGE
from .rescale import LATENCY as RESCALE_LATENCY
from .rope import LATENCY as ROPE_LATENCY
from .skid_buffer import LATENCY as SKID_LATENCY
from .weight_store import SHIFT_FIELD_BITS

ENGINE_INPUT_STAGE = 1  # the row units' inputs registered after the memories' multiplexers (rtl/decoder_engine.py)
MV_OVERHEAD = ENGINE_INPUT_STAGE + MAC_LATENCY + RESCALE_LATENCY + SKID_LATENCY + 4  # the input register, MAC
#                                       pipeline, rescale, the epilogue's skid buffer, start and hand-over states
RESID_STAGE = 2  # the residual update's registers (rtl/decoder_epilogue.py): a norm loaded by a product ends 2 cycles later
KV_BITS = 8  # KV cache entries are int8 (numerics §6)
VECTOR_LANES = 8  # elements per cycle of the norm's output pass (at most)


@dataclass(frozen=True)
class HardwarePlan:
    """How wide the chip is: `rows` output rows at once, each taking `lanes` inputs per cycle."""

    rows: int = 1  # row units of the dot-product engine (FINN's PE)
    lanes: int = 8  # multiply-accumulates per row unit and cycle (FINN's SIMD)
    storage: str = "rom"  # weights in "rom" (block RAM) or "logic" (constant gates)
    attention_rows: int | None = None  # rows for q.k and p.v (KV cache banks); None: all rows when they divide hd
    softmax_lanes: int = 1  # elements per cycle of the softmax's exponent and output passes: each lane has its own
    #                         EXP table, which synthesis puts in a block RAM (one per lane: all layers share the unit)
    dsp_rows: int | None = None  # row units whose lane products are hard multipliers (DSP blocks); the rest multiply
    #                              by shift-add in the fabric (rtl/mac_array.py). None: all of them
    epilogue_lanes: int = 1  # output rows per cycle through bias, rescale and destination (q, k, residual, gate,
    #                          GLU, argmax, LoRA B t, V when E <= attention rows); PV and LoRA A take one

    @property
    def shape(self) -> str:
        """How messages name the engine: "4 rows x 16 lanes", "4 rows x 16 lanes, attention on 2"."""
        text = f"{self.rows} row{'s' if self.rows > 1 else ''} x {self.lanes} lanes"
        if self.attention_rows is not None:
            text += f", attention on {self.attention_rows}"
        if self.softmax_lanes > 1:
            text += f", softmax on {self.softmax_lanes}"
        if self.epilogue_lanes > 1:
            text += f", epilogue on {self.epilogue_lanes}"
        return text if self.dsp_rows is None else f"{text}, {self.shift_add_rows} shift-add"

    @property
    def shift_add_rows(self) -> int:
        """Row units that multiply in the fabric (the last ones: attention and LoRA use the first)."""
        return 0 if self.dsp_rows is None else self.rows - self.dsp_rows

    @property
    def dsp_lanes(self) -> int:
        """MAC lanes on hard multipliers: one DSP block each."""
        return (self.rows - self.shift_add_rows) * self.lanes

    @property
    def macs_per_cycle(self) -> int:
        return self.rows * self.lanes

    def chunks(self, n: int) -> int:
        """Words of `lanes` elements that hold n elements."""
        return -(-n // self.lanes)

    @staticmethod
    def chunks_of(n: int, width: int) -> int:
        """Words of `width` elements that hold n elements."""
        return -(-n // width)

    @property
    def vector_lanes(self) -> int:
        """Elements per cycle of the norm's output pass (a divisor of lanes, a multiple of the epilogue's)."""
        return min(self.lanes, max(VECTOR_LANES, self.epilogue_lanes))

    def attn_rows(self, head_dim: int) -> int:
        """Rows the attention products use at once (the KV cache's banks): as asked, or by default all of them
        when they divide the head width, else one. Each bank is a KV-cache-sized share of block RAM bandwidth."""
        if self.attention_rows is not None:
            return self.attention_rows
        return self.rows if head_dim % self.rows == 0 else 1


def plan_from_report(report: dict) -> HardwarePlan:
    """The plan a build folder was compiled with, from its report.json."""
    return HardwarePlan(rows=int(report["rows"]), lanes=int(report["lanes"]), storage=report["storage"],
                        attention_rows=report.get("attention_rows"), softmax_lanes=int(report.get("softmax_lanes", 1)),
                        dsp_rows=report.get("dsp_rows"), epilogue_lanes=int(report.get("epilogue_lanes", 1)))


@dataclass(frozen=True)
class Phase:
    """One step of a token's schedule."""

    kind: str  # "embed", "norm", "matvec", "lora_a", "qk_norm", "rope", "copy", "scores", "softmax", "pv", "argmax",
    #            "handshake", "receive", "send" (a chain's boards: the residual in from the board before, out to the
    #            board after), "post_add" (a post-sublayer norm's output added to the residual)
    name: str  # what it works on: "layers.0.q", "layers.1.head2", ...
    macs: int  # model multiply-accumulates (LoRA's are not model work: 0)
    cycles: int  # clock cycles in the RTL, beside what overlaps it
    latency: int  # the part of `cycles` that is fixed latency, not work: what is left with unlimited MACs


def matvec_cycles(rows: int, cols: int, group: int, plan: HardwarePlan, width: int = 1) -> int:
    """Cycles of one matrix-vector product on the engine, `group` rows at a time.

    A group takes `chunks` cycles in the row units, and hands its rows on `width` per cycle; the
    engine waits when a group needs more hand-over beats than it has chunks (rtl/row_serializer.py).
    """
    chunks = plan.chunks(cols)
    groups = -(-rows // group)
    last = rows - (groups - 1) * group
    return chunks + (groups - 1) * max(chunks, -(-group // width)) + -(-last // width) + MV_OVERHEAD


def _matvec(kind: str, name: str, rows: int, cols: int, group: int, plan: HardwarePlan, macs: bool = True,
            drain: int = 0, width: int = 1) -> Phase:
    """A product phase; `drain`: cycles its destination needs after the last row (the up projection's table);
    `width`: rows per cycle through the epilogue."""
    return Phase(kind, name, rows * cols if macs else 0, matvec_cycles(rows, cols, group, plan, width) + drain,
                 MV_OVERHEAD + 2 + drain)


def score_beat(plan: HardwarePlan, head_dim: int) -> int:
    """Scores per cycle into the softmax: a group of attention rows passes the epilogue in beats of min(epilogue
    lanes, attention rows), when that fits a word of the softmax's lanes; else one at a time."""
    beat = min(plan.epilogue_lanes, plan.attn_rows(head_dim))
    return beat if plan.softmax_lanes % beat == 0 else 1


def epilogue_width(qm: QModel, plan: HardwarePlan, site: str) -> int:
    """Rows per cycle through the epilogue for projection `site` ("q", ..., "head"): the plan's epilogue lanes;
    for V as many only when they are at most the attention rows (its transposed cache is banked by channel over
    them, so a beat's channels must fall in distinct banks), else one."""
    if site == "v" and plan.epilogue_lanes > plan.attn_rows(qm.config.head_dim):
        return 1
    return plan.epilogue_lanes


def norm_tail_cycles(qm: QModel, plan: HardwarePlan) -> int:
    """What is left of a norm once its input has streamed in: the sums' drain and the output words
    (LayerNorm: also its sum-of-squares pass over the words)."""
    words = -(-qm.config.d_model // plan.vector_lanes)
    tail = 2 * words + 10 if qm.config.norm == "layer" else words + 9
    return tail + NORM_INPUT_STAGE + RESCALE_LATENCY


def head_norm_cycles(qm: QModel, heads: int) -> int:
    """A per-head q/k norm over `heads` heads of raw q or k (rtl/decoder_side.py's driver, its own norm unit an
    element per cycle): per head the unit's rms vector (hd in, its drain, sums, table and rescale, hd out: hd + w + 15
    with w = hd words of one lane, rtl/norm.py), and 3 states: the start, the cycle after the last write in which
    the driver stops, the one in which the schedule sees it."""
    hd = qm.config.head_dim
    return heads * (2 * hd + 10 + RESCALE_LATENCY) + 3


def layer_windows(qm: QModel) -> list[int | None]:
    """Each layer's attention window where it bites within the context, else None (causal): a windowed layer
    keeps its K and V in a ring of w slots, position p in slot p mod w (docs/hardware.md)."""
    return [w if w is not None and w < qm.context else None for w in qm.config.layer_windows]


def attended(window: int | None, position: int) -> int:
    """Keys the query at `position` sees in a layer with this window: the slots its scores and PV run over."""
    return position + 1 if window is None else min(position + 1, window)


def schedule(qm: QModel, plan: HardwarePlan, position: int) -> list[Phase]:
    """The phases of one token at `position` (0-based), in the order the decoder runs them (docs/hardware.md)."""
    cfg = qm.config
    d, hd, lanes = cfg.d_model, cfg.head_dim, plan.lanes
    rows, attn = plan.rows, plan.attn_rows(hd)
    windows = layer_windows(qm)
    norm = norm_tail_cycles(qm, plan)

    def norm_phase(name: str, loaded_by_product: bool) -> Phase:
        """A norm's tail; one a product loaded ends RESID_STAGE cycles later (the residual update's registers)."""
        tail = norm + (RESID_STAGE if loaded_by_product else 0)
        return Phase("norm", name, 0, tail, tail - plan.chunks_of(d, plan.vector_lanes))

    def post_phases(name: str) -> list[Phase]:
        """A post-sublayer norm (Gemma 2, 3) its product loaded directly (no residual stage on the way), then its
        output added to the residual: a cycle to start, an element a cycle, a cycle to hand over
        (rtl/decoder_residual.py); the norm this add loads then ends like one the embedding loads."""
        words = plan.chunks_of(d, plan.vector_lanes)
        return [Phase("norm", f"{name}_norm", 0, norm, norm - words), Phase("post_add", f"{name}_add", 0, d + 2, 2)]

    def mlp_phases(i: int, layer: object, sites: tuple[str, ...]) -> list[Phase]:
        out = []
        for site in sites:
            lin = getattr(layer, site)
            if lin is None:
                continue
            if site in qm.lora.sites and qm.lora.rank:
                out.append(_matvec("lora_a", f"layers.{i}.{site}.lora_a", qm.lora.rank, lin.codes.shape[1], 1, plan,
                                   macs=False))
            drain = (2 if cfg.gated else 1) if site == "up" else 0  # the MLP's table after the rows
            out.append(_matvec("matvec", f"layers.{i}.{site}", *lin.codes.shape, rows, plan, drain=drain,
                               width=epilogue_width(qm, plan, site)))
        return out

    # the embedding (and learned positions) row: per word a read, `lanes` elements into the rescale, a hand-over
    passes = 2 if cfg.positions == "learned" else 1
    if qm.has_embedding:
        phases = [Phase("embed", "embed", 0, passes * (plan.chunks(d) * (lanes + 2) + RESCALE_LATENCY), RESCALE_LATENCY)]
    else:  # a chain's later board: the residual streams in while the board before sends it (rtl/chain.py counts
        phases = [Phase("receive", "residual in", 0, 1, 1)]  # the send and the link); after its last element, a cycle
    for i, layer in enumerate(qm.layers):
        prefix = f"layers.{i}"
        if cfg.parallel_residual:  # the MLP's norm, gate and up first; then the attention norm from the residual memory
            phases.append(norm_phase(f"{prefix}.{'attn' if cfg.shared_norm else 'mlp'}_norm", i > 0))
            phases += mlp_phases(i, layer, ("gate", "up"))
            if not cfg.shared_norm:  # a cycle to start it, one to hand over, an element per cycle in, then its tail
                phases.append(Phase("norm", f"{prefix}.attn_norm", 0, 2 + d + norm, 2 + norm))
        else:  # loaded by the embedding, by DOWN, or by a post-sublayer norm's add
            phases.append(norm_phase(f"{prefix}.attn_norm", i > 0 and qm.layers[i - 1].post_mlp_norm is None))
        for site in ("q", "k", "v"):
            if site in qm.lora.sites and qm.lora.rank:
                phases.append(_matvec("lora_a", f"{prefix}.{site}.lora_a", qm.lora.rank, d, 1, plan, macs=False))
            phases.append(_matvec("matvec", f"{prefix}.{site}", *getattr(layer, site).codes.shape, rows, plan,
                                  width=epilogue_width(qm, plan, site)))
            if site in ("q", "k") and getattr(layer, f"{site}_norm") is not None:  # each head normalised in place
                cycles = head_norm_cycles(qm, cfg.n_heads if site == "q" else cfg.n_kv_heads)
                work = 2 * (cfg.n_heads if site == "q" else cfg.n_kv_heads) * hd  # an element a cycle in, one out
                phases.append(Phase("qk_norm", f"{prefix}.{site}_norm", 0, cycles, cycles - work))
        k_cycles = next(p.cycles for p in reversed(phases) if p.name == f"{prefix}.k")
        v_cycles = phases[-1].cycles
        if cfg.positions == "rope":  # q rotates during the K projection, k during V; only an overhang costs
            rope_q, rope_k = cfg.n_heads * hd + ROPE_LATENCY + 1, cfg.n_kv_heads * hd + ROPE_LATENCY + 1
            phases.append(Phase("rope", f"{prefix}.rope", 0, max(0, rope_q - k_cycles) + max(0, rope_k - v_cycles) + 3,
                                3))
        else:
            phases.append(Phase("copy", f"{prefix}.rope", 0, (cfg.n_heads + cfg.n_kv_heads) * hd + 3, 3))  # q, k into place
        n = attended(windows[i], position)  # the keys it sees: a windowed layer's ring slots
        for h in range(cfg.n_heads):
            phases.append(_matvec("scores", f"{prefix}.head{h}.scores", n, hd, attn, plan,
                                  width=plan.epilogue_lanes if score_beat(plan, hd) > 1 else 1))
            words = -(-n // plan.softmax_lanes)  # the scores load while SCORES runs; then the exponent and output passes
            tail = 22 + SKID_LATENCY  # the last score through the softmax's input register, then its fixed steps
            phases.append(Phase("softmax", f"{prefix}.head{h}.softmax", 0, 2 * words + tail, tail))
            phases.append(_matvec("pv", f"{prefix}.head{h}.pv", hd, n, attn, plan))
        phases += mlp_phases(i, layer, ("o",))
        if layer.post_attn_norm is not None:
            phases += post_phases(f"{prefix}.post_attn")
        if not cfg.parallel_residual:
            phases.append(norm_phase(f"{prefix}.mlp_norm", layer.post_attn_norm is None))
            phases += mlp_phases(i, layer, ("gate", "up"))
        phases += mlp_phases(i, layer, ("down",))
        if layer.post_mlp_norm is not None:
            phases += post_phases(f"{prefix}.post_mlp")
    if not qm.has_head:  # a chain's earlier board: the residual update's registers settle, then it goes out
        phases.append(Phase("send", "residual out", 0, RESID_STAGE + d, RESID_STAGE))
        return phases
    phases.append(norm_phase("final_norm", qm.layers[-1].post_mlp_norm is None))
    phases.append(_matvec("matvec", "head", *qm.head.codes.shape, rows, plan, width=epilogue_width(qm, plan, "head")))
    phases.append(Phase("argmax", "argmax", 0, ARGMAX_LATENCY + 1, ARGMAX_LATENCY + 1))  # its stages; the token out
    phases.append(Phase("handshake", "token in, token out", 0, 1, 1))  # as the status counter sees a feed
    return phases


def macs_per_token(qm: QModel, position: int) -> int:
    """Multiply-accumulates for one token at `position` (0-based): projections, head, attention."""
    return sum(phase.macs for phase in schedule(qm, HardwarePlan(), position))


def cycles_per_token_estimate(qm: QModel, plan: HardwarePlan, position: int) -> int:
    """The static schedule's cycle count for one token at `position`."""
    return sum(phase.cycles for phase in schedule(qm, plan, position))


def latency_floor_cycles(qm: QModel, plan: HardwarePlan, position: int) -> int:
    """The token's dependency chain with unlimited MACs: the fixed latencies of its phases, one after another."""
    return sum(phase.latency for phase in schedule(qm, plan, position))


def weight_formats(qm: QModel) -> dict[tuple[str, int], list[str]]:
    """Projection names by storage format (scheme, code bits), in QModel order: one set of banks each."""
    formats: dict[tuple[str, int], list[str]] = {}
    for name, lin in qm.linears():
        formats.setdefault((lin.scheme, lin.bits), []).append(name)
    return formats


def row_code_bits(qm: QModel, plan: HardwarePlan, row: int) -> int:
    """Width of the signed codes row unit `row` multiplies: 8 on the attention rows (int8 K and V, and LoRA A on row
    0), else the widest decoded weight code (int, int_group: its bits; MXFP4: E2M1 x 2 reaches 12, 5 bits)."""
    if row < plan.attn_rows(qm.config.head_dim):
        return KV_BITS
    return max(5 if scheme == "mxfp4" else bits for scheme, bits in weight_formats(qm))


def row_input_bits(qm: QModel, plan: HardwarePlan) -> int:
    """Code bits that converge on the row units each cycle (each row's lanes at its widest code): the measure of an
    engine's wiring that separates the shapes measured to route from the one that did not (boards/parts.py,
    `Part.routable_input_bits`)."""
    return sum(plan.lanes * row_code_bits(qm, plan, row) for row in range(plan.rows))


def word_bits(plan: HardwarePlan, code_bits: int, scheme: str) -> int:
    """A stored weight word: `lanes` codes, plus the block shift of an MXFP4 or int_group word (rtl/weight_store.py)."""
    return plan.lanes * code_bits + SHIFT_FIELD_BITS[scheme]


def table_shapes(qm: QModel, plan: HardwarePlan) -> list[tuple[str, int, int]]:
    """(name, depth in words, word bits) of the embedding and learned-position tables, one row per lookup."""
    if not qm.has_embedding:
        return []
    tables = [("embed", qm.embed)] + ([("pos", qm.pos)] if qm.pos is not None else [])
    return [(name, table.codes.shape[0] * plan.chunks(table.codes.shape[1]), word_bits(plan, table.bits, table.scheme))
            for name, table in tables]


def weight_bank_shapes(qm: QModel, plan: HardwarePlan) -> list[tuple[str, int, int]]:
    """(name, depth in words, word bits) of every weight bank memory, as rtl/weight_banks.py builds them."""
    linears = dict(qm.linears())
    shapes = []
    for index, ((scheme, bits), names) in enumerate(weight_formats(qm).items()):
        depth = sum(-(-linears[n].codes.shape[0] // plan.rows) * plan.chunks(linears[n].codes.shape[1]) for n in names)
        shapes += [(f"weights{index}.bank{b}", depth, word_bits(plan, bits, scheme)) for b in range(plan.rows)]
    return shapes


def kv_layer_words(qm: QModel, plan: HardwarePlan) -> tuple[int, int]:
    """Words one layer's K and transposed-V cache take in each of the `attn_rows` banks (layers follow each other)."""
    attn, kvdim = plan.attn_rows(qm.config.head_dim), qm.config.n_kv_heads * qm.config.head_dim
    return -(-qm.context // attn) * (kvdim // plan.lanes), kvdim // attn * plan.chunks(qm.context)


def kv_bank_shapes(qm: QModel, plan: HardwarePlan) -> list[tuple[str, int, int]]:
    """(name, depth in words, word bits) of the K and transposed V cache banks: one pair per attention row, holding
    every layer (one layer reads at a time, so sharing the port costs nothing and keeps the banks full width)."""
    k_layer, v_layer = kv_layer_words(qm, plan)
    layers = qm.config.n_layers
    shapes = []
    for b in range(plan.attn_rows(qm.config.head_dim)):
        shapes.append((f"kcache{b}", layers * k_layer, plan.lanes * KV_BITS))
        shapes.append((f"vcache{b}", layers * v_layer, plan.lanes * KV_BITS))
    return shapes
