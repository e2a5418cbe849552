"""ONNX frontend: read an exported decoder-only LM into a ModelIR and prove the reading.

    ir = hardwire.frontend.load("models/tinyshakespeare.onnx")
    print(ir.config, ir.proof.summary())
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import onnx

from .errors import ModelImportError
from .float_model import float_forward
from .graph import GraphView
from .ir import Layer, Linear, ModelConfig, ModelIR, Norm
from .onnx_file import check_finite, largest_weight, read_onnx
from .ops import SUPPORTED_OPS, check_ops
from .proof import Proof, prove
from .recover import recover

__all__ = [
    "SUPPORTED_OPS",
    "Layer",
    "Linear",
    "ModelConfig",
    "ModelIR",
    "ModelImportError",
    "Norm",
    "Proof",
    "float_forward",
    "load",
]

_TOKEN_TYPES = {onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32}
PROBE_LENGTH = 8  # sequence length at which shape logic is folded to constants


def _describe(value: onnx.ValueInfoProto) -> str:
    tensor = value.type.tensor_type
    dims = [d.dim_param or d.dim_value for d in tensor.shape.dim]
    return f"{value.name}: {onnx.TensorProto.DataType.Name(tensor.elem_type)} {dims}"


def _token_input(graph: onnx.GraphProto, where: str) -> tuple[str, type, int | None]:
    """The graph's one token-id input: its name, dtype and fixed sequence length (None if dynamic)."""
    initializers = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    ok = len(inputs) == 1 and inputs[0].type.HasField("tensor_type") \
        and inputs[0].type.tensor_type.elem_type in _TOKEN_TYPES and len(inputs[0].type.tensor_type.shape.dim) == 2
    if not ok:
        found = "; ".join(_describe(i) for i in inputs) or "none"
        raise ModelImportError(f"{where}: not a decoder-only language model: expected one integer input of token ids "
                               f"shaped (batch, seq); found inputs {found}")
    tensor = inputs[0].type.tensor_type
    batch, seq = tensor.shape.dim
    if batch.HasField("dim_value") and batch.dim_value != 1:
        raise ModelImportError(f"{where}: the token input has a fixed batch of {batch.dim_value}; hardwire decodes "
                               "one sequence at a time (export with batch 1 or a dynamic batch)")
    fixed = seq.dim_value if seq.HasField("dim_value") else None
    return inputs[0].name, _TOKEN_TYPES[tensor.elem_type], fixed


def _metadata(proto: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in proto.metadata_props}


def load(path: str | os.PathLike[str], *, verify: bool = True) -> ModelIR:
    """Read PATH into a ModelIR; with verify (the default), prove it against onnxruntime or raise."""
    where = str(path)
    model = read_onnx(path)  # checked bytes, external data only from the model's folder
    proto = model.proto
    check_finite(proto, where)  # a NaN or infinite weight, named, before anything runs the graph
    name, dtype, fixed = _token_input(proto.graph, where)  # one (batch, seq) token input
    check_ops(proto.graph, where)  # every op in the registry
    probe_len = fixed or PROBE_LENGTH
    probe_ids = (np.arange(probe_len) % 2).reshape(1, probe_len).astype(dtype)
    view = GraphView(proto, name, probe_ids, where)  # shape logic folded at a fixed length
    meta = _metadata(proto)
    context = int(meta["hardwire.context"]) if meta.get("hardwire.context", "").isdigit() else None
    ir = recover(view, context)  # place every part of the decoder
    if "hardwire.vocab" in meta:
        vocab = tuple(json.loads(meta["hardwire.vocab"]))
        if len(vocab) != ir.config.vocab_size:
            raise ModelImportError(f"{where}: metadata vocabulary has {len(vocab)} entries, the embedding "
                                   f"{ir.config.vocab_size}")
        ir = dataclasses.replace(ir, vocab=vocab)
    ir = dataclasses.replace(ir, source=where)
    if not verify:
        return ir
    longest = min(filter(None, (fixed, ir.config.context, 32)))
    lengths = (fixed,) if fixed else tuple(sorted({min(2, longest), min(7, longest), longest}))
    windows = [w for w in ir.config.attn_windows or () if w is not None]
    if windows and not fixed:  # a window bites beyond its length only: prove one sequence past the longest
        lengths = tuple(sorted({*lengths, min(max(windows) + 8, ir.config.context or max(windows) + 8)}))
    proof = prove(ir, proto, name, dtype, lengths)  # the IR's float forward against onnxruntime
    if proof.non_finite is not None:  # the weights are finite (checked above): their size overflows float32
        what, peak = largest_weight(proto)
        raise ModelImportError(f"{where}: {proof.vacuous}; the largest weight is {what} (max |w| = {peak:.3g})")
    if proof.vacuous is not None:
        raise ModelImportError(f"{where}: {proof.vacuous}")
    if not proof.passed:
        raise ModelImportError(f"{where}: the recovered model does not reproduce onnxruntime's logits: "
                               f"{proof.summary()}")
    return dataclasses.replace(ir, proof=proof)
