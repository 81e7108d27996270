"""Training samples: one token sequence per sample, with a mask of the tokens the policy wrote.

A multi-turn episode is one growing sequence (prompt, action, observation, action, ...): the
environment's tokens stay in the context the model is trained on but are masked out of the loss,
so the policy is never trained to predict what the world says.
"""

from __future__ import annotations

import math
import numbers
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from arena.core.contract.types import Trajectory


@dataclass
class Sample:
    """One training sequence.

    ``loss_mask[t] == 1`` marks a token the policy generated (trained on); 0 marks prompt,
    environment and observation tokens. ``old_logprobs`` is aligned with ``input_ids`` and only
    read where the mask is 1: the log-prob the rollout policy gave that token. ``group`` is the
    caller's id of the set whose rewards are normalised together (see
    :func:`arena.core.rl.advantages.assign_advantages`). ``episode`` is shared by the samples
    of one episode trained decision by decision (:func:`decision_samples`), so that the
    ``episode-mean`` aggregation weighs that episode as one; None for a sample that is a whole
    episode (or card) of its own.
    """

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    role: str
    group: str
    reward: float
    advantage: float = 0.0
    episode: str | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if n == 0:
            raise ValueError("a sample needs at least one token")
        if len(self.loss_mask) != n or len(self.old_logprobs) != n:
            raise ValueError(
                f"input_ids ({n}), loss_mask ({len(self.loss_mask)}) and old_logprobs "
                f"({len(self.old_logprobs)}) must have the same length"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask holds only 0 and 1")
        if self.loss_mask[0]:
            # Nothing predicts the first token, so it cannot be trained on.
            raise ValueError("the first token must be context (loss_mask[0] == 0)")
        if not all(math.isfinite(lp) for lp, m in zip(self.old_logprobs, self.loss_mask) if m):
            raise ValueError("old_logprobs must be finite at generated tokens")

    @property
    def n_trained(self) -> int:
        """Number of generated tokens, those the loss sees."""
        return sum(self.loss_mask)


class Turn(NamedTuple):
    """One segment of an episode: tokens, whether the policy wrote them, and their log-probs
    (required when generated; ignored otherwise)."""

    tokens: Sequence[int]
    generated: bool
    logprobs: Sequence[float] | None = None


def sample_from_choice(
    prompt_ids: Sequence[int],
    choice_token_ids: Sequence[int],
    choice_logprobs: Sequence[float],
    role: str,
    group: str,
    reward: float,
) -> Sample:
    """A single-turn sample: the prompt as context, then the chosen reply (e.g. a
    :class:`arena.core.contract.llm.Choice` or :class:`~arena.core.contract.llm.Generation`) as trained tokens."""
    return concat_turns(
        [Turn(prompt_ids, False), Turn(choice_token_ids, True, choice_logprobs)],
        role=role,
        group=group,
        reward=reward,
    )


def concat_turns(turns: Sequence[Turn | tuple], *, role: str, group: str, reward: float) -> Sample:
    """Join an episode's turns into one sequence; only generated turns get ``loss_mask`` 1.

    The caller must pass the exact tokens the model saw and wrote, in order; re-tokenising a
    rendered transcript can split tokens differently and train on tokens never sampled.
    """
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for raw in turns:
        turn = Turn(*raw)
        tokens = list(turn.tokens)
        if turn.generated:
            if turn.logprobs is None or len(turn.logprobs) != len(tokens):
                raise ValueError("a generated turn needs one log-prob per token")
            logprobs.extend(float(lp) for lp in turn.logprobs)
        else:
            logprobs.extend([0.0] * len(tokens))
        ids.extend(tokens)
        mask.extend([int(turn.generated)] * len(tokens))
    return Sample(ids, mask, logprobs, role=role, group=group, reward=float(reward))


def decision_samples(trajectory: Trajectory, *, role: str, group: str, reward: float,
                     advantage: float | Sequence[float]) -> list[Sample]:
    """One sample per model decision of an episode (its exact rollout tokens), each carrying the
    episode's advantage (how a multi-turn episode enters GRPO when turns are trained apart), or
    its own when ``advantage`` is a sequence with one value per step (a step-level estimator's,
    :func:`arena.core.rl.advantages.step_advantages`). Steps without rollout tokens (scripted or
    reloaded without them) give none. The samples share one ``episode`` id, new per call."""
    per_step = ([float(advantage)] * len(trajectory.steps) if isinstance(advantage, numbers.Real)
                else [float(value) for value in advantage])  # type: ignore[union-attr]
    if len(per_step) != len(trajectory.steps):
        raise ValueError(f"{len(per_step)} advantages for an episode of {len(trajectory.steps)} steps")
    samples = []
    episode = uuid.uuid4().hex  # only groups this call's samples; never part of a result
    for step, step_advantage in zip(trajectory.steps, per_step):
        if step.rollout is None or not step.rollout.token_ids:
            continue
        sample = sample_from_choice(step.rollout.prompt_token_ids, step.rollout.token_ids,
                                    step.rollout.logprobs, role=role, group=group, reward=reward)
        sample.advantage = step_advantage
        sample.episode = episode
        samples.append(sample)
    return samples


def step_anchors(trajectory: Trajectory) -> list[str]:
    """The state each decision was taken in, as the text the agent had just seen: the first
    observation for the first step, then each step's reply (GiGPO's anchor observation)."""
    seen = [trajectory.initial_observation] + [step.observation for step in trajectory.steps]
    return seen[: len(trajectory.steps)]


def terminal_rewards(trajectory: Trajectory, reward: float) -> list[float]:
    """The episode's reward on its last step and 0 on the others (the per-step rewards of an
    environment that rewards only the end, e.g. 10 for a win)."""
    return [0.0] * (len(trajectory.steps) - 1) + [float(reward)] if trajectory.steps else []


def episode_sample(trajectory: Trajectory, *, role: str, group: str, reward: float,
                   advantage: float) -> Sample | None:
    """The whole episode as one sample: each decision's prompt grows from the previous prompt
    and decision (the standard solver's ``transcript`` layout), so the last prompt and reply hold
    every decision in place, each trained with its own rollout log-probs. This is how
    slime-based trainers (Evolving-RL's) see a multi-turn episode: one sequence, one sample.

    None when the prompts do not extend each other (the ``window`` layout rebuilds its prompt,
    and a transcript truncated to fit the context drops turns): use :func:`decision_samples`.
    """
    decisions = [step.rollout for step in trajectory.steps
                 if step.rollout is not None and step.rollout.token_ids]
    if not decisions:
        return None
    turns: list[Turn] = []
    seen: list[int] = []  # the tokens of all turns so far
    for rollout in decisions:
        prompt = list(rollout.prompt_token_ids)
        if prompt[: len(seen)] != seen or (len(prompt) == len(seen) and seen):
            return None
        turns.append(Turn(prompt[len(seen):], False))
        turns.append(Turn(rollout.token_ids, True, rollout.logprobs))
        seen = prompt + list(rollout.token_ids)
    sample = concat_turns(turns, role=role, group=group, reward=reward)
    sample.advantage = advantage
    return sample


def episode_keys(samples: Sequence[Sample]) -> list[object]:
    """Which episode each sample belongs to: its ``episode``, or its own index where it has none
    (a whole episode or a card is an episode of its own)."""
    return [index if sample.episode is None else sample.episode for index, sample in enumerate(samples)]


def mini_batches(samples: Sequence[Sample], size: int | None, rng: random.Random | None = None,
                 whole_episodes: bool = False) -> list[list[Sample]]:
    """The optimizer steps of one RL update: all samples in one (``size`` None: slime's one
    step per rollout batch), or mini-batches of ``size`` samples, one step each (verl's
    ``ppo_mini_batch_size``; the rollout log-probs stay the old policy's, so PPO's clip acts
    from the second step on). With ``rng`` the samples are shuffled first; without, they are
    split in order (verl's ``actor.shuffle: False``). ``whole_episodes`` shuffles episodes
    instead (the samples sharing an ``episode``; a sample without one is its own) and cuts the
    same number of mini-batches between them, each episode going where its first sample falls:
    every episode is trained in one step, as one sequence would be (the ``episode-mean``
    aggregation), in as many steps as the samples one by one would make (fewer only where an
    episode is longer than a mini-batch)."""
    if size is not None and int(size) < 1:
        raise ValueError(f"mini_batch_size must be at least 1 (or null), got {size}")
    if not size or int(size) >= len(samples):
        return [list(samples)]
    size = int(size)
    if not whole_episodes:
        order = list(samples)
        if rng is not None:
            rng.shuffle(order)
        return [order[start : start + size] for start in range(0, len(order), size)]
    units: dict[object, list[Sample]] = {}
    for key, sample in zip(episode_keys(samples), samples):
        units.setdefault(key, []).append(sample)
    order_units = list(units.values())
    if rng is not None:
        rng.shuffle(order_units)
    n_batches = -(-len(samples) // size)
    batches: list[list[Sample]] = [[] for _ in range(n_batches)]
    start = 0
    for unit in order_units:
        batches[start * n_batches // len(samples)].extend(unit)
        start += len(unit)
    return [batch for batch in batches if batch]
