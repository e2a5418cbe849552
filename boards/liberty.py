"""Liberty files read, and a static timing analysis of a cell netlist with their delays.

yosys maps a design to a liberty library's cells (`dfflibmap`, `abc -liberty`) and sums their areas (`stat
-liberty`), but the yowasp build has neither OpenSTA nor a way to read ABC's own timing report (`stime`), and
yosys's `sta` wants timing in Verilog specify blocks. So the critical path is computed here, from the library's
non-linear delay model (NLDM) tables: every timing arc's `cell_rise`/`cell_fall` delay and `rise_transition`/
`fall_transition` slew looked up (bilinear interpolation, linear extrapolation past the table) at the input slew
and the output load (the input pin capacitances the net drives), the worst of rise and fall taken at every arc
(no unateness: a bound, slightly pessimistic), launched by the flip-flops' clock-to-Q arcs and captured at their
setup constraints with an ideal clock. No wires: the net load is pin capacitance only, as before placement.
"""

from __future__ import annotations

import bisect
import gzip
import re
from dataclasses import dataclass, field
from pathlib import Path

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}();:,]|[^\s{}();:,"\\]+|\\')


@dataclass
class Group:
    """One liberty group: `kind (args) { name : value; name (values); subgroups }`."""

    kind: str
    args: list[str]
    attrs: dict[str, object] = field(default_factory=dict)
    groups: list[Group] = field(default_factory=list)

    def find(self, kind: str) -> list[Group]:
        return [g for g in self.groups if g.kind == kind]


def _unquote(token: str) -> str:
    return token[1:-1] if token.startswith('"') else token


def parse_groups(text: str) -> list[Group]:
    """Every top-level group of a liberty text (comments removed, line continuations joined)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S).replace("\\\n", " ")
    tokens = [t for t in _TOKEN.findall(text) if t != "\\"]
    pos = 0
    root = Group("root", [])
    stack = [root]
    while pos < len(tokens):
        tok = tokens[pos]
        if tok == "}":
            stack.pop()
            pos += 1
            continue
        if tok == ";":
            pos += 1
            continue
        name = tok
        nxt = tokens[pos + 1] if pos + 1 < len(tokens) else ";"
        if nxt == ":":  # simple attribute: name : value ;
            stack[-1].attrs[name] = _unquote(tokens[pos + 2])
            pos += 3
            continue
        if nxt == "(":  # group or complex attribute: name ( args ) { ... } | ;
            end = tokens.index(")", pos + 2)
            args = [_unquote(t) for t in tokens[pos + 2:end] if t != ","]
            pos = end + 1
            if pos < len(tokens) and tokens[pos] == "{":
                group = Group(name, args)
                stack[-1].groups.append(group)
                stack.append(group)
                pos += 1
            else:
                stack[-1].attrs[name] = args
            continue
        pos += 1  # a stray token: skip it
    return root.groups


@dataclass
class Table:
    """A 1-D or 2-D NLDM table: index_1 (input slew) x index_2 (output load) -> values."""

    index_1: list[float]
    index_2: list[float]
    values: list[list[float]]

    @classmethod
    def of(cls, group: Group) -> Table:
        floats = lambda s: [float(x) for x in str(s).replace(",", " ").split()]  # noqa: E731
        index_1 = floats(group.attrs.get("index_1", ["0"])[0])
        index_2 = floats(group.attrs["index_2"][0]) if "index_2" in group.attrs else [0.0]
        rows = [floats(row) for row in group.attrs["values"]]
        if len(index_2) == 1 and len(rows) == 1 and len(rows[0]) == len(index_1) > 1:
            rows = [[v] for v in rows[0]]  # a 1-D table written as one row over index_1
        return cls(index_1, index_2, rows)

    def lookup(self, x: float, y: float) -> float:
        i, fx = _segment(self.index_1, x)
        j, fy = _segment(self.index_2, y)
        v = self.values
        if len(self.index_2) == 1:
            return v[i][0] + (v[i + 1][0] - v[i][0]) * fx if len(self.index_1) > 1 else v[0][0]
        if len(self.index_1) == 1:
            return v[0][j] + (v[0][j + 1] - v[0][j]) * fy
        a = v[i][j] + (v[i][j + 1] - v[i][j]) * fy
        b = v[i + 1][j] + (v[i + 1][j + 1] - v[i + 1][j]) * fy
        return a + (b - a) * fx


def _segment(index: list[float], x: float) -> tuple[int, float]:
    """The table segment around x and where x lies in it (below 0 or above 1: linear extrapolation)."""
    if len(index) == 1:
        return 0, 0.0
    k = min(max(bisect.bisect_right(index, x) - 1, 0), len(index) - 2)
    return k, (x - index[k]) / (index[k + 1] - index[k])


@dataclass
class Arc:
    related: str
    kind: str  # timing_type: combinational, rising_edge, setup_rising, ...
    delay: list[Table]  # cell_rise, cell_fall (or rise/fall_constraint for setup)
    slew: list[Table]


@dataclass
class Cell:
    name: str
    area: float
    sequential: bool
    inputs: dict[str, float]  # pin -> capacitance
    outputs: dict[str, list[Arc]]  # pin -> arcs ending there
    constraints: dict[str, list[Arc]]  # data pin -> setup arcs


@dataclass
class Library:
    name: str
    time_unit_ns: float
    cells: dict[str, Cell]
    default_slew: float

    @property
    def areas(self) -> dict[str, float]:
        return {name: cell.area for name, cell in self.cells.items()}


def read_text(path: Path) -> str:
    return (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)).read()


def parse_library(text: str, only: set[str] | None = None) -> Library:
    """The cells of a liberty text (all, or the `only` ones: parsing 400 cells of NLDM tables takes a while)."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r'^\s*cell\s*\(\s*"?([^")\s]+)"?\s*\)', text, re.M)]
    header = text[:starts[0][0]] if starts else text
    name = re.search(r'library\s*\(\s*"?([^")\s]+)', header).group(1)
    unit = re.search(r'time_unit\s*:\s*"?1?(\d*)\s*([munp]?s)"?', header)
    scale = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0, "ps": 1e-3}[unit.group(2)] * float(unit.group(1) or 1)
    cells: dict[str, Cell] = {}
    smallest_slew = None
    for k, (start, cell_name) in enumerate(starts):
        if only is not None and cell_name not in only:
            continue
        end = starts[k + 1][0] if k + 1 < len(starts) else len(text)
        (group,) = [g for g in parse_groups(text[start:end]) if g.kind == "cell"][:1]
        cells[cell_name] = _cell(group)
        for arcs in cells[cell_name].outputs.values():
            for arc in arcs:
                for table in arc.delay:
                    smallest_slew = table.index_1[0] if smallest_slew is None else min(smallest_slew, table.index_1[0])
    return Library(name, scale, cells, smallest_slew or 0.0)


def _cell(group: Group) -> Cell:
    inputs: dict[str, float] = {}
    outputs: dict[str, list[Arc]] = {}
    constraints: dict[str, list[Arc]] = {}
    pins = list(group.find("pin"))
    for bus in group.find("bus"):
        pins.extend(bus.find("pin"))
    for pin in pins:
        direction = pin.attrs.get("direction")
        for pin_name in pin.args:
            if direction == "input":
                inputs[pin_name] = float(pin.attrs.get("capacitance", 0.0))
            arcs = []
            for timing in pin.find("timing"):
                kind = str(timing.attrs.get("timing_type", "combinational"))
                related = str(timing.attrs.get("related_pin", ""))
                tables = {g.kind: Table.of(g) for g in timing.groups if "values" in g.attrs}
                if kind.startswith("setup"):
                    delay = [tables[k] for k in ("rise_constraint", "fall_constraint") if k in tables]
                    if delay:
                        constraints.setdefault(pin_name, []).append(Arc(related, kind, delay, []))
                    continue
                delay = [tables[k] for k in ("cell_rise", "cell_fall") if k in tables]
                if delay and kind in ("combinational", "combinational_rise", "combinational_fall", "rising_edge",
                                      "falling_edge"):
                    slew = [tables[k] for k in ("rise_transition", "fall_transition") if k in tables]
                    arcs.append(Arc(related, kind, delay, slew))
            if direction == "output":
                outputs[pin_name] = arcs
    sequential = bool(group.find("ff") or group.find("latch") or group.find("ff_bank"))
    return Cell(group.args[0], float(group.attrs.get("area", 0.0)), sequential, inputs, outputs, constraints)


def static_timing(module: dict, library: Library, top_ports: bool = True) -> dict:
    """The longest register-to-register (and port) path of a flattened yosys JSON module mapped to `library`.

    Returns the path's delay in ns (clock-to-Q + logic + setup), the clock it allows, its endpoints and the cells on
    it. Cells that are not in the library (memories kept as macros) are path boundaries: their outputs launch at 0
    and their inputs are endpoints; the macros' own read time is checked apart from this.
    """
    cells = module["cells"]

    def is_output(cell: dict, pin: str) -> bool:
        lib_cell = library.cells.get(cell["type"])
        if lib_cell is not None:  # yosys writes no port_directions for cells it knows only by name
            return pin in lib_cell.outputs
        return cell.get("port_directions", {}).get(pin) == "output"

    drivers: dict[int, tuple[str, str]] = {}
    loads: dict[int, list[tuple[str, str]]] = {}
    for name, cell in cells.items():
        for pin, bits in cell["connections"].items():
            output = is_output(cell, pin)
            for bit in bits:
                if isinstance(bit, str):
                    continue  # a constant
                if output:
                    drivers[bit] = (name, pin)
                else:
                    loads.setdefault(bit, []).append((name, pin))

    def load_cap(bit: int) -> float:
        total = 0.0
        for name, pin in loads.get(bit, ()):
            lib_cell = library.cells.get(cells[name]["type"])
            if lib_cell is not None:
                total += lib_cell.inputs.get(pin, 0.0)
        return total

    arrival: dict[int, float] = {}
    slew: dict[int, float] = {}
    via: dict[int, tuple[str, int | None]] = {}  # bit -> (cell that drives it, the input bit on the worst arc)
    start_slew = library.default_slew

    def launch(bit: int, time: float, out_slew: float, cell_name: str) -> None:
        arrival[bit], slew[bit], via[bit] = time, out_slew, (cell_name, None)

    # start points: top inputs, flip-flop outputs (clock-to-Q), outputs of cells outside the library
    if top_ports:
        for port in module.get("ports", {}).values():
            if port["direction"] == "input":
                for bit in port["bits"]:
                    if not isinstance(bit, str):
                        launch(bit, 0.0, start_slew, "<input>")
    pending: dict[str, int] = {}
    for name, cell in cells.items():
        lib_cell = library.cells.get(cell["type"])
        if lib_cell is None or lib_cell.sequential:
            for pin, bits in cell["connections"].items():
                if not is_output(cell, pin):
                    continue
                for bit in bits:
                    if isinstance(bit, str):
                        continue
                    if lib_cell is None:
                        launch(bit, 0.0, start_slew, name)
                        continue
                    cap = load_cap(bit)
                    arcs = lib_cell.outputs.get(pin, [])
                    delay = max((t.lookup(start_slew, cap) for arc in arcs for t in arc.delay), default=0.0)
                    out_slew = max((t.lookup(start_slew, cap) for arc in arcs for t in arc.slew), default=start_slew)
                    launch(bit, delay * library.time_unit_ns, out_slew, name)
        else:
            pending[name] = sum(1 for pin, bits in cell["connections"].items()
                                if not is_output(cell, pin) for b in bits
                                if not isinstance(b, str) and b in drivers)
    # propagate through the combinational cells in topological order (Kahn)
    ready = [name for name, count in pending.items() if count == 0]
    fanout: dict[int, list[str]] = {}
    for name in pending:
        for pin, bits in cells[name]["connections"].items():
            if not is_output(cells[name], pin):
                for bit in bits:
                    if not isinstance(bit, str) and bit in drivers:
                        fanout.setdefault(bit, []).append(name)
    bit_done = set(arrival)
    queue_bits = list(arrival)
    while ready or queue_bits:
        while queue_bits:
            bit = queue_bits.pop()
            for name in fanout.get(bit, ()):
                pending[name] -= 1
                if pending[name] == 0:
                    ready.append(name)
        if not ready:
            break
        name = ready.pop()
        cell = cells[name]
        lib_cell = library.cells[cell["type"]]
        conns = cell["connections"]
        for pin, arcs in lib_cell.outputs.items():
            for bit in conns.get(pin, ()):
                if isinstance(bit, str):
                    continue
                cap = load_cap(bit)
                best, best_slew, best_from = 0.0, start_slew, None
                for arc in arcs:
                    for in_bit in conns.get(arc.related, ()):
                        if isinstance(in_bit, str) or in_bit not in arrival:
                            continue
                        s_in = slew[in_bit]
                        t = arrival[in_bit] + max(tb.lookup(s_in, cap) for tb in arc.delay) * library.time_unit_ns
                        s_out = max((tb.lookup(s_in, cap) for tb in arc.slew), default=s_in)
                        if best_from is None or t > best:
                            best, best_from = t, in_bit
                        best_slew = max(best_slew, s_out)
                arrival[bit], slew[bit], via[bit] = best, best_slew, (name, best_from)
                if bit not in bit_done:
                    bit_done.add(bit)
                    queue_bits.append(bit)
    unresolved = [name for name, count in pending.items() if count > 0]
    # endpoints: flip-flop data pins (+ setup), inputs of cells outside the library, top outputs
    worst, worst_end, worst_bit = 0.0, None, None
    for name, cell in cells.items():
        lib_cell = library.cells.get(cell["type"])
        if lib_cell is not None and not lib_cell.sequential:
            continue
        for pin, bits in cell["connections"].items():
            if is_output(cell, pin):
                continue
            for bit in bits:
                if isinstance(bit, str) or bit not in arrival:
                    continue
                setup = 0.0
                if lib_cell is not None:
                    setup = max((t.lookup(start_slew, slew[bit]) for arc in lib_cell.constraints.get(pin, [])
                                 for t in arc.delay), default=0.0) * library.time_unit_ns
                if arrival[bit] + setup > worst:
                    worst, worst_end, worst_bit = arrival[bit] + setup, f"{name}.{pin}", bit
    if top_ports:
        for port_name, port in module.get("ports", {}).items():
            if port["direction"] == "output":
                for bit in port["bits"]:
                    if not isinstance(bit, str) and bit in arrival and arrival[bit] > worst:
                        worst, worst_end, worst_bit = arrival[bit], port_name, bit
    path: list[str] = []
    bit = worst_bit
    while bit is not None and len(path) < 10_000:
        cell_name, bit = via.get(bit, ("?", None))
        path.append(cells[cell_name]["type"] if cell_name in cells else cell_name)
    path.reverse()
    return {"critical_path_ns": round(worst, 4), "max_clock_mhz": round(1000.0 / worst, 1) if worst > 0 else None,
            "endpoint": worst_end, "path_cells": path, "path_depth": max(len(path) - 1, 0),
            "combinational_loops": len(unresolved)}
