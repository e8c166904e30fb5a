# Two entry points: `make demo` (main job on the embedded default model) and `make test`.
# Both create .venv on first use and reinstall when pyproject.toml changes.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
STAMP  := $(VENV)/.installed

.PHONY: demo test

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	# torch first and pinned: the CPU build of 2.13.0; the project's range accepts it, so nothing bigger is pulled.
	$(VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(VENV)/bin/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/af1 demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q
