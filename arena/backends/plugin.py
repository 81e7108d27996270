"""The built-in LLM backends' registration, kept light: a backend's module (torch, transformers,
vLLM, the openai client) is imported when the backend is built, not when Arena lists or checks
names, so ``arena plugins`` and ``arena run --help`` answer at once."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import arena

HERE = Path(__file__).parent


def built_by(module: str, factory: str) -> Callable[[Mapping[str, Any]], Any]:
    """A factory that imports ``module`` on first use and calls its ``factory(cfg)``."""

    def build(cfg: Mapping[str, Any]) -> Any:
        return getattr(importlib.import_module(module), factory)(cfg)

    build.__name__ = factory
    build.__qualname__ = f"{module}.{factory}"
    build.__module__ = module
    return build


@arena.hookimpl
def register_backends(register: Callable[..., None]) -> None:
    register(
        "transformers",
        built_by("arena.backends.transformers_backend", "make_transformers_backend"),
        config=HERE / "config.yaml",
        description="Hugging Face transformers in-process (embedded SmolLM2-135M by default)",
    )
    register(
        "vllm",
        built_by("arena.backends.vllm_backend", "make_vllm_backend"),
        config=HERE / "vllm_config.yaml",
        description="vLLM in-process engine for rollouts, weights synced from the trainer's copy",
    )
    register(
        "openai",
        built_by("arena.backends.openai_backend", "make_openai_backend"),
        config=HERE / "openai_config.yaml",
        description="Any OpenAI-compatible chat server (vLLM, llama.cpp, hosted APIs)",
    )
