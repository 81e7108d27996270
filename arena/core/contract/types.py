"""The data that flows between environments, methods and the harness.

Everything here is plain data (dataclasses), JSON-serialisable through ``to_dict``/``from_dict``,
so that episodes can be written to ``episodes.jsonl`` and read back on ``--resume``.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


class Termination(str, enum.Enum):  # noqa: UP042 - StrEnum changes str() of members
    """Why an episode ended. Recorded per episode so failure modes can be told apart."""

    SUCCESS = "success"
    FAILURE = "failure"  # the environment ended the episode without success
    STEP_LIMIT = "step_limit"
    INVALID_ACTION_LIMIT = "invalid_action_limit"
    POLICY_ENDED = "policy_ended"  # the method's policy ended it (``Action.final``) without success
    ERROR = "error"  # an exception in the method or environment; the episode counts as failed
    #: A free-text turn no longer fit (``solver.end_at_context_limit``): the transcript outgrew
    #: ``llm.max_context`` or a reply ran to its token limit; Evolving-RL's authors end there.
    CONTEXT_LIMIT = "context_limit"


@dataclass(frozen=True)
class Task:
    """One task of one split. ``task_id`` is stable across releases of the same env version."""

    task_id: str
    env: str
    split: str
    task_type: str
    goal: str
    payload: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        return cls(**data)

    def content_hash(self) -> str:
        """Hash of everything that defines the task (used for split hashes)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class Observation:
    """What the agent sees after a reset or a step.

    ``admissible_actions`` is the full list of commands the environment accepts now; the
    standard solver chooses among them so even a tiny model always acts validly.
    """

    text: str
    admissible_actions: tuple[str, ...]
    reward: float = 0.0
    done: bool = False
    won: bool = False
    progress: float = 0.0  # fraction of the task's subgoals met, in [0, 1]
    #: ``done`` because the environment's own step limit ended the game (a level's own limit), not
    #: because the task failed: the episode ends as ``step_limit``, as at the harness's limit.
    truncated: bool = False


@dataclass
class RolloutTokens:
    """The exact tokens of one model decision, kept in memory for RL training (never written)."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


@dataclass
class Step:
    """One action and what came back."""

    action: str
    observation: str
    valid: bool
    reward: float = 0.0
    progress: float = 0.0
    thought: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    logprob: float | None = None
    rollout: RolloutTokens | None = field(default=None, repr=False, compare=False)
    #: The next best options the model scored, ``[text, summed log-prob]``, best first (for the
    #: viewer; a constrained choice records up to three).
    alternatives: list[list[Any]] = field(default_factory=list)
    #: The reply had the form the prompt asked for (``Action.well_formed``); whether its action
    #: was admissible is ``valid``.
    well_formed: bool = True

    def to_dict(self) -> dict[str, Any]:
        data = {key: value for key, value in self.__dict__.items() if key != "rollout"}
        return dict(data)


@dataclass
class Trajectory:
    """A whole episode: the task, the first observation, every step and how it ended."""

    task: Task
    initial_observation: str
    steps: list[Step] = field(default_factory=list)
    status: Termination = Termination.FAILURE
    reward: float = 0.0
    progress: float = 0.0
    experience_ids: list[str] = field(default_factory=list)
    llm_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    wall_s: float = 0.0
    error: str | None = None
    #: The variant of the same task and seed whose episode this one repeats without playing it
    #: (same prompts under greedy decoding, so the same episode); it then costs nothing.
    copy_of: str | None = None
    #: Experiences shown at evaluation that are not in the frozen store but were made at test
    #: time from non-test tasks (an Evolving-RL card from a train episode): the harness checks
    #: every other shown id against the frozen store.
    derived_experience_ids: list[str] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return self.status is Termination.SUCCESS

    @property
    def n_valid_actions(self) -> int:
        return sum(1 for step in self.steps if step.valid)

    def to_dict(self) -> dict[str, Any]:
        data = {key: value for key, value in self.__dict__.items() if key != "steps"}
        data["steps"] = [step.to_dict() for step in self.steps]
        data["experience_ids"] = list(self.experience_ids)
        data["status"] = self.status.value
        data["task"] = self.task.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        data["task"] = Task.from_dict(data["task"])
        data["status"] = Termination(data["status"])
        data["steps"] = [Step(**step) for step in data["steps"]]
        return cls(**data)

    def render(self, max_steps: int | None = None, reasoning: bool = False) -> str:
        """The first observation, then each step as ``> action`` and the reply (with
        ``reasoning``, the reasoning a free-text solver wrote before its action, where it wrote
        one). Methods render through their environment's
        :meth:`arena.core.contract.env.Instructions.render`, which uses this unless the environment reads
        differently."""
        lines = [self.initial_observation]
        steps = self.steps if max_steps is None else self.steps[-max_steps:]
        for step in steps:
            if reasoning and step.thought:
                lines.append(f"(reasoning) {step.thought.strip()}")
            lines.append(f"> {step.action}")
            lines.append(step.observation)
        return "\n".join(lines)


@dataclass(frozen=True)
class Provenance:
    """Where an experience came from: which tasks, of which split.

    The protocol uses ``source_split`` to prove that nothing learned came from a test split.
    """

    source_task_ids: tuple[str, ...]
    source_split: str

    def to_dict(self) -> dict[str, Any]:
        return {"source_task_ids": list(self.source_task_ids), "source_split": self.source_split}


@dataclass
class Experience:
    """One unit of what a method learned: an insight, a skill card, a memory, a trajectory..."""

    kind: str
    text: str
    provenance: Provenance
    metadata: dict[str, Any] = field(default_factory=dict)
    experience_id: str = ""

    def __post_init__(self) -> None:
        if not self.experience_id:
            blob = json.dumps(
                [self.kind, self.text, self.provenance.to_dict()], sort_keys=True
            ).encode()
            self.experience_id = f"{self.kind}-{hashlib.sha256(blob).hexdigest()[:16]}"


@dataclass
class EpisodeResult:
    """One line of ``episodes.jsonl``: everything the results and the leaderboard need."""

    phase: str  # "learn" or "evaluate"
    track: str  # "frozen" or "online" (evaluate) / "learn"
    task_id: str
    split: str
    task_type: str
    seed: int
    success: bool
    reward: float
    progress: float
    steps: int
    valid_actions: int
    status: str
    tokens_in: int
    tokens_out: int
    llm_calls: int
    wall_s: float
    experience_ids: list[str]
    variant: str = "default"  # e.g. "with_skill" / "without_skill" for paired evaluation
    error: str | None = None
    copy_of: str | None = None  # see Trajectory.copy_of: not played, so not counted in cost
    derived_experience_ids: list[str] = field(default_factory=list)  # see Trajectory's
    #: The phase's cost so far (llm_calls, tokens_in, tokens_out, wall_s), this episode included:
    #: the cost travels with the records, so a run killed after any record resumes with the
    #: cost and budget it had used (absent from records made before Arena kept it there).
    phase_cost: dict[str, float] | None = None

    @property
    def key(self) -> tuple[str, str, str, int, str]:
        """Identity of an episode for resume: the same key is never run twice."""
        return (self.phase, self.split, self.task_id, self.seed, self.variant)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["phase_cost"] is None:  # a record made without it stays as it was
            del data["phase_cost"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeResult:
        """From a line of episodes.jsonl (its integrity ``chain`` is the reader's to check)."""
        return cls(**{key: value for key, value in data.items() if key != "chain"})

    @classmethod
    def from_trajectory(
        cls, trajectory: Trajectory, *, phase: str, track: str, seed: int, variant: str = "default"
    ) -> EpisodeResult:
        task = trajectory.task
        return cls(
            phase=phase,
            track=track,
            task_id=task.task_id,
            split=task.split,
            task_type=task.task_type,
            seed=seed,
            success=trajectory.success,
            reward=trajectory.reward,
            progress=trajectory.progress,
            steps=len(trajectory.steps),
            valid_actions=trajectory.n_valid_actions,
            status=trajectory.status.value,
            tokens_in=trajectory.tokens_in,
            tokens_out=trajectory.tokens_out,
            llm_calls=trajectory.llm_calls,
            wall_s=round(trajectory.wall_s, 4),
            experience_ids=list(trajectory.experience_ids),
            variant=variant,
            error=trajectory.error,
            copy_of=trajectory.copy_of,
            derived_experience_ids=list(trajectory.derived_experience_ids),
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
    #: The next best options of a constrained choice, ``(text, summed log-prob)``, best first.
    alternatives: list[tuple[str, float]] = field(default_factory=list)
    #: The reply had the form the prompt asked for: reasoning and action in their tags, in the
    #: prompt's script (what GiGPO's and SkillRL's authors call a valid action; an inadmissible
    #: action in good form is one). Always true for a constrained choice.
    well_formed: bool = True
    #: The policy's last action: the episode ends once it is played (status ``policy_ended``,
    #: unless it won or the environment ended it), as ExpeL's and Reflexion's authors end an
    #: episode on a repeated action.
    final: bool = False
    #: The turn did not fit (``solver.end_at_context_limit``), and the episode ends with it:
    #: ``prompt``, the prompt had to be cut to fit ``llm.max_context`` (the turn is dropped, as
    #: if never generated); ``reply``, the reply ran to its token limit before closing its action
    #: (recorded and trained on, never played). Empty: it fit.
    overflow: str = ""


class Policy(Protocol):
    """Who acts in an episode: the observation and the episode so far -> the next action."""

    def __call__(self, observation: Observation, trajectory: Trajectory) -> Action: ...
