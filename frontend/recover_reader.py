"""The pieces every sublayer of an exported decoder is made of, read off the graph: projections (a MatMul or Gemm
by a constant matrix, with the bias it carries) and the norm in front of them (RMSNorm or LayerNorm, one op or spelled
out). recover_sublayers.py builds attention and the MLP from them; recover.py, the whole model.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .errors import ModelImportError
from .graph import GraphView
from .ir import Linear, Norm

LAYOUT_OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten"}


def f32_array(array: np.ndarray) -> np.ndarray:
    out = np.ascontiguousarray(array, dtype=np.float32)
    out.setflags(write=False)
    return out


def attribute(node: onnx.NodeProto, name: str, default: object) -> object:
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


class GraphReader:
    """The graph, and the one way every part of the recovery fails: naming the node it could not place."""

    def __init__(self, view: GraphView) -> None:
        self.view = view
        self.where = view.where
        self.folded: list[str] = []  # what import folded into existing IR fields, for ModelConfig.folded

    def fail(self, node: onnx.NodeProto | None, why: str) -> ModelImportError:
        place = f"could not place {self.view.label(node)}: " if node is not None else ""
        return ModelImportError(f"{self.where}: {place}{why}")

    # -- projections -----------------------------------------------------------------

    def is_projection(self, node: onnx.NodeProto) -> bool:
        if node.op_type not in ("MatMul", "Gemm"):
            return False
        static = self.view.static_inputs(node)
        return len(self.view.dynamic_inputs(node)) == 1 and len(static) >= 1 and self.view.value(node.input[1]).ndim == 2

    def linear(self, node: onnx.NodeProto) -> tuple[Linear, str]:
        """The projection's weight (out, in) and bias, and the value that carries its result."""
        view = self.view
        if not view.is_static(node.input[1]) or node.input[0] not in view.dynamic:
            raise self.fail(node, "a projection must multiply activations (left) by a constant matrix (right)")
        b = view.value(node.input[1]).astype(np.float64)
        bias = None
        if node.op_type == "MatMul":
            weight = b.T
        else:
            if attribute(node, "transA", 0):
                raise self.fail(node, "Gemm with transA=1 is not supported")
            weight = (b if attribute(node, "transB", 0) else b.T) * float(attribute(node, "alpha", 1.0))
            if len(node.input) > 2 and node.input[2]:
                if not view.is_static(node.input[2]):
                    raise self.fail(node, "Gemm bias must be a constant")
                bias = np.broadcast_to(view.value(node.input[2]), weight.shape[:1]) * float(attribute(node, "beta", 1.0))
        out = node.output[0]
        follow = [out] + [c.output[0] for c in view.consumers[out] if c.op_type == "Reshape"]
        for name in follow:
            for consumer in view.consumers[name]:
                static = view.static_inputs(consumer)
                if consumer.op_type == "Add" and len(static) == 1 and view.value(static[0]).size == weight.shape[0] \
                        and view.shape(static[0])[-1:] == weight.shape[:1]:
                    extra = view.value(static[0]).reshape(-1).astype(np.float64)
                    bias = extra if bias is None else bias + extra
                    return Linear(f32_array(weight), f32_array(bias)), consumer.output[0]
        return Linear(f32_array(weight), None if bias is None else f32_array(bias)), out

    def scalar(self, node: onnx.NodeProto) -> float | None:
        """The factor a Mul (or a Div of a dynamic value) by a constant scalar applies, else None."""
        view = self.view
        static = view.static_inputs(node)
        if node.op_type not in ("Mul", "Div") or len(static) != 1 or view.value(static[0]).size != 1:
            return None
        if node.op_type == "Div" and node.input[1] != static[0]:
            return None
        value = float(view.value(static[0]).reshape(()))
        return 1 / value if node.op_type == "Div" else value

    def scale_between(self, start: str, end: str) -> float:
        """The product of the constant scalars multiplying the dynamic path from START to END (END's producer
        included): Granite's residual and logits multipliers, Cohere's logit scale."""
        scale = 1.0
        for node in self.view.nodes_between({start}, end):
            factor = self.scalar(node)
            scale *= 1.0 if factor is None else factor
        return scale

    def graph_constant(self, table: str, fitted: np.ndarray) -> np.ndarray:
        """The constant among those TABLE is computed from that holds FITTED's values (RoPE's inv_freq, ALiBi's
        slopes: exactly the model's), or FITTED when none does."""
        view = self.view
        seen, stack = set(), [table]
        while stack:
            name = stack.pop()
            if name in seen or name in view.dynamic:
                continue
            seen.add(name)
            value = view.values.get(name)
            if value is not None and value.size == fitted.size and np.issubdtype(value.dtype, np.floating) \
                    and np.allclose(value.reshape(-1).astype(np.float64), fitted, rtol=1e-4, atol=1e-7):
                return value.reshape(-1).astype(np.float64)
            if name in view.producer:
                stack.extend(i for i in view.producer[name].input if i)
        return fitted

    @staticmethod
    def scaled(lin: Linear, factor: float) -> Linear:
        """LIN with its output times FACTOR (weights and bias), or LIN itself for a factor of one."""
        if factor == 1.0:
            return lin
        return Linear(f32_array(lin.weight.astype(np.float64) * factor),
                      None if lin.bias is None else f32_array(lin.bias.astype(np.float64) * factor))

    # -- norms -----------------------------------------------------------------------

    def norm(self, residual: str, normed: str, d_model: int, consumer: onnx.NodeProto) -> tuple[Norm, str, float]:
        view = self.view
        nodes = view.nodes_between({residual}, normed)
        if not nodes:
            raise self.fail(consumer, "no normalisation between the residual stream and this projection; "
                                      "supported: RMSNorm and LayerNorm before each sublayer (pre-norm)")
        for node in nodes:
            if node.op_type == "LayerNormalization":
                if int(attribute(node, "axis", -1)) not in (-1, len(view.shape(node.input[0])) - 1):
                    raise self.fail(node, "LayerNormalization must normalise the last axis")
                weight = view.value(node.input[1])
                bias = view.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
                eps = float(attribute(node, "epsilon", 1e-5))
                return Norm(f32_array(weight), None if bias is None else f32_array(bias)), "layer", eps
        kind = "layer" if any(n.op_type == "Sub" for n in nodes) else "rms"
        if not any(n.op_type == "ReduceMean" for n in nodes):
            raise self.fail(nodes[-1], "expected a normalisation (ReduceMean over the last axis) before this projection")
        eps = None
        weight = np.ones(d_model)
        bias = None
        for node in nodes:
            static = view.static_inputs(node)
            if len(static) != 1:
                continue
            value = view.value(static[0])
            dyn = view.dynamic_inputs(node)
            feeds_from_mean = bool(dyn) and dyn[0] in view.producer and view.producer[dyn[0]].op_type == "ReduceMean"
            if node.op_type == "Add" and value.size == 1 and feeds_from_mean:
                eps = float(value.reshape(()))
            elif node.op_type == "Mul" and value.shape[-1:] == (d_model,) and value.size == d_model:
                weight = value.reshape(-1)
            elif node.op_type == "Add" and value.shape[-1:] == (d_model,) and value.size == d_model:
                bias = value.reshape(-1)
        if eps is None:
            raise self.fail(nodes[-1], "could not find the norm's epsilon (an Add of a constant to the mean of squares)")
        return Norm(f32_array(weight), None if bias is None else f32_array(bias)), kind, eps

    # -- sublayers -------------------------------------------------------------------

    def projections(self, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
        return [n for n in nodes if self.is_projection(n)]
