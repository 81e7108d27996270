"""SkillRL's settings, typed, section by section; ``method:`` of ``config.yaml`` holds their values
and comments, the presets their alternatives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RETRIEVAL_MODES = ("template", "embedding")
DEMONSTRATIONS = ("teacher", "expert")
#: ``evolution.scheme``: the authors' one call on the first failures of any type, adding new
#: general skills only; or one call per weak task type on its own failures, adding or revising.
EVOLVE_AUTHORS, EVOLVE_PER_TYPE = "authors", "per_type"
EVOLVE_SCHEMES = (EVOLVE_AUTHORS, EVOLVE_PER_TYPE)
#: ``evolution.visible_to``: which prompts show evolved skills.
VISIBLE_TO_TRAINING, VISIBLE_TO_ALL = "training", "all"
#: What a GRPO group normalises over (``rl.advantage_over``).
ADVANTAGE_OVER = ("steps", "episodes")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"method.{name} must be one of {allowed}, got '{value}'")


@dataclass
class Collect:
    tasks: int


@dataclass
class TeacherSettings:
    #: None: the policy's own backend; else a backend's settings (``run.auxiliary_llm``).
    llm: dict[str, Any] | None
    max_new_tokens: int
    temperature: float
    reply_prefix: bool
    transcript_chars: int


@dataclass
class Distill:
    n_general: int
    max_type_skills: int
    max_mistakes: int
    consolidate_max_tokens: int


@dataclass
class Retrieval:
    mode: str
    top_general: int
    max_mistakes: int
    top_k: int
    threshold: float | None
    max_chars: int

    def __post_init__(self) -> None:
        _one_of("retrieval.mode", self.mode, RETRIEVAL_MODES)


@dataclass
class SFT:
    enabled: bool
    demonstrations: str
    tasks: int
    steps: int
    batch_size: int
    lr: float
    lr_scheduler: str
    weight_decay: float
    max_length: int | None
    lora: dict[str, Any] | None

    def __post_init__(self) -> None:
        _one_of("sft.demonstrations", self.demonstrations, DEMONSTRATIONS)


@dataclass
class RL:
    steps: int
    tasks_per_step: int
    group_size: int
    win_reward: float
    invalid_action_penalty: float
    advantage_over: str
    mini_batch_size: int | None
    #: The policy trainer's settings (``arena.core.rl.TrainerConfig`` checks them).
    trainer: dict[str, Any]

    def __post_init__(self) -> None:
        _one_of("rl.advantage_over", self.advantage_over, ADVANTAGE_OVER)


@dataclass
class Evolution:
    every: int
    valid_tasks: int | None
    temperature: float
    threshold: float
    scheme: str
    max_failures: int
    last_steps: int
    max_new_skills: int
    visible_to: str

    def __post_init__(self) -> None:
        _one_of("evolution.scheme", self.scheme, EVOLVE_SCHEMES)
        _one_of("evolution.visible_to", self.visible_to, (VISIBLE_TO_TRAINING, VISIBLE_TO_ALL))


@dataclass
class SkillRLSettings:
    inject_from_step: int
    collect: Collect
    teacher: TeacherSettings
    distill: Distill
    retrieval: Retrieval
    sft: SFT
    rl: RL
    evolution: Evolution
