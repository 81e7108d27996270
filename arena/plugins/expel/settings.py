"""ExpeL's settings, typed (``method:`` of ``config.yaml`` holds their values and comments)."""

from __future__ import annotations

from dataclasses import dataclass

import arena
from arena.plugins.expel.insights import Weights, check_parser


@dataclass
class ExpeLSettings:
    max_reflections: int
    train_tasks: int | None
    reflection_max_tokens: int
    transcript_chars: int
    max_insights: int
    max_operations: int | None
    success_chunk: int
    critique_max_tokens: int
    critique_chars: int
    weights: Weights
    fewshots: int
    fewshot_candidates: int
    fewshot_max_chars: int
    operation_parser: str
    cap_insights: bool
    end_on_repeated_action: bool

    def __post_init__(self) -> None:
        arena.require_at_least(self, 0, "max_reflections", "fewshots", "fewshot_candidates")
        check_parser(self.operation_parser)
        arena.require_at_least(self, 1, "success_chunk")
