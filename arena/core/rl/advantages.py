"""GRPO advantages: each reward normalised within its group, then scaled per role.

Two standard deviations are in use, and the choice is the caller's (``std``): ``unbiased``
(Bessel-corrected, n - 1), as ``torch.std`` computes it in verl's GRPO (which verl-agent, and so
SkillRL, runs); ``population`` (n), as Evolving-RL's own ``grpo_normalize`` (in its reward
functions module) computes it. A group of one sample has no baseline to compare
against, so its advantage is 0 here (verl keeps the raw reward there, and so does Evolving-RL's
code, which leaves a one-sample group's reward as it is).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence

from arena.core.rl.data import Sample

#: Standard deviations :func:`group_advantages` can normalise by.
STD_KINDS = ("unbiased", "population")


def group_advantages(
    rewards: Sequence[float], groups: Sequence[Hashable], eps: float = 1e-6,
    std: str = "unbiased",
) -> list[float]:
    """``(r - mean_g) / (std_g + eps)`` for each reward, with mean and std (``unbiased`` or
    ``population``) over its group ``g``; 0 for a group of one."""
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, not {std!r}")
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group ids")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    advantages = [0.0] * len(rewards)
    for indices in members.values():
        if len(indices) < 2:
            continue
        values = [float(rewards[i]) for i in indices]
        mean = math.fsum(values) / len(values)
        dof = len(values) - 1 if std == "unbiased" else len(values)
        spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / dof)
        for i, value in zip(indices, values):
            advantages[i] = (value - mean) / (spread + eps)
    return advantages


def assign_advantages(
    samples: Sequence[Sample], scale_by_role: Mapping[str, float], eps: float = 1e-6,
    std: str = "unbiased",
) -> Sequence[Sample]:
    """Set each sample's ``advantage`` to its group advantage times its role's scale (e.g.
    Evolving-RL: extractor 0.2, solver 1.0); a role not in ``scale_by_role`` is scaled by 1.

    Groups are normalised before scaling, so a role's scale weighs that role's whole share of
    the gradient against the other's. Returns ``samples``, changed in place.
    """
    values = group_advantages([s.reward for s in samples], [s.group for s in samples], eps, std)
    for sample, advantage in zip(samples, values):
        sample.advantage = advantage * float(scale_by_role.get(sample.role, 1.0))
    return samples


def with_signal(samples: Sequence[Sample]) -> list[Sample]:
    """The samples whose advantage is not 0: a group whose rollouts all earned the same reward
    (all lost, most often) carries no policy gradient, only the KL and entropy terms, and under
    token-mean aggregation its tokens dilute the informative groups' gradient. Dropping them is
    DAPO's dynamic-sampling filter without the resampling (Yu et al., 2025)."""
    return [sample for sample in samples if sample.advantage != 0.0]
