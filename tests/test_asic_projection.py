"""The ASIC projection (boards/asic_projection.py) and `hardwire project`.

One real sky130 synthesis of a small build the fit never saw (tens of seconds) checks the projection against reality;
the rest reads configurations and the stored fit points and takes about a second each.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from random_ir import random_ir

from hardwire.boards.asic import build_asic
from hardwire.boards.asic_projection import (
    BLOCKS_FILE,
    FEATURES,
    buffer_fanout,
    config_from_hf,
    default_plan,
    fit,
    hf_parameters,
    llama_config,
    load_points,
    measured_point,
    memory_inventory,
    model_parameters,
    predict_build,
    reference_shapes,
    standin_qmodel,
)
from hardwire.cli import main
from hardwire.quant.quantize import quantize
from hardwire.rtl.build import compile_to
from hardwire.rtl.lora_map import lora_address_map
from hardwire.rtl.plan import (
    HardwarePlan,
    cycles_per_token_estimate,
    kv_bank_shapes,
    latency_floor_cycles,
    macs_per_token,
    schedule,
    weight_bank_shapes,
)

ERROR = 0.20  # the stated error of the projection on held-out builds: area and clock within 20%
HELD_OUT = {"name": "d8-int4-2x2", "role": "held_out", "d": 8, "scheme": "int4", "rows": 2, "lanes": 2}

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": False, "hidden_act": "silu"}
SMOLLM_135M = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
               "intermediate_size": 1536, "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
               "vocab_size": 49152, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
               "tie_word_embeddings": True, "hidden_act": "silu"}


def _qm(d: int, scheme: str):
    return quantize(random_ir(vocab=16, d=d, layers=1, heads=2, kv_heads=1, ffn=2 * d, context=8), scheme, context=8)


@pytest.fixture(scope="module")
def held_out_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The held-out small build compiled and synthesised to sky130hd now, as benchmarks/asic_projection.py does."""
    from hardwire.boards.asic_projection import buffered_timing

    qm = _qm(HELD_OUT["d"], HELD_OUT["scheme"])
    folder = tmp_path_factory.mktemp("projection") / HELD_OUT["name"]
    compile_to(qm, folder, lanes=HELD_OUT["lanes"], rows=HELD_OUT["rows"], storage="rom", progress=False)
    start = time.time()
    result = build_asic(folder, progress=False)
    point = measured_point(HELD_OUT, qm, result, buffered_timing(folder))
    print(f"\n[timing] sky130hd synthesis and timing of the held-out build: {time.time() - start:.0f} s")
    return folder, point


@pytest.mark.xdist_group("asic_projection")
def test_projection_predicts_a_held_out_synthesis(held_out_build: tuple[Path, dict]) -> None:
    _, point = held_out_build
    points = load_points()
    model_fit = fit(points)
    assert HELD_OUT["name"] not in model_fit.points  # never fitted on
    assert all(p["role"] == "fit" for p in points if p["name"] in model_fit.points)
    # the stored held-out record is this synthesis: the same cells, the same paths
    stored = next(p for p in points if p["name"] == HELD_OUT["name"])
    for key in ("logic_area_um2", "logic_transistors", "critical_path_ns", "buffered_path_ns", "fanout_buffers"):
        assert point["measured"][key] == stored["measured"][key], key
    check = predict_build(point, model_fit)
    assert abs(check["errors"]["logic_area"]) <= ERROR, check
    assert abs(check["errors"]["area"]) <= ERROR, check
    assert abs(check["errors"]["clock"]) <= ERROR, check
    assert abs(check["errors"]["path"]) <= ERROR, check
    # the memories the projection counts are the build's: every weight bank, table and KV bank by name and shape
    qm = standin_qmodel(llama_config(vocab=16, d=8, layers=1, heads=2, kv_heads=1, ffn=16, context=8, tied=False),
                        "int4", 8)
    projected = {m["name"]: m for m in memory_inventory(qm, HardwarePlan(rows=2, lanes=2, storage="rom"))}
    built = {m["name"]: m for m in point["measured"]["memories"]}
    assert set(built) <= set(projected)
    for name in ("kcache0", "kcache1", "vcache0", "vcache1", "lora.a0", "lora.b1", "norm.rsqrt_rom", "rope.cos_rom"):
        assert (built[name]["depth"], built[name]["width"]) == (projected[name]["depth"], projected[name]["width"])
    for name in ("weights0.bank0.mem", "weights0.bank1.mem", "embed.mem"):  # yosys drops the all-zero shift field
        assert built[name]["depth"] == projected[name]["depth"] and built[name]["width"] <= projected[name]["width"]


def test_every_stored_held_out_build_is_within_the_stated_error() -> None:
    points = load_points()
    model_fit = fit(points)
    held = [p for p in points if p["role"] == "held_out"]
    assert len(held) >= 2 and len(model_fit.points) > len(FEATURES)
    assert not {p["name"] for p in held} & set(model_fit.points)
    for p in held:
        errors = predict_build(p, model_fit)["errors"]
        assert max(abs(errors[k]) for k in ("logic_area", "area", "clock")) <= ERROR, (p["name"], errors)
    for p in points:
        assert p["measured"]["library"] == "sky130hd" and p["date"] and p["command"].startswith("python benchmarks/")


def test_standin_qmodel_gives_the_real_schedule_and_banks() -> None:
    """The weightless stand-in reads like the quantised model: the same schedule, banks, KV banks and LoRA slots."""
    for scheme, plan in (("int8", HardwarePlan(rows=2, lanes=4, storage="rom")),
                         ("int4", HardwarePlan(rows=4, lanes=8, storage="rom", epilogue_lanes=2, softmax_lanes=2))):
        real = _qm(16, scheme)
        stand = standin_qmodel(real.config, scheme, real.context)
        assert stand.n_weights == real.n_weights and stand.weight_bits == real.weight_bits
        assert stand.scale_bits == real.scale_bits
        for position in (0, 3, 7):
            assert schedule(stand, plan, position) == schedule(real, plan, position)
        assert weight_bank_shapes(stand, plan) == weight_bank_shapes(real, plan)
        assert kv_bank_shapes(stand, plan) == kv_bank_shapes(real, plan)
        assert lora_address_map(stand) == lora_address_map(real)


def test_buffer_tree_bounds_the_fanout() -> None:
    from hardwire.boards.asic import LIBRARIES
    from hardwire.boards.liberty import parse_library, read_text, static_timing

    inv, ff = "sky130_fd_sc_hd__inv_1", "sky130_fd_sc_hd__dfxtp_1"
    lib = parse_library(read_text(LIBRARIES["sky130hd"].liberty), {inv, ff, "sky130_fd_sc_hd__buf_4"})
    cells = {"src": {"type": ff, "connections": {"CLK": [2], "D": [3], "Q": [10]}},
             "drv": {"type": inv, "connections": {"A": [10], "Y": [11]}}}
    for k in range(200):  # one inverter driving 200 flip-flops
        cells[f"ff{k}"] = {"type": ff, "connections": {"CLK": [2], "D": [11], "Q": [1000 + k]}}
    module = {"ports": {"clk": {"direction": "input", "bits": [2]}}, "cells": cells}
    buffered, added = buffer_fanout(module, lib, max_fanout=8)
    assert added == (25 + 4) + (26 + 4)  # the data net: 200 loads -> 25 -> 4 buffers; the clock: 201 -> 26 -> 4
    fanout: dict[int, int] = {}
    for cell in buffered["cells"].values():
        for pin, bits in cell["connections"].items():
            if pin in ("A", "D", "CLK"):
                for bit in bits:
                    fanout[bit] = fanout.get(bit, 0) + 1
    assert max(fanout.values()) <= 8
    assert static_timing(buffered, lib)["critical_path_ns"] < static_timing(module, lib)["critical_path_ns"]


def test_parameter_counts_from_the_configurations() -> None:
    shapes = reference_shapes()
    assert model_parameters(shapes["Llama 3.1 8B"]) == 8_030_261_248  # meta-llama/Llama-3.1-8B
    assert abs(model_parameters(shapes["Llama 3.1 8B"]) / 8.03e9 - 1) < 0.005
    assert model_parameters(shapes["SmolLM 135M"]) == 134_515_008  # HuggingFaceTB/SmolLM-135M
    assert model_parameters(shapes["Llama 3.2 1B"]) == 1_235_814_400  # meta-llama/Llama-3.2-1B
    assert model_parameters(shapes["llama2.c 15M"]) == 15_191_712  # stories15M: shared head


@pytest.mark.parametrize("config, published", [
    ({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024},
     124_439_808),  # gpt2
    ({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
      "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
      "max_position_embeddings": 32768, "tie_word_embeddings": True}, 494_032_768),  # Qwen/Qwen2-0.5B
    ({"model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 512, "num_hidden_layers": 6,
      "num_attention_heads": 8, "intermediate_size": 2048, "max_position_embeddings": 2048, "rotary_pct": 0.25,
      "hidden_act": "gelu"}, 70_426_624),  # EleutherAI/pythia-70m
    ({"model_type": "opt", "vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
      "ffn_dim": 3072, "max_position_embeddings": 2048, "activation_function": "relu"}, 125_239_296),  # facebook/opt-125m
    ({"model_type": "gpt_neo", "vocab_size": 50257, "hidden_size": 768, "num_layers": 12, "num_heads": 12,
      "max_position_embeddings": 2048, "attention_types": [[["global", "local"], 6]], "window_size": 256},
     125_198_592),  # EleutherAI/gpt-neo-125m
])
def test_parameters_of_other_families(config: dict, published: int) -> None:
    cfg = config_from_hf(config)
    assert hf_parameters(config, cfg) == published
    if config["model_type"] == "gpt_neo":
        assert cfg.attn_windows == (None, 256) * 6


def test_project_a_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_8B))
    assert main(["project", str(config), "--target", "asic", "--rows", "8", "--lanes", "16", "--scheme", "int4"]) == 0
    out = capsys.readouterr().out
    assert "8,030,261,248 parameters" in out and "all figures projected" in out and "wrote" in out
    result = json.loads((tmp_path / "project_asic.json").read_text())
    assert set(result) == {"date", "label", "projections", "fit", "fo4_sky130_ps", "assumptions", "source", "hc1"}
    assert result["hc1"]["area_mm2"] == 815 and result["hc1"]["tokens_per_s"] == 17000  # the 8B gets the HC1 beside it
    assert "Taalas HC1" in out
    assert result["label"] == "projected" and result["source"] == str(config)
    (row,) = result["projections"]
    assert set(row) == {"model", "scheme", "context", "position", "engine", "schedule", "sky130", "scaled"}
    assert row["model"]["parameters"] == 8_030_261_248
    assert row["model"]["stored_weights"] == 8_030_261_248 - 32 * 2 * 4096 - 4096  # the norms fold into weights
    assert (row["scheme"], row["context"], row["position"]) == ("int4", 2048, 1024)
    assert row["engine"] == {"rows": 8, "lanes": 16, "epilogue_lanes": 8, "softmax_lanes": 16, "attention_rows": 8,
                             "macs_per_cycle": 128, "shape": "8 rows x 16 lanes, softmax on 16, epilogue on 8",
                             "within_rtl_limits": True}
    # the cycles are the schedule's, for the same configuration and plan
    qm = standin_qmodel(reference_shapes()["Llama 3.1 8B"], "int4", 2048)
    plan = default_plan(8, 16, 128)
    assert plan == HardwarePlan(rows=8, lanes=16, storage="rom", epilogue_lanes=8, softmax_lanes=16)
    assert row["schedule"]["cycles_per_token"] == cycles_per_token_estimate(qm, plan, 1024)
    assert row["schedule"]["latency_floor_cycles"] == latency_floor_cycles(qm, plan, 1024)
    assert row["schedule"]["macs_per_token"] == macs_per_token(qm, 1024)
    sky = row["sky130"]
    assert sky["label"] == "projected" and row["scaled"]["label"] == "projected, scaled by assumption"
    assert sky["clock_mhz"] == min(sky["clock_limits_mhz"].values())
    assert sky["tokens_per_s"] == pytest.approx(sky["clock_mhz"] * 1e6 / row["schedule"]["cycles_per_token"])
    assert sky["area_mm2"] == pytest.approx(sky["logic_area_mm2"] + sky["rom_area_mm2"] + sky["sram_area_mm2"])
    # int4 codes: 4 bits plus the group exponent every 32 weights, at about a transistor a bit
    assert sky["weight_rom_bits"] >= 4 * row["model"]["stored_weights"]
    assert 4.0 < sky["transistors_per_parameter"] < 6.0
    assert set(result["fit"]["area_um2_coefficients"]) == set(FEATURES)


def test_project_defaults_a_folder_and_onnx(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "smollm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMOLLM_135M))
    out_dir = tmp_path / "out"
    assert main(["project", str(folder), "--scheme", "mixed36", "-o", str(out_dir)]) == 0
    result = json.loads((out_dir / "project_asic.json").read_text())
    shapes = [(p["engine"]["rows"], p["engine"]["lanes"]) for p in result["projections"]]
    assert shapes == [(1, 8), (8, 16), (64, 32)]  # head width 64; mixed36's 32-column groups cap lanes at 32
    assert all(p["model"]["parameters"] == 134_515_008 for p in result["projections"])
    assert "hc1" not in result
    cycles = [p["schedule"]["cycles_per_token"] for p in result["projections"]]
    assert cycles == sorted(cycles, reverse=True)  # wider engines take fewer cycles
    onnx = Path(__file__).resolve().parent.parent / "models" / "tinyshakespeare.onnx"
    assert main(["project", str(onnx), "--rows", "2", "--lanes", "4", "-o", str(tmp_path / "onnx")]) == 0
    (row,) = json.loads((tmp_path / "onnx" / "project_asic.json").read_text())["projections"]
    assert row["engine"]["rows"] == 2 and row["model"]["parameters"] == 463_872  # the importer's count (README)
    capsys.readouterr()


@pytest.mark.parametrize("args, expected", [
    (["missing.json"], "no such file or folder; give a Hugging Face config.json, a folder holding one, or a "
                       "model.onnx"),
    (["{cfg}", "--rows", "3"], "--rows must be a power of two (1, 2, 4, ...), got 3"),
    (["{cfg}", "--lanes", "0"], "--lanes must be a power of two (1, 2, 4, ...), got 0"),
    (["{cfg}", "--lanes", "256", "--rows", "1"], "--lanes 256 must divide the head width 128: accepted 1, 2, 4, 8, "
                                                 "16, 32, 64, 128"),
    (["{cfg}", "--scheme", "fp16"], "unknown --scheme 'fp16'; accepted: int8, int4, int3, mxfp4, mixed36"),
    (["{cfg}", "--context", "0"], "--context must be a positive number of positions, got 0"),
    (["{bert}"], "model_type 'bert' is not a family hardwire knows; accepted: llama, mistral, qwen2, gemma, gpt2, "
                 "gpt_neox, gpt_neo, opt, phi"),
    (["{bad}"], "not valid JSON"),
    (["{dir}"], "a folder without config.json; give a Hugging Face model folder, its config.json, or a model.onnx"),
    (["{txt}"], "not a config.json or a .onnx file"),
    (["{cfg}", "--library", "nangate99"], "unknown --library 'nangate99': the ASIC target knows sky130hd"),
])
def test_bad_input_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                     expected: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))
    (tmp_path / "bert.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    names = {"cfg": tmp_path / "config.json", "bert": tmp_path / "bert.json", "bad": tmp_path / "bad.json",
             "dir": tmp_path / "empty", "txt": tmp_path / "notes.txt"}
    argv = ["project"] + [a.format(**names) if a.startswith("{") else a for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hardwire: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert expected in err
    assert not (tmp_path / "project_asic.json").exists()


def test_stored_fit_file_names_its_commands() -> None:
    stored = json.loads(BLOCKS_FILE.read_text())
    assert stored["library"] == "sky130hd" and "tt_025C_1v80" in stored["corner"]
