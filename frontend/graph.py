"""A graph view that separates what depends on token values from what does not.

Exporters wrap a transformer in shape arithmetic, position ranges and causal-mask
logic. All of it depends on the sequence length only. The probe runs the graph once in
onnxruntime at a fixed length with every intermediate exposed, so each such value is a
plain constant; what is left "dynamic" (depending on the token ids) is the decoder the
recovery pass has to place.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import onnx
import onnxruntime as ort

from .errors import ModelImportError

# Ops whose output never depends on the values of their input, only on its shape.
_SHAPE_ONLY = {"Shape", "Size"}


def ort_session(proto: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


class GraphView:
    """Nodes in topological order, producer/consumer maps, and the probe's values."""

    def __init__(self, proto: onnx.ModelProto, input_name: str, probe_ids: np.ndarray, where: str) -> None:
        self.where = where
        self.nodes = list(proto.graph.node)
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in self.nodes:
            for out in node.output:
                if out:
                    self.producer[out] = node
            for inp in node.input:
                if inp:
                    self.consumers[inp].append(node)
        self.input_name = input_name
        self.proto = proto
        self.probe_dtype = probe_ids.dtype
        self.dynamic = self._dynamic_values(input_name)
        self.values = self._probe(proto, probe_ids)

    def _dynamic_values(self, input_name: str) -> set[str]:
        dynamic = {input_name}
        for node in self.nodes:  # ONNX requires topological order
            if node.op_type in _SHAPE_ONLY:
                continue
            if any(i in dynamic for i in node.input if i):
                dynamic.update(o for o in node.output if o)
        return dynamic

    def _probe(self, proto: onnx.ModelProto, probe_ids: np.ndarray) -> dict[str, np.ndarray]:
        probe = onnx.ModelProto()
        probe.CopyFrom(proto)
        names = [o for node in self.nodes for o in node.output if o]
        del probe.graph.output[:]
        probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
        try:
            outputs = ort_session(probe).run(None, {self.input_name: probe_ids})
        except Exception as err:  # onnxruntime reports invalid graphs with its own exception types
            raise ModelImportError(f"{self.where}: onnxruntime cannot run the graph: {err}") from err
        values = dict(zip(names, outputs, strict=True))
        for init in proto.graph.initializer:
            values[init.name] = onnx.numpy_helper.to_array(init)
        return values

    def evaluate_at(self, names: list[str], length: int) -> dict[str, np.ndarray]:
        """NAMES evaluated at sequence LENGTH rather than the probe's, running only the nodes they depend on (for
        masks: shape logic, a few ranges and comparisons)."""
        needed, keep = set(names), []
        for node in reversed(self.nodes):
            if any(o in needed for o in node.output):
                keep.append(node)
                needed.update(i for i in node.input if i)
        sub = onnx.ModelProto()
        sub.CopyFrom(self.proto)
        graph = sub.graph
        del graph.node[:]
        graph.node.extend(reversed(keep))
        kept = [t for t in graph.initializer if t.name in needed]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        inputs = [i for i in graph.input if i.name in needed]
        del graph.input[:]
        graph.input.extend(inputs)
        del graph.output[:]
        graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
        feed = {self.input_name: np.zeros((1, length), dtype=self.probe_dtype)} \
            if any(i.name == self.input_name for i in inputs) else {}
        try:
            outputs = ort_session(sub).run(None, feed)
        except Exception as err:  # onnxruntime's own exception types
            raise ModelImportError(f"{self.where}: onnxruntime cannot evaluate the attention mask at length {length}: "
                                   f"{err}") from err
        return dict(zip(names, outputs, strict=True))

    # -- queries -------------------------------------------------------------------

    def is_static(self, name: str) -> bool:
        return bool(name) and name not in self.dynamic

    def value(self, name: str) -> np.ndarray:
        return self.values[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(np.shape(self.values[name]))

    def dynamic_inputs(self, node: onnx.NodeProto) -> list[str]:
        return [i for i in node.input if i in self.dynamic]

    def static_inputs(self, node: onnx.NodeProto) -> list[str]:
        return [i for i in node.input if self.is_static(i)]

    def descendants(self, names: Iterable[str]) -> set[str]:
        """Dynamic values reachable from NAMES (inclusive)."""
        seen, stack = set(), list(names)
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in self.consumers.get(name, []):
                stack.extend(o for o in node.output if o in self.dynamic)
        return seen

    def ancestors(self, name: str, stop: set[str]) -> set[str]:
        """Dynamic values NAME depends on, not looking past the values in STOP (which are included)."""
        seen, stack = set(), [name]
        while stack:
            cur = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if cur in stop or cur not in self.producer:
                continue
            stack.extend(self.dynamic_inputs(self.producer[cur]))
        return seen

    def nodes_between(self, start: set[str], end: str) -> list[onnx.NodeProto]:
        """Nodes (in graph order) on dynamic paths from START to END, END's producer included."""
        inside = (self.ancestors(end, stop=start) & self.descendants(start)) - start
        return [n for n in self.nodes if any(o in inside for o in n.output)]

    def label(self, node: onnx.NodeProto) -> str:
        return f"{node.op_type} node '{node.name or node.output[0]}'"
