"""GRPO advantages: each reward normalised within its group, then scaled per role.

The standard deviation is the unbiased (Bessel-corrected, n - 1) one, as ``torch.std`` computes
it in verl's and slime's GRPO (which Evolving-RL uses). A group of one sample has no baseline
to compare against, so its advantage is 0 (verl instead keeps the raw reward there).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence

from arena.core.rl.data import Sample


def group_advantages(
    rewards: Sequence[float], groups: Sequence[Hashable], eps: float = 1e-6
) -> list[float]:
    """``(r - mean_g) / (std_g + eps)`` for each reward, with mean and unbiased std over its
    group ``g``; 0 for a group of one."""
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
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        for i, value in zip(indices, values):
            advantages[i] = (value - mean) / (std + eps)
    return advantages


def assign_advantages(
    samples: Sequence[Sample], scale_by_role: Mapping[str, float], eps: float = 1e-6
) -> Sequence[Sample]:
    """Set each sample's ``advantage`` to its group advantage times its role's scale (e.g.
    Evolving-RL: extractor 0.2, solver 1.0); a role not in ``scale_by_role`` is scaled by 1.

    Groups are normalised before scaling, so a role's scale weighs that role's whole share of
    the gradient against the other's. Returns ``samples``, changed in place.
    """
    values = group_advantages([s.reward for s in samples], [s.group for s in samples], eps)
    for sample, advantage in zip(samples, values):
        sample.advantage = advantage * float(scale_by_role.get(sample.role, 1.0))
    return samples
