"""The Mem0-style method's settings, typed; ``method:`` of ``config.yaml`` holds their values."""

from __future__ import annotations

from dataclasses import dataclass

import arena
from arena.plugins.mem0.prompts import check_parser


@dataclass
class Mem0Settings:
    facts_max_tokens: int
    update_max_tokens: int
    temperature: float
    top_p: float
    similar_per_fact: int
    search_limit: int
    search_threshold: float | None
    transcript_steps: int
    reply_prefix: bool
    max_facts: int
    parser: str

    def __post_init__(self) -> None:
        check_parser(self.parser)
        arena.require_at_least(self, 1, "similar_per_fact", "search_limit", "max_facts")
