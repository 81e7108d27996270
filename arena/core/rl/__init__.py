"""Multi-turn, multi-role policy-gradient training (GRPO-style) shared by the RL methods.

Core knows no method: a method turns its episodes into :class:`Sample` sequences with roles and
groups, calls :func:`assign_advantages`, then :meth:`PolicyTrainer.step`.
"""

from arena.core.rl.advantages import assign_advantages, group_advantages
from arena.core.rl.data import Sample, Turn, concat_turns, decision_samples, sample_from_choice
from arena.core.rl.loss import (
    LossOutput,
    RoleStats,
    clipped_surrogate,
    low_var_kl,
    policy_loss,
    token_entropy,
    token_logprobs,
)
from arena.core.rl.trainer import LoraSettings, PolicyTrainer, TrainerConfig

__all__ = [
    "LoraSettings",
    "LossOutput",
    "PolicyTrainer",
    "RoleStats",
    "Sample",
    "TrainerConfig",
    "Turn",
    "assign_advantages",
    "clipped_surrogate",
    "concat_turns",
    "decision_samples",
    "group_advantages",
    "low_var_kl",
    "policy_loss",
    "sample_from_choice",
    "token_entropy",
    "token_logprobs",
]
