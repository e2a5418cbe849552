"""Compiling from a Hugging Face model folder: config.json plus safetensors weights (what save_pretrained writes).

hardwire exports the folder to ONNX itself, offline (torch.onnx.export with the dynamo exporter, the export
users would run), and imports the ONNX file like any other, proof included: the folder is only a shortcut to
the file, never a second way of reading a model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from .errors import ModelImportError

# model_type (config.json) of the causal LM families whose exports the frontend recovers (docs/frontend.md)
HF_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gpt2", "gpt_neox", "gemma", "gpt_neo", "opt", "phi", "phi3",
                  "gptj", "granite", "cohere", "bloom", "mpt")
EXPORT_PROBE = 8  # tokens in the example input the exporter traces with


def _config(folder: Path) -> dict:
    where = str(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise ModelImportError(f"{where}: a folder, but not a Hugging Face model folder (no config.json); give a "
                               "model.onnx or a folder written by save_pretrained")
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelImportError(f"{where}: config.json is not valid JSON ({err})") from err
    if not isinstance(config, dict):
        raise ModelImportError(f"{where}: config.json is not valid JSON (not an object)")
    architectures = config.get("architectures") or []
    causal = [a for a in architectures if isinstance(a, str) and a.endswith(("ForCausalLM", "LMHeadModel"))]
    if not causal:
        raise ModelImportError(f"{where}: not a causal language model: config.json names architectures "
                               f"{architectures or 'none'}; hardwire compiles decoder-only models "
                               "(an architecture ending in ForCausalLM or LMHeadModel)")
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise ModelImportError(f"{where}: model_type '{model_type}' ({causal[0]}) is not a family hardwire imports; "
                               f"supported: {', '.join(HF_MODEL_TYPES)}")
    if not any(folder.glob("*.safetensors")):
        raise ModelImportError(f"{where}: no safetensors weights (*.safetensors) beside config.json; save the model "
                               "with save_pretrained (safe_serialization, the default)")
    return config


def export_folder(folder: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                  progress: Callable[[str], None] = print) -> Path:
    """Export the causal LM in FOLDER to OUT_DIR/model.onnx (weights in model.onnx.data beside it), offline."""
    folder, out_dir = Path(folder), Path(out_dir)
    config = _config(folder)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only: never the network
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    except Exception as err:  # transformers raises OSError, ValueError, KeyError... for a folder it cannot read
        raise ModelImportError(f"{folder}: transformers cannot load the model: {err}") from err
    longest = config.get("max_position_embeddings") or config.get("n_positions") or 2048
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    progress(f"exporting {folder} ({config['model_type']}, {sum(p.numel() for p in model.parameters()):,} "
             f"parameters) to {path} with torch.onnx.export (dynamo) ...")

    class LogitsOnly(torch.nn.Module):  # causal LMs return a ModelOutput; the exporter wants a tensor
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, use_cache=False).logits

    seq = torch.export.Dim("seq", min=2, max=max(int(longest), EXPORT_PROBE))
    try:
        torch.onnx.export(LogitsOnly().eval(), (torch.zeros((1, EXPORT_PROBE), dtype=torch.long),), str(path),
                          dynamo=True, input_names=["input_ids"], output_names=["logits"], dynamic_shapes=({1: seq},),
                          verbose=False)
    except Exception as err:  # the exporter's own errors name the op or guard that failed
        raise ModelImportError(f"{folder}: torch.onnx.export failed: {err}") from err
    return path
