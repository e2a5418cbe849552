"""`hardwire inspect|compile FOLDER`: a Hugging Face folder (config.json and safetensors) is exported to ONNX by
hardwire itself, offline, then imported and proven like any ONNX file; folders it cannot use get one clear error."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from exports import perturb

from hardwire.cli import main


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False)
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    perturb(LlamaForCausalLM(cfg), 0).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def compiled(llama_folder, tmp_path_factory) -> tuple[Path, int, str]:
    """`hardwire compile FOLDER`, once: (build folder, exit status, what it printed). Its export of the folder to ONNX
    (about 10 s) is the module's one export: the inspect test reuses it."""
    out = tmp_path_factory.mktemp("compiled") / "build"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["compile", str(llama_folder), "--quant", "int8", "--lanes", "4", "--context", "16", "-o", str(out)])
    return out, code, printed.getvalue()


def test_compile_from_a_saved_folder(llama_folder, compiled):
    out, code, printed = compiled
    assert code == 0
    onnx_path = out / "onnx" / "model.onnx"
    assert f"exporting {llama_folder} (llama, 19,616 parameters) to {onnx_path} with torch.onnx.export (dynamo) ..." \
        in printed
    assert "2 layers x 32, 19,616 parameters; PASS: " in printed
    assert onnx_path.exists() and (out / "onnx" / "model.onnx.data").exists() and (out / "decoder.v").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["head_macs"] == 64 * 32
    assert 0 < report["vocab_weight_bits"] < report["weight_bits"]
    assert "vocabulary: the head takes 2,048 of " in printed


def test_inspect_a_saved_folder(llama_folder, compiled, monkeypatch, capsys):
    """The export step hands over the compile test's export of the same folder (export_folder's own output, copied)
    instead of exporting it a second time; the import, its proof and the printing are inspect's own."""
    from hardwire.frontend import hf_folder

    def exported_before(folder, out_dir, progress=print) -> Path:
        assert Path(folder) == llama_folder
        shutil.copytree(compiled[0] / "onnx", out_dir, dirs_exist_ok=True)
        return Path(out_dir) / "model.onnx"

    monkeypatch.setattr(hf_folder, "export_folder", exported_before)
    assert main(["inspect", str(llama_folder)]) == 0
    out = capsys.readouterr().out
    assert f"model      {llama_folder} (exported to " in out
    assert "  n_kv_heads 2\n" in out and "proof      PASS: " in out
    # per layer q, o 32 x 32, k, v 16 x 32, gate, up, down 48 x 32: 7,680 MACs; the head 64 x 32
    assert "vocabulary embedding 2,048 + head 2,048 of 19,616 weights (21%); head 2,048 of 17,408 projection " \
           "MACs/token (12%)\n" in out


def _folder(tmp_path, config: dict | None, weights: bool = False):
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    return folder


def _error(capsys, folder) -> str:
    assert main(["inspect", str(folder)]) == 2
    return capsys.readouterr().err


def test_folder_without_config(tmp_path, capsys):
    folder = _folder(tmp_path, None)
    assert _error(capsys, folder) == (f"hardwire: error: {folder}: a folder, but not a Hugging Face model folder (no "
                                      "config.json); give a model.onnx or a folder written by save_pretrained\n")


def test_folder_that_is_not_a_causal_lm(tmp_path, capsys):
    folder = _folder(tmp_path, {"architectures": ["BertForMaskedLM"], "model_type": "bert"}, weights=True)
    assert _error(capsys, folder) == (f"hardwire: error: {folder}: not a causal language model: config.json names "
                                      "architectures ['BertForMaskedLM']; hardwire compiles decoder-only models (an "
                                      "architecture ending in ForCausalLM or LMHeadModel)\n")


@pytest.mark.parametrize("family", ["phi3", "gptj", "granite", "cohere"])
def test_inspect_folders_of_the_2025_families(family, tmp_path, capsys):
    """Saved folders of the families issue 35 added (Phi-3's sliced qkv, GPT-J's and Cohere's interleaved RoPE,
    Granite's multipliers) export offline and import with proof PASS, as their ONNX exports do."""
    from exports import FAMILIES_2025

    folder = tmp_path / family
    FAMILIES_2025[family]().save_pretrained(folder)
    assert main(["inspect", str(folder)]) == 0
    assert "PASS: max |IR - onnxruntime|" in capsys.readouterr().out


def test_folder_of_an_unsupported_family(tmp_path, capsys):
    folder = _folder(tmp_path, {"architectures": ["MambaForCausalLM"], "model_type": "mamba"}, weights=True)
    assert _error(capsys, folder) == (f"hardwire: error: {folder}: model_type 'mamba' (MambaForCausalLM) is not a "
                                      "family hardwire imports; supported: llama, qwen2, qwen3, mistral, gpt2, gpt_neox, "
                                      "gemma, gpt_neo, opt, phi, phi3, gptj, granite, cohere, bloom, mpt\n")


def test_folder_without_safetensors(tmp_path, capsys):
    folder = _folder(tmp_path, {"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    assert _error(capsys, folder) == (f"hardwire: error: {folder}: no safetensors weights (*.safetensors) beside "
                                      "config.json; save the model with save_pretrained (safe_serialization, the "
                                      "default)\n")


def test_folder_with_a_broken_config(tmp_path, capsys):
    folder = _folder(tmp_path, None)
    (folder / "config.json").write_text('{"model_type": "llama",')
    assert _error(capsys, folder) == (f"hardwire: error: {folder}: config.json is not valid JSON (Expecting property "
                                      "name enclosed in double quotes: line 1 column 24 (char 23))\n")


def test_folder_whose_weights_transformers_cannot_read(tmp_path, capsys):
    """An empty safetensors file: transformers' own error, after the folder's name, on one line."""
    folder = _folder(tmp_path, {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
                                "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
                                "num_attention_heads": 4}, weights=True)
    err = _error(capsys, folder)
    assert err.startswith(f"hardwire: error: {folder}: transformers cannot load the model: ") and err.count("\n") == 1
