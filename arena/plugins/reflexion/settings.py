"""Reflexion's settings, typed; ``method:`` of ``config.yaml`` holds their values and comments."""

from __future__ import annotations

from dataclasses import dataclass

import arena


@dataclass
class ReflexionSettings:
    train_tasks: int | None
    trials: int
    memory_size: int
    reflection_max_tokens: int
    reflection_temperature: float
    transcript_chars: int
    test_memory: int
    test_same_task_type: bool
    end_on_repeated_action: bool

    def __post_init__(self) -> None:
        arena.require_at_least(self, 1, "trials")
        arena.require_at_least(self, 0, "memory_size", "test_memory")
