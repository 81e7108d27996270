"""SkillRL's settings, typed, section by section; ``method:`` of ``config.yaml`` holds their values
and comments, the presets their alternatives."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

RETRIEVAL_MODES = ("template", "embedding")
#: ``retrieval.routing``: a task's skills are those of its true task type, or of the category
#: its goal's keywords name (the authors'; :func:`.retrieval.keyword_category`).
ROUTING_TASK_TYPE, ROUTING_KEYWORDS = "task_type", "keywords"
ROUTING = (ROUTING_TASK_TYPE, ROUTING_KEYWORDS)
#: ``retrieval.style``: how the skill section reads (see :func:`.retrieval.render_skills`).
STYLES = ("arena", "authors")
DEMONSTRATIONS = ("teacher", "expert")
#: ``sft.target``: what an SFT example's completion is: the bare action, the reasoning and the
#: action in the react solver's tags, or whichever of the two the run's solver writes.
SFT_TARGET_ACTION, SFT_TARGET_TAGGED, SFT_TARGET_AUTO = "action", "tagged", "auto"
SFT_TARGETS = (SFT_TARGET_AUTO, SFT_TARGET_ACTION, SFT_TARGET_TAGGED)
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
    routing: str
    style: str

    def __post_init__(self) -> None:
        _one_of("retrieval.mode", self.mode, RETRIEVAL_MODES)
        _one_of("retrieval.routing", self.routing, ROUTING)
        _one_of("retrieval.style", self.style, STYLES)


@dataclass
class SFT:
    enabled: bool
    demonstrations: str
    tasks: int
    steps: int
    #: Passes over the examples; when set, the steps are as many as that takes (``steps`` unused).
    epochs: float | None
    batch_size: int
    lr: float
    lr_scheduler: str
    weight_decay: float
    max_length: int | None
    lora: dict[str, Any] | None
    target: str

    def __post_init__(self) -> None:
        _one_of("sft.demonstrations", self.demonstrations, DEMONSTRATIONS)
        _one_of("sft.target", self.target, SFT_TARGETS)
        if self.epochs is not None and self.epochs <= 0:
            raise ValueError(f"method.sft.epochs must be > 0 or null (use sft.steps), got {self.epochs}")

    def steps_for(self, examples: int) -> int:
        """Optimizer steps: ``steps``, or ``epochs`` passes over ``examples`` in batches."""
        if self.epochs is None:
            return self.steps
        return max(1, math.ceil(self.epochs * examples / self.batch_size))


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
        if self.steps > 0 and self.group_size < 2:
            # The authors' normalisation leaves a lone rollout its raw reward; Arena's GRPO gives
            # it no advantage (no baseline): with two or more the two never differ.
            raise ValueError(f"method.rl.group_size must be >= 2 when method.rl.steps > 0, got "
                             f"{self.group_size}: a group of one rollout has no baseline to compare "
                             "against (the authors use 8)")


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
