"""What the built-in backends share beyond :class:`~arena.core.contract.llm.LLMBackend`: the settings of
the Hugging Face model they load (the vLLM backend loads its training copy with exactly the
transformers backend's) and how a call's results are counted in ``usage``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

from arena.core.contract.llm import Choice, Generation, LLMBackend

Result = TypeVar("Result", Generation, Choice)


@dataclass(frozen=True)
class ModelSettings:
    """The ``llm`` keys that say which model is loaded and how (each backend's YAML documents
    them); a backend's own settings extend these."""

    model: str = "embedded"
    dtype: str = "auto"
    threads: int | None = None
    max_context: int = 2048
    device: str = "cpu"

    def model_settings(self) -> dict[str, Any]:
        """Just these keys, as the ``llm`` mapping a transformers model is loaded from."""
        return {field.name: getattr(self, field.name) for field in fields(ModelSettings)}


class CountingBackend(LLMBackend):
    """An :class:`LLMBackend` that counts each call's results in ``usage`` (one call a prompt)."""

    def _count(self, results: list[Result]) -> list[Result]:
        self.usage.add(
            len(results), sum(r.tokens_in for r in results), sum(r.tokens_out for r in results)
        )
        return results
