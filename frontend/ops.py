"""The registry of ONNX ops hardwire's frontend knows, keyed by op type.

Each op has one role, which says how the recovery pass treats it:

- "shape": computes shapes, indices or masks. It depends on the sequence length only,
  so the probe evaluates it to a constant and the hardware never sees it.
- "linear": a matrix product; with a constant operand it is a projection whose weight
  hardwire bakes into the chip, with two activations it is attention.
- "norm", "activation", "attention", "elementwise", "layout": the pieces of the
  decoder block the recovery pass places (see recover.py).

An op outside this table fails import with its name, the node and this list.
"""

from __future__ import annotations

import onnx

from .errors import ModelImportError

SUPPORTED_OPS: dict[str, str] = {
    # projections and attention products
    "MatMul": "linear", "Gemm": "linear",
    # embeddings and indexing
    "Gather": "elementwise", "GatherND": "shape", "GatherElements": "shape",
    # normalisation
    "LayerNormalization": "norm", "ReduceMean": "norm", "Sqrt": "norm", "Reciprocal": "norm", "Pow": "norm",
    # activations and softmax
    "Sigmoid": "activation", "Tanh": "activation", "Erf": "activation", "Gelu": "activation", "Relu": "activation",
    "Softmax": "attention",
    # arithmetic
    "Add": "elementwise", "Sub": "elementwise", "Mul": "elementwise", "Div": "elementwise", "Neg": "elementwise",
    "Cos": "elementwise", "Sin": "elementwise",
    # layout: reshapes and moves, no arithmetic
    "Reshape": "layout", "Transpose": "layout", "Concat": "layout", "Split": "layout", "Slice": "layout",
    "Unsqueeze": "layout", "Squeeze": "layout", "Expand": "layout", "Identity": "layout", "Cast": "layout",
    "Flatten": "layout",
    # shape and mask computation, folded away by the probe
    "Shape": "shape", "Size": "shape", "Constant": "shape", "ConstantOfShape": "shape", "Range": "shape",
    "Trilu": "shape", "Where": "shape", "Equal": "shape", "Less": "shape", "LessOrEqual": "shape",
    "Greater": "shape", "GreaterOrEqual": "shape", "And": "shape", "Or": "shape", "Not": "shape",
    "IsNaN": "shape", "IsInf": "shape", "CumSum": "shape", "Max": "shape", "Min": "shape", "Abs": "shape",
    "Floor": "shape", "Ceil": "shape", "Mod": "shape", "ScatterND": "shape",
    "Tile": "shape",  # BLOOM repeats its ALiBi bias per batch row: constant at the probe
}


def check_ops(graph: onnx.GraphProto, where: str) -> None:
    """Refuse the first node whose op (or domain) the frontend does not know."""
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            raise ModelImportError(f"{where}: unsupported op {op} in node '{node.name or node.output[0]}'; "
                                   f"supported ops: {', '.join(sorted(SUPPORTED_OPS))}")
