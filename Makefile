# The two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@# torch first and pinned: 2.13.0 is the CPU wheel on this machine's disk; unpinned pulls a CUDA build
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hardwire demo

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build .pytest_cache
