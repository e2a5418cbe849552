from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/exports.py

import exports


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[object, Path]]:
    """name -> (torch model, path of its ONNX export), each exported once per session in its own folder."""
    builders = {
        "example-dynamo": (exports.example_model, lambda m, p: exports.export_example(m, p, dynamo=True)),
        "example-torchscript": (exports.example_model, lambda m, p: exports.export_example(m, p, dynamo=False)),
        "llama-mha-tied": (lambda: exports.hf_llama(kv_heads=4, tied=True), exports.export_dynamo),
        "llama-gqa-untied": (lambda: exports.hf_llama(kv_heads=2, tied=False), exports.export_dynamo),
        "gpt2": (exports.hf_gpt2, exports.export_dynamo),
    }
    cache: dict[str, tuple[object, Path]] = {}

    def get(name: str) -> tuple[object, Path]:
        if name not in cache:
            make, export = builders[name]
            model = make()
            cache[name] = (model, export(model, tmp_path_factory.mktemp(name) / "model.onnx"))
        return cache[name]

    return get
