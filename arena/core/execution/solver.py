"""The episode loop every solver shares, and the harness's standard solver.

:func:`play` owns termination (success, step limit, invalid-action limit, errors, a policy's
``Action.final``) and per-episode cost, so that every method's episodes are ended and counted the
same way. A solver only supplies a policy: observation + history -> :class:`Action`.
"""

from __future__ import annotations

import dataclasses
import re
import time
import traceback
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from arena.core.contract.env import Episode, Instructions
from arena.core.contract.llm import Chat, Choice, Generation, LLMBackend, SamplingParams
from arena.core.contract.settings import SolverSettings
from arena.core.contract.types import (  # Action and Policy are the contract's (types), used here
    Action,
    Experience,
    Observation,
    Policy,
    RolloutTokens,
    Step,
    Task,
    Termination,
    Trajectory,
)
from arena.core.host import stopping

#: How the standard solver acts (``solver.mode``): ``choose`` scores the admissible actions and
#: picks one (no free text, nothing invalid); ``react`` writes its reasoning and an action in
#: tags, and the action is mapped to an admissible one when it matches one (else it is played
#: as written, and the world answers "Nothing happens.": an invalid action).
MODES = ("choose", "react")
#: How many next-best options of a constrained choice a step records (for the viewer).
ALTERNATIVES = 3
#: Where a ``react`` reply ends under ``solver.stop_after_action`` (Evolving-RL's authors' stop
#: string, their episode loop, ``generate/episode.py:243``).
ACTION_END = "</action>"
_ACTION_TAG = re.compile(r"<action>(.*?)(?:</action>|$)", re.S | re.I)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"Unknown solver.mode {mode!r}. Choices: {', '.join(MODES)}")
    return mode


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())


_CJK = re.compile(r"[\u4e00-\u9fff]")


def well_formed(reply: str) -> bool:
    """A ``react`` reply in the form its prompt asks for: both reasoning tags (case as written),
    both action tags (any case) and no CJK ideographs, each tag merely present, as in
    verl-agent's action projection (GiGPO's and SkillRL's authors), with Arena's reasoning tag
    for their think tag."""
    action = reply.lower()
    return ("<reasoning>" in reply and "</reasoning>" in reply and "<action>" in action
            and "</action>" in action and not _CJK.search(reply))


def parse_action(reply: str, admissible: list[str] | tuple[str, ...]) -> str:
    """The action a ``react`` reply names: the last ``<action>`` tag's text, mapped to the
    admissible action it matches (exactly, or ignoring case, punctuation and spacing); the text
    as written when it matches none, or the whole reply when it has no tag."""
    tags = _ACTION_TAG.findall(reply)
    written = (tags[-1] if tags else reply).strip()
    if written in admissible:
        return written
    by_normal = {_normal(action): action for action in admissible}
    return by_normal.get(_normal(written), written)


#: How a ``react`` reply's action is read (``solver.action_parser``): ``admissible``
#: (:func:`parse_action`: the last tag, mapped to the admissible action it matches) or
#: ``first_tag`` (:func:`first_tag_action`: Evolving-RL's authors' reading, played as written).
ACTION_PARSERS = ("admissible", "first_tag")
_CLOSED_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.S | re.I)


def first_tag_action(reply: str) -> str:
    """The action as Evolving-RL's authors read it (``extract_action``,
    ``generate/episode.py:78-98``): the first closed ``<action>`` tag's text,
    stripped and lower-cased, played as written; with no closed tag, the reply's last 30
    characters (which the world then answers as an unknown command)."""
    match = _CLOSED_ACTION_TAG.search(reply)
    return reply[-30:] if match is None else match.group(1).strip().lower()


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
    shown_task: Task | None = None,
) -> Trajectory:
    """Run one episode to its end. Exceptions in the policy or environment end it as ``error``.

    ``shown_task`` is the task the policy sees in the trajectory it is handed (the public copy
    of a test task: the episode's own task carries the game's hidden payload); by default the
    episode's."""
    started = time.perf_counter()
    observation = episode.reset()
    trajectory = Trajectory(
        task=episode.task if shown_task is None else shown_task,
        initial_observation=observation.text,
        experience_ids=list(experience_ids or []),
    )
    invalid_streak = 0
    ended = False  # the policy's last action (Action.final) was played
    try:
        while True:
            if observation.won:
                trajectory.status = Termination.SUCCESS
                break
            if observation.done:
                trajectory.status = Termination.STEP_LIMIT if observation.truncated else Termination.FAILURE
                break
            if ended:
                trajectory.status = Termination.POLICY_ENDED
                break
            if len(trajectory.steps) >= max_steps:
                trajectory.status = Termination.STEP_LIMIT
                break
            if invalid_streak >= max_invalid_actions:
                trajectory.status = Termination.INVALID_ACTION_LIMIT
                break
            stopping.check()  # the run is being stopped: unwind, unrecorded (resume replays it)
            action = policy(observation, trajectory)
            valid = action.text in observation.admissible_actions
            if action.overflow:  # solver.end_at_context_limit: this turn did not fit
                trajectory.llm_calls += action.llm_calls
                trajectory.tokens_in += action.tokens_in
                trajectory.tokens_out += action.tokens_out
                trajectory.status = Termination.CONTEXT_LIMIT
                if action.overflow == "reply":  # written (and trained on), never played
                    trajectory.steps.append(Step(
                        action=action.text, observation="", valid=valid,
                        progress=trajectory.progress, thought=action.thought,
                        tokens_in=action.tokens_in, tokens_out=action.tokens_out,
                        logprob=action.logprob, rollout=action.rollout,
                        well_formed=action.well_formed))
                break
            observation = episode.step(action.text)
            invalid_streak = 0 if valid else invalid_streak + 1
            ended = action.final
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
                    well_formed=action.well_formed,
                    alternatives=[[text, logprob] for text, logprob in action.alternatives],
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


def render_experiences(experiences: list[Experience], max_items: int, max_chars: int | None) -> str:
    """The prompt section that shows retrieved experiences (each cut to ``max_chars``; None:
    shown whole, as Evolving-RL's authors show a skill card)."""
    blocks = []
    for number, experience in enumerate(experiences[:max_items], start=1):
        text = experience.text.strip()
        if max_chars is not None and len(text) > max_chars:
            text = text[: max_chars - 3].rstrip() + "..."
        blocks.append(f"[{number}] ({experience.kind}) {text}")
    return "\n".join(blocks)


#: Prompt layouts of the standard solver (``solver.layout``).
#: ``window``: one user message rebuilt each step (task, the last ``history`` steps, the current
#: observation): short prompts whose middle changes every step, so little is reused from a cache.
#: ``transcript``: the episode as chat turns (task; then per step the action as the assistant's
#: turn and the reply as the user's), appended and never rewritten, so every step's prompt
#: extends the previous one and a prefix cache computes only the new turn. Evolving-RL's authors
#: keep one growing context the same way.
LAYOUTS = ("window", "transcript")


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"Unknown solver.layout {layout!r}. Layouts: {', '.join(LAYOUTS)}")
    return layout


def check_admissible_turns(admissible_turns: str) -> str:
    if admissible_turns not in ADMISSIBLE_TURNS:
        raise ValueError(f"Unknown solver.admissible_turns {admissible_turns!r}. "
                         f"Choices: {', '.join(ADMISSIBLE_TURNS)}")
    return admissible_turns


def build_prompt(
    task: Task,
    observation: Observation,
    trajectory: Trajectory,
    experiences: list[Experience],
    *,
    history: int,
    show_admissible: bool,
    max_experiences: int,
    max_experience_chars: int | None,
    layout: str = "window",
    admissible_shown: list[list[str]] | None = None,
    admissible_turns: str = "full",
    mode: str = "choose",
    instructions: Instructions | None = None,
) -> Chat:
    """The standard solver's prompt in ``layout`` for ``mode``; its first user message states the
    task (what methods add to, see :func:`with_task_message`). In the ``react`` mode the
    transcript shows each past reply as it was written (reasoning and action). The system
    prompt is the environment's (``instructions``; the generic wording where None).

    ``admissible_shown`` (transcript layout with ``show_admissible``): the admissible actions of
    each turn so far, the current one last, as the policy saw them; past turns keep theirs, so
    the transcript stays exactly as it was shown.
    """
    task_parts = [trajectory.initial_observation.strip()]
    if experiences:
        rendered = render_experiences(experiences, max_experiences, max_experience_chars)
        task_parts.append(f"Relevant experience from earlier tasks:\n{rendered}")
    system = (instructions or Instructions()).system_prompt(check_mode(mode))
    if check_layout(layout) == "transcript":
        return _transcript(task_parts, trajectory, show_admissible, admissible_shown,
                           check_admissible_turns(admissible_turns), system,
                           replies=mode == "react")
    parts = task_parts
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
        parts.append(_admissible_line(observation.admissible_actions))
    parts.append("Your reasoning and next action:" if mode == "react" else "Your next action:")
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _admissible_line(actions: list[str] | tuple[str, ...]) -> str:
    return "Admissible actions: " + ", ".join(actions)


#: How later turns of the transcript list the admissible actions (``solver.admissible_turns``):
#: ``full`` repeats the whole list in every turn, as Evolving-RL's authors do (about 140 tokens a
#: turn for 30 commands); ``changes`` gives the whole list in the first turn, then only the
#: actions that became admissible or stopped being so (about 35).
ADMISSIBLE_TURNS = ("full", "changes")


def _admissible_changes(before: list[str], now: list[str]) -> str:
    was, now_set = set(before), set(now)
    added = [action for action in now if action not in was]
    removed = [action for action in before if action not in now_set]
    if not added and not removed:
        return "Admissible actions: unchanged."
    lines = []
    if added:
        lines.append("Now admissible: " + ", ".join(added))
    if removed:
        lines.append("No longer admissible: " + ", ".join(removed))
    return "\n".join(lines)


def _transcript(
    task_parts: list[str],
    trajectory: Trajectory,
    show_admissible: bool,
    admissible_shown: list[list[str]] | None,
    admissible_turns: str,
    system: str,
    replies: bool = False,
) -> Chat:
    """``replies``: past turns show what the model wrote (a step's ``thought``, the whole reply
    of the react mode) rather than the bare action, so each prompt extends the last one."""
    turns = len(trajectory.steps) + 1
    if show_admissible and (admissible_shown is None or len(admissible_shown) != turns):
        raise ValueError(
            "The transcript layout shows each turn's admissible actions: pass admissible_shown, "
            f"one list per turn ({turns} here), as StandardSolver.policy does"
        )
    contents = ["\n\n".join(task_parts)] + [step.observation for step in trajectory.steps]
    chat: Chat = [{"role": "system", "content": system}]
    for turn, content in enumerate(contents):
        if turn > 0:
            step = trajectory.steps[turn - 1]
            said = step.thought if replies and step.thought else step.action
            chat.append({"role": "assistant", "content": said})
        if show_admissible:
            shown: list[list[str]] = admissible_shown  # type: ignore[assignment]
            if turn == 0 or admissible_turns == "full":
                listed = _admissible_line(shown[turn])
            else:
                listed = _admissible_changes(shown[turn - 1], shown[turn])
            content = f"{content}\n\n{listed}"
        chat.append({"role": "user", "content": content})
    return chat


def with_task_message(chat: Chat, edit: Callable[[str], str]) -> Chat:
    """``chat`` with its first user message (the task, in every layout) replaced by
    ``edit(content)``: how a method puts its own sections beside the task."""
    index = next(i for i, message in enumerate(chat) if message["role"] == "user")
    return [*chat[:index], {**chat[index], "content": edit(chat[index]["content"])}, *chat[index + 1 :]]


class EndOnRepeat:
    """``policy``, ending its episode on an action equal to the one before, once played
    (``Action.final``): ExpeL's and Reflexion's authors end an episode so."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def __call__(self, observation: Observation, trajectory: Trajectory) -> Action:
        action = self.policy(observation, trajectory)
        if trajectory.steps and trajectory.steps[-1].action == action.text:
            return dataclasses.replace(action, final=True)
        return action


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
        max_experience_chars: int | None = 800,
        temperature: float = 0.0,
        top_p: float = 1.0,
        prompt_builder: Callable[..., Chat] = build_prompt,
        layout: str = "window",
        admissible_turns: str = "full",
        mode: str = "choose",
        reasoning_max_tokens: int = 64,
        instructions: Instructions | None = None,
        end_at_context_limit: bool = False,
        stop_after_action: bool = False,
        action_parser: str = "admissible",
    ) -> None:
        self.llm = llm
        if action_parser not in ACTION_PARSERS:
            raise ValueError(f"Unknown solver.action_parser {action_parser!r}. Choices: {', '.join(ACTION_PARSERS)}")
        self.action_parser = action_parser
        #: ``react``: a reply ends at its first ``</action>`` (:data:`ACTION_END`).
        self.stop_after_action = bool(stop_after_action)
        #: ``react``: a turn that does not fit ends the episode (:func:`overflow`).
        self.end_at_context_limit = bool(end_at_context_limit)
        #: The environment's (``run.env.instructions``): its system prompt and command help.
        self.instructions = instructions or Instructions()
        self.mode = check_mode(mode)
        self.reasoning_max_tokens = int(reasoning_max_tokens)
        self.layout = check_layout(layout)
        self.admissible_turns = check_admissible_turns(admissible_turns)
        self.history = history
        self.show_admissible = show_admissible
        self.max_experiences = max_experiences
        self.max_experience_chars = max_experience_chars
        self.temperature = temperature
        self.top_p = top_p
        self.prompt_builder = prompt_builder

    @classmethod
    def from_config(cls, llm: LLMBackend, solver: SolverSettings | Mapping[str, Any],
                    **overrides: Any) -> StandardSolver:
        """The solver the ``solver`` config section describes (typed, or the section as
        configured); ``overrides`` win (a method's own prompt builder, say)."""
        if not isinstance(solver, SolverSettings):
            solver = SolverSettings.from_config(solver)
        settings = dataclasses.asdict(solver)
        return cls(llm, **{**settings, **overrides})

    def prompts(self, task: Task, experiences: list[Experience]) -> Callable[[Observation, Trajectory], Chat]:
        """The prompt of each step of one episode. It remembers each turn's admissible actions,
        which the transcript layout keeps showing in later turns."""
        admissible_shown: list[list[str]] = []

        def prompt_of(observation: Observation, trajectory: Trajectory) -> Chat:
            del admissible_shown[len(trajectory.steps) :]  # one list per turn, the current last
            admissible_shown.append(list(observation.admissible_actions))
            return self.prompt_builder(
                task,
                observation,
                trajectory,
                experiences,
                history=self.history,
                show_admissible=self.show_admissible,
                max_experiences=self.max_experiences,
                max_experience_chars=self.max_experience_chars,
                layout=self.layout,
                admissible_shown=admissible_shown,
                admissible_turns=self.admissible_turns,
                mode=self.mode,
                instructions=self.instructions,
            )

        return prompt_of

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

        prompt_of = self.prompts(task, experiences)

        if self.mode == "react":
            return self._react_policy(prompt_of, seed, temperature, top_p)

        def act(observation: Observation, trajectory: Trajectory) -> Action:
            prompt = prompt_of(observation, trajectory)
            params = SamplingParams(
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=32,
                seed=seed + len(trajectory.steps),
            )
            options = list(observation.admissible_actions)
            (choice,) = self.llm.choose([prompt], [options], params)
            action = _action(choice, choice.text)
            ranked = sorted((lp, i) for i, lp in enumerate(choice.option_logprobs) if i != choice.index)
            action.alternatives = [(options[i], round(float(lp), 4)) for lp, i in reversed(ranked[-ALTERNATIVES:])]
            return action

        return act

    def _react_policy(self, prompt_of: Callable[[Observation, Trajectory], Chat], seed: int,
                      temperature: float, top_p: float) -> Policy:
        """Reasoning then an action, as free text; every generated token is the step's rollout,
        so RL trains on the reasoning too."""

        def act(observation: Observation, trajectory: Trajectory) -> Action:
            prompt = prompt_of(observation, trajectory)
            params = SamplingParams(temperature=temperature, top_p=top_p,
                                    max_new_tokens=self.reasoning_max_tokens,
                                    seed=seed + len(trajectory.steps),
                                    stop=(ACTION_END,) if self.stop_after_action else ())
            (reply,) = self.llm.generate([prompt], params)
            text = (first_tag_action(reply.text) if self.action_parser == "first_tag"
                    else parse_action(reply.text, observation.admissible_actions))
            action = _action(reply, text, thought=reply.text)
            action.well_formed = well_formed(reply.text)
            if self.end_at_context_limit:
                action.overflow = overflow(reply, self.reasoning_max_tokens)
            return action

        return act


def overflow(reply: Generation, max_new_tokens: int) -> str:
    """Why a ``react`` turn did not fit, as Evolving-RL's authors end an episode on it (status
    TRUNCATED, ``generate/episode.py:223-250, 286-288``): ``prompt`` when the
    transcript had to be cut to fit ``llm.max_context``; ``reply`` when the reply ran to its
    token limit without closing its action (their generation stops at ``</action>``, so only a
    reply cut by the limit lacks it); empty when it fit. A reply whose end-of-turn token is
    exactly its last allowed token, with no closing tag, counts as cut."""
    if reply.prompt_cut:
        return "prompt"
    if reply.tokens_out >= max_new_tokens and ACTION_END not in reply.text.lower():
        return "reply"
    return ""


def _action(output: Choice | Generation, text: str, thought: str = "") -> Action:
    """One LLM call's decision, its cost and the exact tokens it wrote (the step's rollout)."""
    return Action(
        text=text,
        thought=thought,
        tokens_in=output.tokens_in,
        tokens_out=output.tokens_out,
        llm_calls=1,
        logprob=float(sum(output.logprobs)),
        rollout=RolloutTokens(output.prompt_token_ids, output.token_ids, output.logprobs),
    )
