"""The episode loop every solver shares, and the harness's standard solver.

:func:`play` owns termination (success, step limit, invalid-action limit, errors) and per-episode
cost, so that every method's episodes are ended and counted the same way. A solver only supplies a
policy: observation + history -> :class:`Action`.
"""

from __future__ import annotations

import time
import traceback
import zlib
from dataclasses import dataclass
from typing import Callable, Protocol

from arena.core.env import Episode
from arena.core.llm import Chat, LLMBackend, SamplingParams
from arena.core.types import (
    Experience,
    Observation,
    RolloutTokens,
    Step,
    Task,
    Termination,
    Trajectory,
)

SYSTEM_PROMPT = (
    "You are an agent in a household. Each turn you read an observation and reply with exactly one "
    "of the admissible actions, copied verbatim. Reach the task's goal in as few steps as possible."
)


@dataclass
class Action:
    """What a policy decided for one step, with what it cost."""

    text: str
    thought: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    llm_calls: int = 0
    logprob: float | None = None
    rollout: RolloutTokens | None = None


class Policy(Protocol):
    def __call__(self, observation: Observation, trajectory: Trajectory) -> Action: ...


def episode_seed(seed: int, task_id: str, variant: str = "default") -> int:
    """A per-episode seed that does not depend on the order or concurrency of episodes."""
    return (seed * 1_000_003 + zlib.crc32(f"{task_id}|{variant}".encode())) % (2**31 - 1)


def play(
    episode: Episode,
    policy: Policy,
    *,
    max_steps: int,
    max_invalid_actions: int,
    experience_ids: list[str] | None = None,
) -> Trajectory:
    """Run one episode to its end. Exceptions in the policy or environment end it as ``error``."""
    started = time.perf_counter()
    observation = episode.reset()
    trajectory = Trajectory(
        task=episode.task,
        initial_observation=observation.text,
        experience_ids=list(experience_ids or []),
    )
    invalid_streak = 0
    try:
        while True:
            if observation.won:
                trajectory.status = Termination.SUCCESS
                break
            if observation.done:
                trajectory.status = Termination.STEP_LIMIT if observation.truncated else Termination.FAILURE
                break
            if len(trajectory.steps) >= max_steps:
                trajectory.status = Termination.STEP_LIMIT
                break
            if invalid_streak >= max_invalid_actions:
                trajectory.status = Termination.INVALID_ACTION_LIMIT
                break
            action = policy(observation, trajectory)
            valid = action.text in observation.admissible_actions
            observation = episode.step(action.text)
            invalid_streak = 0 if valid else invalid_streak + 1
            trajectory.steps.append(
                Step(
                    action=action.text,
                    observation=observation.text,
                    valid=valid,
                    reward=observation.reward,
                    progress=observation.progress,
                    thought=action.thought,
                    tokens_in=action.tokens_in,
                    tokens_out=action.tokens_out,
                    logprob=action.logprob,
                    rollout=action.rollout,
                )
            )
            trajectory.llm_calls += action.llm_calls
            trajectory.tokens_in += action.tokens_in
            trajectory.tokens_out += action.tokens_out
            trajectory.reward += observation.reward
            trajectory.progress = max(trajectory.progress, observation.progress)
    except Exception as exc:  # recorded, never silently dropped
        trajectory.status = Termination.ERROR
        trajectory.error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    finally:
        episode.close()
    if trajectory.status is Termination.SUCCESS:
        trajectory.progress = 1.0
    trajectory.wall_s = time.perf_counter() - started
    return trajectory


def render_experiences(experiences: list[Experience], max_items: int, max_chars: int) -> str:
    """The prompt section that shows retrieved experiences."""
    blocks = []
    for number, experience in enumerate(experiences[:max_items], start=1):
        text = experience.text.strip()
        if len(text) > max_chars:
            text = text[: max_chars - 3].rstrip() + "..."
        blocks.append(f"[{number}] ({experience.kind}) {text}")
    return "\n".join(blocks)


def build_prompt(
    task: Task,
    observation: Observation,
    trajectory: Trajectory,
    experiences: list[Experience],
    *,
    history: int,
    show_admissible: bool,
    max_experiences: int,
    max_experience_chars: int,
) -> Chat:
    """The standard solver's prompt: experiences, recent history, observation, actions."""
    parts = [trajectory.initial_observation.strip()]
    if experiences:
        rendered = render_experiences(experiences, max_experiences, max_experience_chars)
        parts.append(f"Relevant experience from earlier tasks:\n{rendered}")
    recent = trajectory.steps[-history:] if history > 0 else []
    if recent:
        first = len(trajectory.steps) - len(recent) + 1
        lines = [
            f"Step {first + i}: > {step.action}\n{step.observation}" for i, step in enumerate(recent)
        ]
        parts.append("Recent steps:\n" + "\n".join(lines))
    if trajectory.steps:
        parts.append(f"Current observation: {observation.text}")
    if show_admissible:
        parts.append("Admissible actions: " + ", ".join(observation.admissible_actions))
    parts.append("Your next action:")
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


class StandardSolver:
    """Prompt + constrained choice of one admissible action per step.

    Methods that only change what the agent knows (insights, memories, skills) reuse it by
    returning experiences from ``retrieve``; methods that change how it acts override ``solve``.
    """

    def __init__(
        self,
        llm: LLMBackend,
        *,
        history: int = 4,
        show_admissible: bool = True,
        max_experiences: int = 4,
        max_experience_chars: int = 800,
        temperature: float = 0.0,
        top_p: float = 1.0,
        prompt_builder: Callable[..., Chat] = build_prompt,
    ) -> None:
        self.llm = llm
        self.history = history
        self.show_admissible = show_admissible
        self.max_experiences = max_experiences
        self.max_experience_chars = max_experience_chars
        self.temperature = temperature
        self.top_p = top_p
        self.prompt_builder = prompt_builder

    def policy(
        self,
        task: Task,
        experiences: list[Experience],
        seed: int,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> Policy:
        """The per-episode policy; ``temperature``/``top_p`` default to the solver's own."""
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p

        def act(observation: Observation, trajectory: Trajectory) -> Action:
            prompt = self.prompt_builder(
                task,
                observation,
                trajectory,
                experiences,
                history=self.history,
                show_admissible=self.show_admissible,
                max_experiences=self.max_experiences,
                max_experience_chars=self.max_experience_chars,
            )
            params = SamplingParams(
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=32,
                seed=seed + len(trajectory.steps),
            )
            (choice,) = self.llm.choose([prompt], [list(observation.admissible_actions)], params)
            return Action(
                text=choice.text,
                tokens_in=choice.tokens_in,
                tokens_out=choice.tokens_out,
                llm_calls=1,
                logprob=float(sum(choice.logprobs)),
                rollout=RolloutTokens(choice.prompt_token_ids, choice.token_ids, choice.logprobs),
            )

        return act
