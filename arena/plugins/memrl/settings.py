"""MemRL's settings, typed (``method:`` of ``config.yaml`` holds their values and comments)."""

from __future__ import annotations

from dataclasses import dataclass

import arena


@dataclass
class MemRLSettings:
    sim_threshold: float
    k1: int
    weight_sim: float
    weight_q: float
    sim_norm_mean: float
    sim_norm_std: float
    q_clip: float
    k2: int
    epsilon: float
    alpha: float
    success_reward: float
    failure_reward: float
    q_init: float
    merge_threshold: float
    script_max_tokens: int
    reflection_max_tokens: int
    reflection_temperature: float
    prompt_steps: int
    max_action_chars: int
    snapshot: bool

    def __post_init__(self) -> None:
        arena.require_at_least(self, 1, "k1", "k2")
        for name in ("epsilon", "alpha"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"method.{name} must be in [0, 1], got {getattr(self, name)}")
