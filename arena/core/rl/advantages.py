"""GRPO advantages: each reward normalised within its group, then scaled per role.

Two standard deviations are in use, and the choice is the caller's (``std``): ``unbiased``
(Bessel-corrected, n - 1), as ``torch.std`` computes it in verl's GRPO (which verl-agent, and so
SkillRL, runs); ``population`` (n), as Evolving-RL's own ``grpo_normalize`` (in its reward
functions module) computes it. A group of one sample has no baseline to compare
against, so its advantage is 0 by default (``single="zero"``); ``single="reward"`` keeps its raw
reward, as verl and Evolving-RL's code (which leaves a one-sample group's reward as it is) do.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from arena.core.rl.data import Sample

#: Standard deviations :func:`group_advantages` can normalise by.
STD_KINDS = ("unbiased", "population")


#: What :func:`group_advantages` gives a group of one sample: ``zero`` (no baseline, no signal)
#: or ``reward`` (the raw reward, as Evolving-RL's ``grpo_normalize`` and verl leave it).
SINGLE_KINDS = ("zero", "reward")


def group_advantages(
    rewards: Sequence[float], groups: Sequence[Hashable], eps: float = 1e-6,
    std: str = "unbiased", single: str = "zero",
) -> list[float]:
    """``(r - mean_g) / (std_g + eps)`` for each reward, with mean and std (``unbiased`` or
    ``population``) over its group ``g``; for a group of one, 0 or its reward (``single``)."""
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, not {std!r}")
    if single not in SINGLE_KINDS:
        raise ValueError(f"single must be one of {SINGLE_KINDS}, not {single!r}")
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group ids")
    members: dict[Hashable, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    advantages = [0.0] * len(rewards)
    for indices in members.values():
        if len(indices) < 2:
            if single == "reward":
                advantages[indices[0]] = float(rewards[indices[0]])
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


# -- step-level advantages: GRPO's episode advantage on every decision, or GiGPO's -------------

#: Advantage estimators a method selects by name (e.g. ``method.advantage.estimator``): ``grpo``
#: gives every decision of an episode the episode's group advantage; ``gigpo`` adds a step-level
#: advantage from the decisions taken in the same state across the group (Feng et al., 2025).
ESTIMATORS = ("grpo", "gigpo")
#: How GiGPO normalises within a group: ``mean_std`` (subtract the mean, divide by the std) or
#: ``mean`` (subtract the mean only), as verl-agent's ``mean_std_norm`` / ``mean_norm``.
NORMALISATIONS = ("mean_std", "mean")
#: What the episode-level statistics run over: one value per ``episode``, or one per ``step``
#: (verl-agent's rows are steps, each carrying its episode's reward, so a long episode weighs more).
EPISODE_LEVEL_OVER = ("episodes", "steps")


@dataclass(frozen=True)
class EpisodeSignal:
    """What a step-level estimator needs of one episode: its group (the task it repeats), its
    reward, and per decision the reward that followed and the state it was taken in (``anchor``:
    any hashable key, e.g. the observation text the decision saw)."""

    group: Hashable
    reward: float
    step_rewards: Sequence[float]
    anchors: Sequence[Hashable]
    #: Per decision, an amount taken off that decision's own row after discounting, at both
    #: levels (verl-agent's invalid-action penalty: off the row's episode score and off its step
    #: return, never carried back to earlier steps); empty for none. With
    #: ``episode_level_over="episodes"`` it enters the step level only.
    penalties: Sequence[float] = ()

    def __post_init__(self) -> None:
        if len(self.step_rewards) != len(self.anchors):
            raise ValueError(f"{len(self.step_rewards)} step rewards but {len(self.anchors)} anchors")
        if self.penalties and len(self.penalties) != len(self.anchors):
            raise ValueError(f"{len(self.penalties)} penalties but {len(self.anchors)} anchors")

    def penalty(self, index: int) -> float:
        return float(self.penalties[index]) if self.penalties else 0.0


@dataclass(frozen=True)
class AdvantageSettings:
    """The estimator and its knobs (verl-agent's GiGPO defaults: gamma 0.95, weight 1)."""

    estimator: str = "grpo"
    gamma: float = 0.95
    step_weight: float = 1.0
    normalisation: str = "mean_std"
    std: str = "unbiased"
    eps: float = 1e-6
    episode_level_over: str = "episodes"

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"advantage estimator must be one of {ESTIMATORS}, not {self.estimator!r}")
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"normalisation must be one of {NORMALISATIONS}, not {self.normalisation!r}")
        if self.std not in STD_KINDS:
            raise ValueError(f"std must be one of {STD_KINDS}, not {self.std!r}")
        if self.episode_level_over not in EPISODE_LEVEL_OVER:
            raise ValueError(f"episode_level_over must be one of {EPISODE_LEVEL_OVER}, "
                             f"not {self.episode_level_over!r}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0 (it keeps a group of equal values from dividing by 0), got {self.eps}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}`` for every step of one episode."""
    returns = [0.0] * len(rewards)
    following = 0.0
    for index in range(len(rewards) - 1, -1, -1):
        following = float(rewards[index]) + gamma * following
        returns[index] = following
    return returns


def _normalised(values: Sequence[float], groups: Sequence[Hashable], settings: AdvantageSettings) -> list[float]:
    if settings.normalisation == "mean_std":
        return group_advantages(values, groups, settings.eps, settings.std)
    members: dict[Hashable, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        members[group].append(index)
    centred = [0.0] * len(values)
    for indices in members.values():
        if len(indices) < 2:
            continue
        mean = math.fsum(float(values[i]) for i in indices) / len(indices)
        for i in indices:
            centred[i] = float(values[i]) - mean
    return centred


def step_advantages(episodes: Sequence[EpisodeSignal], settings: AdvantageSettings) -> list[list[float]]:
    """One advantage per decision of every episode.

    ``grpo``: the episode's reward normalised within its group (over its episodes, or over
    their steps with ``episode_level_over="steps"``), on each of its decisions.
    ``gigpo``: that, plus ``step_weight`` times the step-level advantage: each decision's
    discounted return (``gamma``) normalised among the decisions of the same group taken in the
    same anchor state (a step group). A group, or step group, of one has no baseline and adds 0.
    Each decision's ``penalties`` entry is taken off its own row at both levels, after
    discounting (see :class:`EpisodeSignal`).
    """
    if settings.episode_level_over == "steps":
        # One row per decision, its episode's reward less the decision's own penalty.
        rows = [(index, step, e.reward - e.penalty(step), e.group)
                for index, e in enumerate(episodes) for step in range(len(e.anchors))]
        normalised = _normalised([r for *_, r, _ in rows], [g for *_, g in rows], settings)
        per_step = [[0.0] * len(e.anchors) for e in episodes]
        for (index, step, _, _), value in zip(rows, normalised):
            per_step[index][step] = value
    else:
        episode_level = _normalised([e.reward for e in episodes], [e.group for e in episodes], settings)
        per_step = [[advantage] * len(e.anchors) for e, advantage in zip(episodes, episode_level)]
    if settings.estimator == "grpo":
        return per_step
    returns: list[float] = []
    keys: list[Hashable] = []
    where: list[tuple[int, int]] = []
    for e_index, episode in enumerate(episodes):
        for s_index, (value, anchor) in enumerate(
                zip(discounted_returns(episode.step_rewards, settings.gamma), episode.anchors)):
            returns.append(value - episode.penalty(s_index))
            keys.append((episode.group, anchor))
            where.append((e_index, s_index))
    for (e_index, s_index), step_level in zip(where, _normalised(returns, keys, settings)):
        per_step[e_index][s_index] += settings.step_weight * step_level
    return per_step
