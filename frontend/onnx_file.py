"""Reading an ONNX file without trusting it.

onnx.load follows external-data paths wherever they point and allocates whatever an
initializer declares. A model file is input from a user, so this module parses the
protobuf without external data, checks every initializer's declared size against the
bytes that really exist, refuses external data outside the model's folder before
opening anything, and only then builds the arrays itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .errors import ModelImportError

# Initializer element types hardwire reads, with their byte sizes.
_ELEMENT_BYTES = {
    TensorProto.FLOAT: 4, TensorProto.DOUBLE: 8, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2,
    TensorProto.INT64: 8, TensorProto.INT32: 4, TensorProto.INT16: 2, TensorProto.INT8: 1,
    TensorProto.UINT8: 1, TensorProto.BOOL: 1,
}
MAX_TENSOR_BYTES = 1 << 31  # 2 GiB: far beyond any model hardwire can put on a chip


@dataclass(frozen=True)
class OnnxModel:
    """A parsed model whose initializers are all inline and checked."""

    proto: onnx.ModelProto  # graph with every initializer inline
    folder: Path  # the model's folder, the only place external data may come from


def _declared_bytes(tensor: TensorProto, where: str) -> int:
    if tensor.data_type not in _ELEMENT_BYTES:
        kind = TensorProto.DataType.Name(tensor.data_type)
        raise ModelImportError(f"{where}: initializer '{tensor.name}' has element type {kind}; "
                               f"supported: {', '.join(TensorProto.DataType.Name(t) for t in _ELEMENT_BYTES)}")
    count = 1
    for dim in tensor.dims:
        if dim < 0:
            raise ModelImportError(f"{where}: initializer '{tensor.name}' has a negative dimension {list(tensor.dims)}")
        count *= dim
    nbytes = count * _ELEMENT_BYTES[tensor.data_type]
    if nbytes > MAX_TENSOR_BYTES:
        raise ModelImportError(f"{where}: initializer '{tensor.name}' declares shape {list(tensor.dims)} "
                               f"({nbytes} bytes), over the {MAX_TENSOR_BYTES} byte limit; refused without reading it")
    return nbytes


def _external_entries(tensor: TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _resolve_external(tensor: TensorProto, folder: Path, where: str) -> tuple[Path, int, int | None]:
    entries = _external_entries(tensor)
    location = entries.get("location", "")
    if not location:
        raise ModelImportError(f"{where}: initializer '{tensor.name}' is external but names no location")
    candidate = Path(location)
    resolved = (folder / candidate).resolve()
    if candidate.is_absolute() or not resolved.is_relative_to(folder.resolve()):
        raise ModelImportError(f"{where}: initializer '{tensor.name}' points its external data at '{location}', "
                               f"outside the model's folder {folder}; refused (external data must lie beside the model)")
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else None
    except ValueError as err:
        raise ModelImportError(f"{where}: initializer '{tensor.name}' has a malformed external-data offset or length") from err
    return resolved, offset, length


_TYPED_FIELD = {
    TensorProto.FLOAT: "float_data", TensorProto.DOUBLE: "double_data", TensorProto.INT64: "int64_data",
    TensorProto.INT32: "int32_data", TensorProto.INT16: "int32_data", TensorProto.INT8: "int32_data",
    TensorProto.UINT8: "int32_data", TensorProto.BOOL: "int32_data", TensorProto.FLOAT16: "int32_data",
    TensorProto.BFLOAT16: "int32_data",
}


def _check_inline(tensor: TensorProto, nbytes: int, where: str) -> None:
    element = _ELEMENT_BYTES[tensor.data_type]
    if tensor.HasField("raw_data"):
        held = len(tensor.raw_data)
    else:
        held = len(getattr(tensor, _TYPED_FIELD[tensor.data_type])) * element
    if held != nbytes:
        raise ModelImportError(f"{where}: initializer '{tensor.name}' declares shape {list(tensor.dims)} "
                               f"({nbytes} bytes) but holds {held} bytes")


def _load_external(tensor: TensorProto, folder: Path, nbytes: int, where: str) -> None:
    """Replace an external reference with the bytes it names, after checking them."""
    path, offset, length = _resolve_external(tensor, folder, where)
    if length is not None and length != nbytes:
        raise ModelImportError(f"{where}: initializer '{tensor.name}' declares {nbytes} bytes but its external "
                               f"data entry says {length}")
    if not path.is_file():
        raise ModelImportError(f"{where}: external data file '{path.name}' for initializer '{tensor.name}' is missing")
    size = path.stat().st_size
    if offset < 0 or offset + nbytes > size:
        raise ModelImportError(f"{where}: initializer '{tensor.name}' wants bytes {offset}..{offset + nbytes} of "
                               f"'{path.name}', which holds {size} bytes (truncated?)")
    with path.open("rb") as fh:
        fh.seek(offset)
        data = fh.read(nbytes)
    tensor.raw_data = data
    tensor.data_location = TensorProto.DEFAULT
    del tensor.external_data[:]


def read_onnx(path: str | os.PathLike[str]) -> OnnxModel:
    """Parse PATH, inline and check every initializer, or raise ModelImportError saying why."""
    path = Path(path)
    where = str(path)
    if not path.exists():
        raise ModelImportError(f"{where}: model file not found")
    if not path.is_file():
        raise ModelImportError(f"{where}: not a file")
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except Exception as err:  # protobuf raises DecodeError, RuntimeError or ValueError depending on the damage
        raise ModelImportError(f"{where}: not a readable ONNX model (truncated, corrupt or not ONNX): "
                               "the protobuf does not parse") from err
    if not proto.HasField("graph") or not proto.graph.node or not proto.graph.output:
        raise ModelImportError(f"{where}: not a readable ONNX model (truncated, corrupt or not ONNX): "
                               "it has no graph, nodes or outputs")
    folder = path.parent
    tensors = list(proto.graph.initializer)
    tensors += [attr.t for node in proto.graph.node for attr in node.attribute if attr.type == onnx.AttributeProto.TENSOR]
    for tensor in tensors:
        nbytes = _declared_bytes(tensor, where)
        if tensor.data_location == TensorProto.EXTERNAL:
            _load_external(tensor, folder, nbytes, where)
        else:
            _check_inline(tensor, nbytes, where)
    return OnnxModel(proto=proto, folder=folder)


def initializer_arrays(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """name -> array of every (already inlined and checked) initializer."""
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _float_tensors(proto: onnx.ModelProto) -> list[tuple[str, TensorProto]]:
    """(description, tensor) of every floating-point initializer and Constant node value."""
    found = [(f"initializer '{t.name}'", t) for t in proto.graph.initializer if t.data_type in _FLOAT_TYPES]
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in _FLOAT_TYPES:
                found.append((f"the constant of node '{node.name}'", attr.t))
    return found


def check_finite(proto: onnx.ModelProto, where: str) -> None:
    """Refuse a NaN or infinite weight by name: such a model decodes garbage, and NaN logits compare as equal.

    A NaN is refused in any tensor. An infinity is refused in a weight, i.e. an initializer of more than one
    element: exporters write -inf as a causal mask's fill value (TorchScript as a Constant node), which is
    no weight and is never multiplied.
    """
    for what, tensor in _float_tensors(proto):
        values = numpy_helper.to_array(tensor)
        weight = what.startswith("initializer") and values.size > 1
        bad = ~np.isfinite(values) if weight else np.isnan(values)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            nans, infs = int(np.isnan(values).sum()), int(np.isinf(values).sum())
            raise ModelImportError(f"{where}: {what} holds {nans} NaN and {infs} infinite values (the first at "
                                   f"index {list(first)}, shape {list(values.shape)}); every weight must be a "
                                   "finite number: re-export from finite parameters")


def largest_weight(proto: onnx.ModelProto) -> tuple[str, float]:
    """(description, max |value|) of the floating-point tensor with the largest magnitude; scalars are left out
    (exporters write float32's largest value as a mask fill, which is no weight)."""
    best = ("no floating-point tensor", 0.0)
    for what, tensor in _float_tensors(proto):
        values = numpy_helper.to_array(tensor)
        if values.size > 1 and (peak := float(np.abs(values.astype(np.float64)).max())) > best[1]:
            best = (what, peak)
    return best
