"""Evolving-RL's (and its GRPO baseline's) settings, typed; ``method:`` of ``config.yaml`` holds
their values and comments, the presets their alternatives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MODES = ("coevolve", "grpo")
#: ``unusable_cards``: play a card that does not parse as its raw text (the authors'), or skip it.
UNUSABLE_CARDS = ("raw_text", "skip")
#: ``solver_samples``: one sample per model decision, or one per episode.
SOLVER_SAMPLES = ("decision", "episode")
ADVANTAGE_STD = ("population", "unbiased")
#: ``group_of_one``: a lone sample's advantage is 0 (Arena's) or its reward (the authors').
GROUP_OF_ONE = ("zero", "reward")


@dataclass
class EvolvingRLSettings:
    mode: str
    iterations: int
    n_sources: int
    n_skills: int
    k_downstream: int
    group_size: int
    extractor_max_tokens: int
    eval_extractor_max_tokens: int | None
    extractor_steps_shown: int | None
    extractor_reply_prefix: str | None
    unusable_cards: str
    skill_applicability: bool
    solver_win_reward: float
    solver_progress_reward: float
    solver_samples: str
    advantage_std: str
    group_of_one: str
    lambda_extractor: float
    lambda_solver: float
    train_extractor: bool
    train_solver: bool
    eval_with_skill: bool
    eval_source_max_steps: int | None
    valid_every: int
    valid_tasks: int
    mini_batch_size: int | None
    drop_zero_advantage: bool
    #: The policy trainer's settings (``arena.core.rl.TrainerConfig`` checks them).
    trainer: dict[str, Any]

    def __post_init__(self) -> None:
        for name, allowed in (("mode", MODES), ("unusable_cards", UNUSABLE_CARDS),
                              ("solver_samples", SOLVER_SAMPLES), ("advantage_std", ADVANTAGE_STD),
                              ("group_of_one", GROUP_OF_ONE)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"method.{name} must be one of {allowed}, got '{getattr(self, name)}'")
