"""GiGPO's settings, typed; ``method:`` of ``config.yaml`` holds their values and comments."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import arena
from arena import rl


@dataclass
class GiGPOSettings:
    iterations: int
    tasks_per_iteration: int
    group_size: int
    win_reward: float
    progress_reward: float
    invalid_action_penalty: float
    #: The advantage estimator and its knobs (``arena.rl.AdvantageSettings`` checks them).
    advantage: dict[str, Any]
    drop_zero_advantage: bool
    mini_batch_size: int | None
    valid_every: int
    valid_tasks: int
    #: The policy trainer's settings (``arena.rl.TrainerConfig`` checks them).
    trainer: dict[str, Any]

    def __post_init__(self) -> None:
        arena.require_at_least(self, 1, "iterations", "tasks_per_iteration", "group_size")
        if self.group_size < 2:
            raise ValueError("method.group_size must be >= 2: a group of one rollout has no baseline "
                             "to compare against (the authors use 8)")
        self.estimator  # noqa: B018 (a wrong advantage setting is refused at once, with its name)

    @property
    def estimator(self) -> rl.AdvantageSettings:
        known = {f.name for f in dataclasses.fields(rl.AdvantageSettings)}
        unknown = sorted(set(self.advantage) - known)
        if unknown:
            raise ValueError(f"Unknown key(s) method.advantage.{', method.advantage.'.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        return rl.AdvantageSettings(**self.advantage)
