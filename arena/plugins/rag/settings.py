"""RAG's settings, typed (``method:`` of ``config.yaml`` holds their values and comments)."""

from __future__ import annotations

from dataclasses import dataclass

import arena


@dataclass
class RAGSettings:
    k: int
    retrieve_while_learning: bool
    max_action_chars: int

    def __post_init__(self) -> None:
        arena.require_at_least(self, 1, "k")
