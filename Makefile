# The two commands: `make demo` and `make test`. Both create .venv on first use.
# `make bitstream` is the long, separate step: the demo plus the ULX3S-85F bitstream (place and route).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo bitstream test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# torch first and pinned: 2.13.0 is the CPU wheel on this machine's disk; unpinned pulls a CUDA build
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

# a few minutes: import, quantise, Verilog, token-exact simulation, tokens/s estimated at the board's clock
demo: $(STAMP)
	$(VENV)/bin/hardwire demo

# the demo, then synthesis, place and route and packing for the ULX3S-85F (15-35 minutes for the bundled model)
bitstream: $(STAMP)
	@echo "make bitstream: the demo, then the ULX3S-85F bitstream of the bundled model into build/demo/board_ulx3s/"
	@echo "  place and route is the long step: 15-35 minutes on a 2-core machine, a progress line every 30 s"
	$(VENV)/bin/hardwire demo --board ulx3s

test: $(STAMP)
	$(PY) -m pytest

# the CPU baseline with every engine (torch eager and compiled, onnxruntime, llama.cpp F32 and Q8_0) on both
# bundled models, into benchmarks/results/cpu_baseline.json. Installs the bench extra first: llama-cpp-python
# compiles llama.cpp from source on its first install (5 minutes on 2 cores; its multimodal library is skipped)
.PHONY: bench-cpu
bench-cpu: $(STAMP)
	CMAKE_ARGS="-DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -e ".[bench]"
	$(PY) benchmarks/cpu_baseline.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build .pytest_cache
