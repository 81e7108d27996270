"""Reflexion's settings, typed; ``method:`` of ``config.yaml`` holds their values and comments."""

from __future__ import annotations

from dataclasses import dataclass


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
        if self.trials < 1:
            raise ValueError(f"method.trials must be >= 1, got {self.trials}")
        for name in ("memory_size", "test_memory"):
            if getattr(self, name) < 0:
                raise ValueError(f"method.{name} must be >= 0, got {getattr(self, name)}")
