"""Multi-turn, multi-role policy-gradient training (GRPO-style) shared by the RL methods.

Core knows no method: a method turns its episodes into :class:`Sample` sequences with roles and
groups, calls :func:`assign_advantages`, then :meth:`PolicyTrainer.step`.
"""

import importlib
from typing import TYPE_CHECKING, Any

from arena.core.rl import sft  # imports no torch until it trains
from arena.core.rl.advantages import (
    ESTIMATORS,
    AdvantageSettings,
    EpisodeSignal,
    assign_advantages,
    discounted_returns,
    group_advantages,
    step_advantages,
    with_signal,
)
from arena.core.rl.data import (
    Sample,
    Turn,
    concat_turns,
    decision_samples,
    episode_sample,
    mini_batches,
    sample_from_choice,
    step_anchors,
    terminal_rewards,
)
from arena.core.rl.ledger import StepLedger

if TYPE_CHECKING:
    from arena.core.rl.checkpointed import CheckpointedTrainer
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

#: Names whose modules import torch: loaded on first use, so that a method module can import
#: this package at its top without costing ``arena plugins`` or a name check a torch import.
_LAZY = {
    **dict.fromkeys(("LossOutput", "RoleStats", "clipped_surrogate", "low_var_kl", "policy_loss",
                     "token_entropy", "token_logprobs"), "loss"),
    **dict.fromkeys(("LoraSettings", "PolicyTrainer", "TrainerConfig"), "trainer"),
    "CheckpointedTrainer": "checkpointed",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'arena.core.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"arena.core.rl.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ESTIMATORS",
    "AdvantageSettings",
    "CheckpointedTrainer",
    "EpisodeSignal",
    "LoraSettings",
    "LossOutput",
    "PolicyTrainer",
    "RoleStats",
    "Sample",
    "StepLedger",
    "TrainerConfig",
    "Turn",
    "assign_advantages",
    "clipped_surrogate",
    "concat_turns",
    "decision_samples",
    "discounted_returns",
    "episode_sample",
    "group_advantages",
    "low_var_kl",
    "mini_batches",
    "policy_loss",
    "sample_from_choice",
    "sft",
    "step_advantages",
    "step_anchors",
    "terminal_rewards",
    "token_entropy",
    "token_logprobs",
    "with_signal",
]
