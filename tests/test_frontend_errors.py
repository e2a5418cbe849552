"""Bad model files get one clear error each, never a stack trace from deep inside."""

from __future__ import annotations

import re
import shutil

import numpy as np
import onnx
import pytest
import torch

from hardwire.frontend import SUPPORTED_OPS, ModelImportError, load
from hardwire.frontend.proof import prove


def _raises(path, message: str) -> None:
    with pytest.raises(ModelImportError) as info:
        load(path)
    assert str(info.value) == message


def test_missing_file(tmp_path):
    _raises(tmp_path / "nope.onnx", f"{tmp_path / 'nope.onnx'}: model file not found")


def test_folder_is_not_a_model(tmp_path):
    _raises(tmp_path, f"{tmp_path}: not a file")


def test_truncated_file(exported, tmp_path):
    _, path = exported("example-dynamo")
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    _raises(cut, f"{cut}: not a readable ONNX model (truncated, corrupt or not ONNX): the protobuf does not parse")


def test_text_file(tmp_path):
    text = tmp_path / "notes.onnx"
    text.write_text("this is a text file, not a model\n")
    _raises(text, f"{text}: not a readable ONNX model (truncated, corrupt or not ONNX): the protobuf does not parse")


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    _raises(empty, f"{empty}: not a readable ONNX model (truncated, corrupt or not ONNX): "
                   "it has no graph, nodes or outputs")


def test_cnn_is_not_a_decoder(tmp_path):
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(10))
    cnn(torch.zeros(1, 3, 16, 16))
    path = tmp_path / "cnn.onnx"
    torch.onnx.export(cnn.eval(), (torch.zeros(1, 3, 16, 16),), str(path), dynamo=False, input_names=["image"])
    _raises(path, f"{path}: not a decoder-only language model: expected one integer input of token ids shaped "
                  "(batch, seq); found inputs image: FLOAT [1, 3, 16, 16]")


def test_unsupported_op_names_op_node_and_list(exported, tmp_path):
    _, path = exported("example-dynamo")
    proto = onnx.load(path)
    node = next(n for n in proto.graph.node if n.op_type == "Sigmoid")
    node.op_type = "HardSigmoid"
    bad = tmp_path / "hard.onnx"
    onnx.save(proto, bad)
    _raises(bad, f"{bad}: unsupported op HardSigmoid in node '{node.name}'; supported ops: "
                 f"{', '.join(sorted(SUPPORTED_OPS))}")


def test_unplaceable_structure_names_the_node(exported, tmp_path):
    """A block without its pre-attention norm runs fine but is not a shape hardwire builds; the error says where."""
    _, path = exported("example-dynamo")
    proto = onnx.load(path)
    weights = {t.name for t in proto.graph.initializer}
    q_proj = next(n for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in weights)
    normed, residual = q_proj.input[0], "embedding"
    for node in proto.graph.node:
        if node.op_type == "MatMul":
            node.input[:] = [residual if i == normed else i for i in node.input]
    bad = tmp_path / "nonorm.onnx"
    onnx.save(proto, bad)
    _raises(bad, f"{bad}: could not place MatMul node '{q_proj.name}': no normalisation between the residual "
                 "stream and this projection; supported: RMSNorm and LayerNorm before each sublayer (pre-norm)")


def _external_model(exported, tmp_path):
    _, path = exported("llama-gqa-untied")
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(path, folder / "model.onnx")
    shutil.copy(path.with_name("model.onnx.data"), folder / "model.onnx.data")
    proto = onnx.load(folder / "model.onnx", load_external_data=False)
    tensor = next(t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    return folder, proto, tensor


def test_external_data_outside_the_folder_is_refused(exported, tmp_path):
    folder, proto, tensor = _external_model(exported, tmp_path)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * (1 << 20))  # exists and is large enough: refusal must not depend on reading it
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = "../secret.bin"
    onnx.save(proto, folder / "model.onnx")
    _raises(folder / "model.onnx", f"{folder / 'model.onnx'}: initializer '{tensor.name}' points its external data "
                                   f"at '../secret.bin', outside the model's folder {folder}; refused (external "
                                   "data must lie beside the model)")


def test_external_data_absolute_path_is_refused(exported, tmp_path):
    folder, proto, tensor = _external_model(exported, tmp_path)
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = "/etc/passwd"
    onnx.save(proto, folder / "model.onnx")
    with pytest.raises(ModelImportError, match=re.escape("points its external data at '/etc/passwd', outside")):
        load(folder / "model.onnx")


def test_truncated_external_data(exported, tmp_path):
    folder, _, _ = _external_model(exported, tmp_path)
    data = folder / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(ModelImportError, match=r"of 'model.onnx.data', which holds 1000 bytes \(truncated\?\)"):
        load(folder / "model.onnx")


def test_absurd_initializer_is_refused_without_allocating(exported, tmp_path):
    _, path = exported("example-dynamo")
    proto = onnx.load(path)
    huge = onnx.TensorProto(name="huge", data_type=onnx.TensorProto.FLOAT, dims=[1 << 20, 1 << 20], raw_data=b"\0" * 16)
    proto.graph.initializer.append(huge)
    bad = tmp_path / "huge.onnx"
    onnx.save(proto, bad)
    _raises(bad, f"{bad}: initializer 'huge' declares shape [1048576, 1048576] (4398046511104 bytes), over the "
                 "2147483648 byte limit; refused without reading it")


def test_initializer_smaller_than_declared(exported, tmp_path):
    _, path = exported("example-dynamo")
    proto = onnx.load(path)
    proto.graph.initializer.append(onnx.TensorProto(name="short", data_type=onnx.TensorProto.FLOAT, dims=[100],
                                                    raw_data=np.zeros(4, np.float32).tobytes()))
    bad = tmp_path / "short.onnx"
    onnx.save(proto, bad)
    _raises(bad, f"{bad}: initializer 'short' declares shape [100] (400 bytes) but holds 16 bytes")


def _with_weight(exported, tmp_path, name: str, change) -> tuple[object, str]:
    """The example model with initializer `name` changed by `change(array) -> array`; -> (path, its name)."""
    _, path = exported("example-dynamo")
    proto = onnx.load(path)
    tensor = next(t for t in proto.graph.initializer if t.name == name)
    tensor.CopyFrom(onnx.numpy_helper.from_array(change(onnx.numpy_helper.to_array(tensor).copy()), name))
    bad = tmp_path / "bad.onnx"
    onnx.save(proto, bad)
    return bad, name


HEAD = "val_195"  # the example model's (32, 40) output projection (its dynamo export names it so)
EMBEDDING = "embed_tokens.weight"  # its (40, 32) token embedding, the Gather's table


def _set(index: tuple[int, ...], value: float):
    def change(array: np.ndarray) -> np.ndarray:
        array[index] = value
        return array
    return change


def test_nan_weight_is_refused_by_name(exported, tmp_path):
    """One NaN makes every logit NaN, and NaN compared with NaN is no difference: the proof passed it."""
    bad, name = _with_weight(exported, tmp_path, HEAD, _set((3, 5), np.nan))
    _raises(bad, f"{bad}: initializer '{name}' holds 1 NaN and 0 infinite values (the first at index [3, 5], "
                 "shape [32, 40]); every weight must be a finite number: re-export from finite parameters")


def test_infinite_weight_is_refused_by_name(exported, tmp_path):
    bad, name = _with_weight(exported, tmp_path, HEAD, _set((0, 7), -np.inf))
    _raises(bad, f"{bad}: initializer '{name}' holds 0 NaN and 1 infinite values (the first at index [0, 7], "
                 "shape [32, 40]); every weight must be a finite number: re-export from finite parameters")


def test_weights_that_overflow_the_float_forward_are_refused(exported, tmp_path):
    """Finite weights whose products leave float32: the logits are infinite, and the message names the culprit."""
    bad, name = _with_weight(exported, tmp_path, HEAD, lambda w: (w / np.abs(w).max() * 3e38).astype(np.float32))
    with pytest.raises(ModelImportError) as info:
        load(bad)
    message = str(info.value)
    assert message.startswith(f"{bad}: the float forward does not stay finite: onnxruntime gives ")
    assert "logits as NaN or infinite at length 2, although every weight is finite; the weights are too large " \
           "for float32 arithmetic" in message
    assert re.search(rf"; the largest weight is initializer '{name}' \(max \|w\| = [0-9.e+]+\)$", message), message


def test_constant_logits_are_no_proof(exported, tmp_path):
    """A zero head gives zero logits for every input; any reading of the graph would have matched them."""
    bad, _ = _with_weight(exported, tmp_path, HEAD, np.zeros_like)
    _raises(bad, f"{bad}: the logits are constant (0 in magnitude, varying by 0 over 3 random sequences of lengths "
                 "[2, 7, 32]): a proof against a constant is no proof, and the model predicts nothing; import a "
                 "model whose logits depend on its input")


def test_input_independent_logits_are_no_proof(exported, tmp_path):
    """Every embedding row the same: the logits differ across the vocabulary but never with the tokens read, so a
    graph read with its token input cut off would pass; the constant check alone passed it."""
    bad, _ = _with_weight(exported, tmp_path, EMBEDDING, lambda w: np.broadcast_to(w[0], w.shape).copy())
    proto = onnx.load(bad)
    proof = prove(load(bad, verify=False), proto, proto.graph.input[0].name, np.int64, (2, 7, 32))
    assert proof.logit_spread > 1000 * proof.tolerance * proof.max_abs_logit  # not constant: the old check passes
    assert proof.input_spread == 0 and proof.max_abs_diff <= proof.tolerance * proof.max_abs_logit
    _raises(bad, f"{bad}: the logits do not depend on the input tokens: 4 random sequences of length 2, different "
                 "at every position, give the same logits at every position (differing by at most 0, the largest "
                 "logit 2.85 in magnitude): the model predicts the same whatever it reads, and a graph read with "
                 "its token input cut off would pass the proof; import a model whose logits depend on its input")
