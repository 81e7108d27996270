"""RAG's settings, typed (``method:`` of ``config.yaml`` holds their values and comments)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RAGSettings:
    k: int
    retrieve_while_learning: bool
    max_action_chars: int

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"method.k must be >= 1, got {self.k}")
