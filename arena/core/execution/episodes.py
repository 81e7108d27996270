"""Episodes: the harness plays each one (through the method's ``solve`` or a policy the method
passes), seals what it played, verifies by replay what it did not, and records the result.

What is credited at evaluation is decided here: an episode the harness played (sealed), or one a
method returned that a fresh episode of the deterministic environment reproduces step by step;
anything else becomes an error episode and a violation.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from arena.core.contract.env import POOL_SPLIT, TEST_SPLITS, Environment
from arena.core.contract.errors import BudgetExhausted, HookReturnError
from arena.core.contract.llm import LLMBackend
from arena.core.contract.run_api import STANDARD, EpisodeRequest, PolicyChoice
from arena.core.contract.settings import Sampling, Settings
from arena.core.contract.types import EpisodeResult, Experience, Policy, Task, Termination, Trajectory
from arena.core.execution.budget import Budget
from arena.core.execution.phase import EVALUATE, LEARN, PhaseGuard, ViolationLog
from arena.core.execution.solver import StandardSolver, episode_seed, play
from arena.core.execution.views import TaskGate, shown_task
from arena.core.host import stopping
from arena.core.services.run_services import Services
from arena.core.storage.journal import crash_point
from arena.core.storage.ledger import PhaseCost
from arena.core.storage.rundir import RunDir

if TYPE_CHECKING:
    import pluggy

    from arena.core.contract.run_api import Run


T = TypeVar("T")
R = TypeVar("R")


def checked_experiences(hook: str, method: str, value: object) -> list[Experience]:
    """A hook's list of experiences (None: none), or a :class:`HookReturnError` naming what was
    returned instead."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)) and all(isinstance(item, Experience) for item in value):
        return list(value)
    inner = next((type(i).__name__ for i in value if not isinstance(i, Experience)), None) \
        if isinstance(value, (list, tuple)) else None
    got = f"a list holding {inner}" if inner else type(value).__name__
    raise HookReturnError(f"{hook} of method '{method}' returned {got}; expected a list of "
                          "arena.core.contract.types.Experience (or None).")


def run_in_threads(work: Callable[[T], R], items: list[T], *, workers: int, llm: LLMBackend) -> list[R]:
    """``work`` over ``items`` in up to ``workers`` threads, each registered with a batching
    backend (``enter``/``leave``) so that their LLM calls are merged; results in item order."""
    enter = getattr(llm, "enter", lambda: None)
    leave = getattr(llm, "leave", lambda: None)

    # Nested pools (a ``solve`` that plays episodes of its own) share the outermost one's flag.
    flag = stopping.current_flag() or threading.Event()

    def registered(item: T) -> R:
        with stopping.sharing(flag):
            stopping.check()
            enter()
            try:
                return work(item)
            finally:
                leave()

    if workers <= 1 or len(items) <= 1:
        return [registered(item) for item in items]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode")
    try:
        return list(pool.map(registered, items))
    except BaseException as exc:
        # Items not started are dropped. An item that failed lets the running ones end as they
        # are; an interrupt (Ctrl-C, SIGTERM) stops them at their next step (arena.core.host.stopping).
        if not isinstance(exc, Exception):
            flag.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


#: The variant of the episode that is a task's result (a method's helper episodes take others).
PRIMARY: Final = "default"
#: A task's helper episodes lower the spot checks' rate per decision up to this many episodes
#: per task; a method playing more is checked proportionally more (its primary episodes keep
#: about SPOT_CHECKS / MAX_EPISODES_PER_TASK expected checks however many helpers it plays).
MAX_EPISODES_PER_TASK: Final = 4


@dataclass
class EpisodeFrame:
    """One ``run.play`` being played on a thread: its key, and the episodes played inside it."""

    task_id: str
    seed: int
    variant: str
    episodes: int = 0


class EpisodePace:
    """How many episodes a task of the evaluation takes: counted per thread from the harness's
    ``task_begun`` to the task's recorded result, each task being played on one thread (with the
    helper episodes its ``solve`` plays). Thread-safe."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.tasks_begun = self.episodes_begun = 0
        self.finished_tasks = self.finished_episodes = 0

    def task_begun(self) -> None:
        self._local.episodes = 0
        with self._lock:
            self.tasks_begun += 1

    def episode_begun(self) -> None:
        if getattr(self._local, "episodes", None) is not None:
            self._local.episodes += 1
        with self._lock:
            self.episodes_begun += 1

    def task_finished(self) -> None:
        episodes = getattr(self._local, "episodes", None)
        self._local.episodes = None
        if episodes is not None:
            with self._lock:
                self.finished_tasks += 1
                self.finished_episodes += episodes

    def episodes_per_task(self) -> float:
        """As many as the finished tasks took, at least as many as those begun have begun so
        far, at least one."""
        with self._lock:
            finished = self.finished_episodes / self.finished_tasks if self.finished_tasks else 0.0
            begun = self.episodes_begun / self.tasks_begun if self.tasks_begun else 0.0
        return max(1.0, finished, begun)


class EpisodeRunner:
    """Plays, verifies and records the run's episodes under the phase's rules."""

    def __init__(self, run: Run, *, settings: Settings, run_dir: RunDir, env: Environment,
                 phases: PhaseGuard, gate: TaskGate, violations: ViolationLog, budget: Budget,
                 services: Services, hooks: pluggy.HookRelay,
                 on_episode: Callable[[EpisodeResult], None],
                 phase_cost: Callable[[str], PhaseCost] | None = None) -> None:
        self._run = run
        self._settings = settings
        self._run_dir = run_dir
        self._env = env
        self._phases = phases
        self._gate = gate
        self._violations = violations
        self._budget = budget
        self._services = services
        self._hooks = hooks
        self._on_episode = on_episode
        self._phase_cost = phase_cost
        self.solver = StandardSolver.from_config(services.llm, settings.solver, instructions=env.instructions())
        self._keep_rollouts = False
        self._journaled: dict[tuple, Trajectory] = {}  # a killed step's episode, to finish it
        self._sealed: set[str] = set()  # seals of the episodes the harness played (evaluation)
        #: The variants each seal was played for, so that a helper episode (another variant of
        #: the test task) is never passed off as the task's result. A greedy primary can equal a
        #: helper episode step for step: then both are on the seal's set.
        self._sealed_as: dict[str, set[str]] = {}
        #: The helper variants (all but the result) of each test (task, seed) played or resumed,
        #: and how many helper episodes the harness played for it in this session.
        self._helpers: dict[tuple[str, int | None], set[str]] = {}
        self._helper_episodes: dict[tuple[str, int | None], int] = {}
        #: The evaluation's plan: every (test task, seed) credited, and the helper variants the
        #: method declared before play (``evaluation_variants``); nothing else of a test task
        #: is played at evaluation.
        self._plan: set[tuple[str, int]] = set()
        self._variants: frozenset[str] = frozenset()
        self._spot_check: Callable[[], None] | None = None
        self._spot_checks = 0  # about how many decisions of the evaluation are checked
        self._spot_steps = 1  # the decisions planned: its tasks x half their step limit
        self._pace = EpisodePace()
        self._local = threading.local()
        self._lock = threading.Lock()
        #: Learning episodes played with ``record=False``, charged as they were played: their
        #: record (if the method makes it) charges nothing again. Without this an episode the
        #: method never records would be free.
        self._charged_unrecorded: set[tuple] = set()

    @property
    def _method(self) -> str:
        return self._violations.method

    # -- settings of the phase ---------------------------------------------------------------

    def sampling(self) -> Sampling:
        return self._settings.learn.sampling if self._phases.is_learning() else self._settings.eval.sampling

    def max_steps(self) -> int:
        """Step limit of an episode in the current phase."""
        if self._phases.is_learning() and self._settings.learn.max_steps is not None:
            return self._settings.learn.max_steps
        return self.eval_max_steps()

    def eval_max_steps(self) -> int:
        """``eval.max_steps``, or the environment's own limit where it is null."""
        configured = self._settings.eval.max_steps
        return configured if configured is not None else self._env.max_steps

    def current_seed(self) -> int:
        """The run seed of the episode being played on this thread (``solve`` receives a derived
        per-episode seed; helper episodes a method plays inside ``solve`` take this one)."""
        seed = getattr(self._local, "seed", None)
        if seed is None:
            raise RuntimeError("current_seed() is only defined while an episode is being played")
        return int(seed)

    # -- rollout tokens of learning episodes (RL methods) ------------------------------------

    def keep_rollouts(self) -> None:
        """Keep learning episodes' exact tokens on disk until :meth:`discard_rollouts`, so a
        resumed iteration trains on them as played (an RL method calls it once, when built)."""
        self._keep_rollouts = True

    def discard_rollouts(self) -> None:
        """Drop the kept tokens (once the update they fed is checkpointed)."""
        self._run_dir.discard_rollouts()

    def _keeps_rollouts(self) -> bool:
        return self._keep_rollouts and self._phases.is_learning()

    # -- the record ----------------------------------------------------------------------------

    def _key(self, task: Task, seed: int, variant: str) -> tuple:
        return (self._phases.phase, task.split, task.task_id, seed, variant)

    def finished(self, task: Task, seed: int, variant: str = "default") -> EpisodeResult | None:
        """The recorded result of this episode if an earlier session finished it (resume)."""
        return self._run_dir.finished(self._key(task, seed, variant))

    def recorded_trajectory(self, task: Task, seed: int, variant: str = "default") -> Trajectory | None:
        """The trajectory recorded for this episode of the current phase (None: not played)."""
        return self._run_dir.load_trajectory(self._key(task, seed, variant))

    def resume_with(self, key: tuple, trajectory: Trajectory) -> None:
        """A step killed after its episode: the next play of ``key`` returns that episode."""
        self._journaled[key] = trajectory

    def record(self, trajectory: Trajectory, *, seed: int, variant: str = "default") -> EpisodeResult:
        """Write a finished episode to the run directory and charge it to the phase."""
        phase = self._phases.phase
        own = self._gate.own_task(trajectory.task)
        if phase == LEARN and own.split in (*TEST_SPLITS, POOL_SPLIT):
            raise self._violations.refusal(f"Method '{self._method}' recorded an episode of {own.split} "
                                           f"task {own.task_id} while learning.")
        trajectory.task = shown_task(own)  # the record's split and type are the harness's
        track = LEARN if phase == LEARN else self._phases.track
        result = EpisodeResult.from_trajectory(trajectory, phase=phase, track=track, seed=seed,
                                               variant=variant)
        if self._phase_cost is not None:  # the phase's cost travels with its records
            result.phase_cost = self._phase_cost(phase).on_record()
        if self._keeps_rollouts():
            self._run_dir.save_rollouts(result.key, trajectory)
        self._run_dir.record(result, trajectory)
        crash_point("episode.recorded")  # recorded, nothing after it done yet
        if phase == LEARN and not self._charged_when_played(result.key):
            self._budget.charge(episodes=1, env_steps=result.steps)
        elif variant == PRIMARY:
            self._pace.task_finished()
            if getattr(self._local, "planned", None) == (own.task_id, seed):
                self._local.planned = None  # the task's result is in: its thread plays no more of it
        self._on_episode(result)
        try:
            self._hooks.episode_end(run=self._run, result=result, trajectory=trajectory)
        except Exception as exc:  # an observer's bug must not end the run; it is on record
            self._violations.record(f"episode_end raised {type(exc).__name__}: {exc}")
        return result

    # -- playing -------------------------------------------------------------------------------

    def play(self, task: Task, experiences: list[Experience] | None = None, *, seed: int,
             variant: str = "default", record: bool = True, policy: PolicyChoice = None,
             max_steps: int | None = None, sampling: Mapping[str, float] | None = None) -> Trajectory:
        """Play one episode and (by default) record it.

        ``policy`` says who acts: None, the method's ``solve`` hook; ``"standard"``, the
        harness's standard solver (``sampling`` may set its decoding); or a policy of the
        method's (observation, trajectory -> action). ``max_steps`` sets a helper episode's own
        step limit (with a policy only). Learning episodes are charged to the learn budget; a
        call with the budget used up raises :class:`BudgetExhausted`. ``record=False`` records
        later with :meth:`record` (after ``update``, so a killed run never loses an update of a
        recorded episode).
        """
        if max_steps is not None and policy is None:
            raise ValueError("max_steps applies to episodes played with a policy only")
        if isinstance(policy, str) and policy != STANDARD:
            raise ValueError(f"policy={policy!r}: pass None (the method's solve), "
                             f"{STANDARD!r} (the standard solver) or a policy callable")
        if sampling is not None and policy != STANDARD:
            raise ValueError("sampling applies to policy='standard' episodes only: a policy of "
                             "your own decodes as it chooses (drop sampling from the request)")
        task = self._gate.own_task(task)  # split, type and payload are the harness's, not the caller's
        if not self._phases.is_learning():
            self._check_planned(task, seed, variant)
        if self._phases.is_learning():
            if task.split in (*TEST_SPLITS, POOL_SPLIT):
                kind = "source-pool" if task.split == POOL_SPLIT else "test"
                raise self._violations.refusal(
                    f"Method '{self._method}' played {kind} task {task.task_id} while learning.")
            exhausted = self._budget.exhausted()
            if exhausted:
                raise BudgetExhausted(f"Learning budget used up: {', '.join(exhausted)}")
        experiences = list(experiences or [])
        key = self._key(task, seed, variant)
        if variant != PRIMARY and task.split in TEST_SPLITS and not self._phases.is_learning():
            with self._lock:
                self._helpers.setdefault((task.task_id, seed), set()).add(variant)
        journaled = self._journaled.pop(key, None)
        if journaled is not None:  # a step killed after its episode: finish it with that episode
            self._seal(journaled, variant)
            return journaled
        if record and self._run_dir.finished(key) is not None:
            # Recorded by an interrupted session (e.g. a helper episode of a method's own
            # solve): give back what was played instead of playing it again.
            stored = self._run_dir.load_trajectory(key)
            if stored is not None:
                if self._keeps_rollouts():
                    self._run_dir.attach_rollouts(key, stored)
                self._seal(stored, variant)  # played and recorded (the record's chain was checked)
                return stored
        trajectory = self._played(task, experiences, seed, variant, policy, max_steps, sampling)
        if record:
            self.record(trajectory, seed=seed, variant=variant)
        elif self._phases.is_learning():
            self._charge_unrecorded(key, trajectory)
        return trajectory

    def _charge_unrecorded(self, key: tuple, trajectory: Trajectory) -> None:
        """A learning episode played off the record is charged now, as a recorded one is."""
        with self._lock:
            self._charged_unrecorded.add(key)
        self._budget.charge(episodes=1, env_steps=len(trajectory.steps))

    def _charged_when_played(self, key: tuple) -> bool:
        """Whether ``key`` was charged as it was played (``record=False``); its record then
        charges nothing again."""
        with self._lock:
            if key in self._charged_unrecorded:
                self._charged_unrecorded.discard(key)
                return True
            return False

    def play_request(self, request: EpisodeRequest) -> Trajectory:
        """``run.play(request)``: the episode a ``solve`` is playing (inside its frame, the same
        task, no seed or the seed ``solve`` was given, and the default variant or the frame's: a
        ``solve`` is not told which variant it plays), played under the harness's rules and
        returned unrecorded; otherwise an episode of its own (:meth:`play`)."""
        frame: EpisodeFrame | None = getattr(self._local, "frame", None)
        if frame is not None and request.task.task_id == frame.task_id \
                and request.variant in (PRIMARY, frame.variant) \
                and request.seed in (None, episode_seed(frame.seed, frame.task_id, frame.variant)):
            if request.policy is None:
                raise ValueError(f"run.play of {request.task.task_id} inside its own solve names no policy: "
                                 "a solve plays its episode with policy='standard' or a policy of its own.")
            seed = episode_seed(frame.seed, frame.task_id, frame.variant)
            if request.sampling is not None and request.policy != STANDARD:
                raise ValueError("sampling applies to policy='standard' episodes only: a policy of "
                                 "your own decodes as it chooses (drop sampling from the request)")
            if isinstance(request.policy, str):
                return self.standard_solve(request.task, request.experiences, seed,
                                           max_steps=request.max_steps, sampling=request.sampling)
            return self.play_policy(request.task, request.policy, request.experiences, request.max_steps)
        if request.seed is None:
            raise ValueError(f"EpisodeRequest of {request.task.task_id} has no seed: a new episode takes "
                             "the run seed it is played for (only the episode a solve is playing may "
                             "leave it out).")
        return self.play(request.task, request.experiences, seed=request.seed, variant=request.variant,
                         record=request.record, policy=request.policy, max_steps=request.max_steps,
                         sampling=request.sampling)

    def _played(self, task: Task, experiences: list[Experience], seed: int, variant: str,
                policy: PolicyChoice, max_steps: int | None,
                sampling: Mapping[str, float] | None) -> Trajectory:
        """One episode of the harness's ``task``: the method (its ``solve``, or its policy) sees
        the task's shown copy; what is recorded carries the harness's task, whatever the method
        returns. The play is a frame: at evaluation it holds exactly one episode."""
        started = time.perf_counter()
        shown = shown_task(task)
        outer = (getattr(self._local, "seed", None), getattr(self._local, "variant", None),
                 getattr(self._local, "frame", None))
        self._local.seed, self._local.variant = seed, variant
        self._local.frame = EpisodeFrame(task.task_id, seed, variant)
        episode_seed_ = episode_seed(seed, task.task_id, variant)
        try:
            if isinstance(policy, str):
                trajectory = self.standard_solve(shown, experiences, episode_seed_,
                                                 max_steps=max_steps, sampling=sampling)
            elif policy is not None:
                trajectory = self.play_policy(shown, policy, experiences, max_steps=max_steps)
            else:
                trajectory = self._hooks.solve(run=self._run, task=shown, experiences=experiences,
                                               seed=episode_seed_)
        except Exception as exc:  # a method bug ends this episode as an error, not the run
            trajectory = Trajectory(task=shown, initial_observation="", status=Termination.ERROR)
            trajectory.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._local.seed, self._local.variant, self._local.frame = outer
        if not isinstance(trajectory, Trajectory):
            message = (f"solve of method '{self._method}' returned {type(trajectory).__name__}; "
                       "expected a Trajectory (or None, for the standard solver)")
            trajectory = Trajectory(task=shown, initial_observation="", status=Termination.ERROR,
                                    error=message)
        elif not isinstance(trajectory.task, Task) or trajectory.task.task_id != task.task_id:
            trajectory = Trajectory(task=shown, initial_observation="", status=Termination.ERROR,
                                    error="solve returned no trajectory of this task")
        else:
            trajectory.task = shown  # the record's split and type are the harness's
            if task.split in TEST_SPLITS and not self._phases.is_learning():
                trajectory = self._verified(trajectory, task, seed, variant)
        trajectory.wall_s = max(trajectory.wall_s, time.perf_counter() - started)
        return trajectory

    def _check_planned(self, task: Task, seed: int, variant: str) -> None:
        """At evaluation a test task is played only as the plan says: a planned (task, seed),
        on the thread playing that task, its result started by the harness alone, a helper
        only of a variant the method declared before play. Refused on record otherwise."""
        if task.split not in TEST_SPLITS:
            return  # an extra episode of a learning task (a test-time source): recorded, counted
        method, where = self._method, f"{task.task_id} (seed {seed}, variant {variant!r})"
        planned = getattr(self._local, "planned", None)
        if (task.task_id, seed) not in self._plan:
            raise self._violations.refusal(
                f"Method '{method}' played test task {where}, which the evaluation plan does not "
                "hold; at evaluation a method plays only the task it is solving.")
        if planned != (task.task_id, seed):
            raise self._violations.refusal(
                f"Method '{method}' played test task {where} while the harness was "
                f"{'solving ' + planned[0] if planned else 'not solving a task'} on this thread; a "
                "task's episodes are played inside its own solve.")
        if variant == PRIMARY and getattr(self._local, "frame", None) is not None:
            raise self._violations.refusal(
                f"Method '{method}' started the result episode of {task.task_id} itself; the "
                "harness plays each task's result once (return it from solve).")
        if variant != PRIMARY and variant not in self._variants:
            declared = ", ".join(sorted(self._variants)) or "none"
            raise self._violations.refusal(
                f"Method '{method}' played variant {variant!r} of test task {task.task_id}, which it did "
                f"not declare (declared: {declared}); return the variant's name from the "
                "evaluation_variants hook to play it.")

    def play_many(self, requests: Sequence[EpisodeRequest], *,
                  on_done: Callable[[], object] | None = None) -> list[Trajectory]:
        """Play many requests side by side (``eval.concurrency`` threads, their LLM calls
        batched); results come back in request order; ``on_done()`` after each episode (a
        progress bar's ``advance``)."""

        def play_one(request: EpisodeRequest) -> Trajectory:
            trajectory = self.play_request(request)
            if on_done is not None:
                on_done()
            return trajectory

        return run_in_threads(play_one, list(requests), workers=self._settings.eval.concurrency,
                              llm=self._services.llm)

    def standard_policy(self, task: Task, experiences: list[Experience], seed: int,
                        sampling: Mapping[str, float] | None = None) -> Policy:
        """The harness's standard solver as a policy, decoding as the phase does (or ``sampling``)."""
        # A request's sampling is plain floats already (EpisodeRequest): no config to type here.
        chosen = self.sampling() if sampling is None else Sampling(sampling["temperature"], sampling.get("top_p", 1.0))
        return self.solver.policy(task, experiences, seed, temperature=chosen.temperature,
                                  top_p=chosen.top_p)

    def standard_solve(self, task: Task, experiences: list[Experience], seed: int,
                       max_steps: int | None = None,
                       sampling: Mapping[str, float] | None = None) -> Trajectory:
        """The standard solver's episode, for a ``solve`` that wraps rather than replaces it."""
        policy = self.standard_policy(task, experiences, seed, sampling)
        return self.play_policy(task, policy, experiences, max_steps=max_steps)

    def play_policy(self, task: Task, policy: Policy, experiences: list[Experience],
                    max_steps: int | None = None) -> Trajectory:
        """One episode of ``task`` driven by ``policy`` under the harness's step, invalid-action
        and error rules (not recorded: for a ``solve`` hook that changes how the agent acts).

        A policy with a ``start(episode)`` method (an expert, a demonstration recorder) is
        given the episode first; while learning only, since at evaluation it could read the
        game's hidden state."""
        limit = self.max_steps() if max_steps is None else int(max_steps)
        invalid = self._settings.eval.max_invalid_actions
        ids = [e.experience_id for e in experiences]
        start = getattr(policy, "start", None)
        own = self._gate.own_task(task)
        if self._phases.is_learning():
            if own.split in (*TEST_SPLITS, POOL_SPLIT):
                raise self._violations.refusal(f"Method '{self._method}' played {own.split} task "
                                               f"{own.task_id} while learning.")
            episode = self._env.open(own)
            if start is not None:
                start(episode)
            return self._shown(lambda shown: play(episode, shown(policy), max_steps=limit,
                                                  max_invalid_actions=invalid, experience_ids=ids),
                               limit)
        if start is not None:
            raise self._violations.refusal(
                f"Method '{self._method}' passed a policy that reads its episode (start) at "
                f"evaluation on {task.task_id}; such policies (experts, demonstrations) are for "
                "learning only.")
        self._count_evaluation_episode(own)
        derived = self._derived_experiences(own, experiences)
        spot_check = self._spot_check
        self._pace.episode_begun()

        def checked(observation: Any, trajectory: Trajectory) -> Any:
            if spot_check is not None and secrets.randbelow(1_000_000) < self.spot_rate() * 1_000_000:
                spot_check()
            return policy(observation, trajectory)

        trajectory = self._shown(
            lambda shown: play(self._env.open(own), shown(checked if spot_check is not None else policy),
                               max_steps=limit, max_invalid_actions=invalid, experience_ids=ids,
                               shown_task=shown_task(own)),
            limit)
        trajectory.derived_experience_ids = derived
        self._seal(trajectory)
        return trajectory

    def _count_evaluation_episode(self, task: Task) -> None:
        """At evaluation every episode is the one episode of a ``run.play`` (so it is recorded,
        and counted on the board when it is no task's result), of that play's task; a second
        episode inside one play (best of N inside ``solve``) or one outside any is refused."""
        frame: EpisodeFrame | None = getattr(self._local, "frame", None)
        method = self._method
        if frame is None:
            raise self._violations.refusal(
                f"Method '{method}' played an episode of {task.task_id} outside run.play at "
                "evaluation; every evaluation episode is played (and recorded) through run.play.")
        if frame.task_id != task.task_id:
            raise self._violations.refusal(
                f"Method '{method}' played {task.task_id} inside the play of {frame.task_id} at "
                "evaluation; play each task through run.play of its own.")
        frame.episodes += 1
        if frame.episodes > 1:
            raise self._violations.refusal(
                f"Method '{method}' played episode {frame.episodes} of {task.task_id} (variant "
                f"{frame.variant!r}) inside one play at evaluation; a play holds one episode, so "
                "no result is the best of several.")
        if frame.variant != PRIMARY and task.split in TEST_SPLITS:
            with self._lock:
                key = (task.task_id, frame.seed)
                self._helper_episodes[key] = self._helper_episodes.get(key, 0) + 1

    def _shown(self, played: Callable[[Callable[[Policy], Policy]], Trajectory], limit: int) -> Trajectory:
        """``played(shown)``, an episode whose policy ``shown`` wraps, reported to the progress
        display as it starts, at each step and when it ends (every episode played, a method's
        helper episodes too: a count of the plan's tasks alone stands still meanwhile)."""
        reporter, phase = self._services.reporter, self._phases.phase

        def shown(policy: Policy) -> Policy:
            def step(observation: Any, trajectory: Trajectory) -> Any:
                reporter.play_step(phase, len(trajectory.steps) + 1)
                return policy(observation, trajectory)
            return step

        reporter.play_start(phase, limit)
        try:
            return played(shown)
        finally:
            reporter.play_end(phase)

    # -- evaluation: set up by the harness ------------------------------------------------------

    def begin_evaluation(self, key: object, plan: Sequence[tuple[Task, int]], variants: Sequence[str] = (),
                         spot_check: Callable[[], None] | None = None, spot_checks: int = 0,
                         steps: int = 1) -> None:
        """Enter evaluation (the harness's call, with its key): ``tasks`` are the test tasks
        with their payloads (methods get them without); ``spot_check`` runs before about
        ``spot_checks`` of the evaluation's decisions, chosen at random (``secrets``), so a
        method cannot tell when its state is looked at. ``steps``: the decisions planned for
        its tasks, one episode each; :meth:`spot_rate` scales them by the episodes a task
        actually takes."""
        self._phases.authorise(key, "start the evaluation")
        self._phases.advance(EVALUATE, key=key)
        self._gate.open_evaluation(list({task.task_id: task for task, _ in plan}.values()))
        self._plan = {(task.task_id, int(seed)) for task, seed in plan}
        self._variants = frozenset(variants)
        self._spot_check = spot_check
        self._spot_checks, self._spot_steps = (spot_checks, max(1, steps)) if spot_check else (0, 1)

    def begin_task(self, key: object, task: Task, seed: int) -> None:
        """A task of the evaluation plan begins on this thread (the harness's call): the episodes
        played on it until its result is recorded are its own (a method's helper episodes too)."""
        self._phases.authorise(key, "count a task of the evaluation")
        self._local.planned = (task.task_id, int(seed))
        self._pace.task_begun()

    def spot_rate(self) -> float:
        """The chance that the next decision of an evaluation episode is checked: about
        ``spot_checks`` over the evaluation, spread over the steps its tasks take where each
        task takes as many episodes as the method plays for one (Evolving-RL plays three); so a
        method's helper episodes neither multiply the checks (and their cost) nor, beyond
        :data:`MAX_EPISODES_PER_TASK` per task, dilute them. Never zero while checks are on: no
        stretch of an evaluation goes unchecked."""
        if not self._spot_checks:
            return 0.0
        per_task = min(self._pace.episodes_per_task(), MAX_EPISODES_PER_TASK)
        return min(1.0, self._spot_checks / (self._spot_steps * per_task))

    # -- what is credited: episodes the harness played, or that replay exactly ---------------

    @staticmethod
    def _seal_of(trajectory: Trajectory) -> str:
        played = [trajectory.task.task_id, trajectory.initial_observation, trajectory.status.value,
                  [[s.action, s.observation, s.valid] for s in trajectory.steps]]
        return hashlib.sha256(json.dumps(played).encode()).hexdigest()

    def _seal(self, trajectory: Trajectory, variant: str | None = None) -> None:
        """Remember that the harness played ``trajectory``, and for which variant (by default
        that of the play this thread is in)."""
        variant = variant or getattr(self._local, "variant", None) or PRIMARY
        seal = self._seal_of(trajectory)
        with self._lock:
            self._sealed.add(seal)
            self._sealed_as.setdefault(seal, set()).add(variant)

    def _verified(self, trajectory: Trajectory, task: Task, seed: int | None = None,
                  variant: str = PRIMARY) -> Trajectory:
        """``trajectory`` if the harness played it, or if a fresh episode of the (deterministic)
        environment reproduces every observation and the outcome; else an error episode, and
        the run is marked invalid. A task's result must be played for it: a helper episode
        (another variant of the test task) passes only as a declared copy (``copy_of``) of the
        one helper episode of that task and seed, never as a pick among several."""
        seal = self._seal_of(trajectory)
        with self._lock:
            played_as = sorted(self._sealed_as.get(seal, ()))
            key = (task.task_id, seed)
            helpers = max(len(self._helpers.get(key, ())), self._helper_episodes.get(key, 0))
        if variant == PRIMARY and played_as and PRIMARY not in played_as \
                and not (trajectory.copy_of in played_as and helpers == 1):
            self._violations.record(
                f"Method '{self._method}' returned its episode of variant {played_as[0]!r} (one of "
                f"{helpers} helper episodes of {trajectory.task.task_id}) as the task's result; a "
                "result is the episode played for it, or a declared copy of a task's only helper.")
            return Trajectory(task=trajectory.task, initial_observation=trajectory.initial_observation,
                              status=Termination.ERROR, experience_ids=list(trajectory.experience_ids),
                              error=f"a helper episode ({played_as[0]}) returned as the result")
        with self._lock:
            if seal in self._sealed:
                return trajectory
        problem = self._replay_problem(trajectory, task)
        if problem is None:
            self._seal(trajectory)
            return trajectory
        self._violations.record(
            f"Method '{self._method}' returned an episode of {task.task_id} that the environment "
            f"does not reproduce ({problem}); it is not credited.")
        return Trajectory(task=task, initial_observation=trajectory.initial_observation,
                          status=Termination.ERROR, experience_ids=list(trajectory.experience_ids),
                          error=f"not reproduced by the environment: {problem}")

    def _replay_problem(self, trajectory: Trajectory, task: Task) -> str | None:
        """What in ``trajectory`` a fresh episode of the harness's ``task`` contradicts (None:
        it replays exactly)."""
        if trajectory.status is Termination.ERROR:
            return None  # an error is credited as a failure whatever its steps
        if len(trajectory.steps) > self.max_steps():
            return f"{len(trajectory.steps)} steps, over the limit of {self.max_steps()}"
        episode = self._env.open(task)
        try:
            observation = episode.reset()
            if observation.text != trajectory.initial_observation:
                return "its first observation differs"
            for number, step in enumerate(trajectory.steps, start=1):
                if observation.won or observation.done:
                    return f"step {number} comes after the game ended"
                valid = step.action in observation.admissible_actions
                observation = episode.step(step.action)
                if observation.text != step.observation or valid != step.valid:
                    return f"step {number} ({step.action!r}) is answered differently"
        finally:
            episode.close()
        if trajectory.success != observation.won:
            return "it claims success but the game was not won" if trajectory.success else \
                "it claims no success but the game was won"
        return None

    def _derived_experiences(self, task: Task, experiences: list[Experience]) -> list[str]:
        """At evaluation every experience shown must be in the frozen store, or be made at test
        time from non-test tasks (e.g. a skill card from a train episode): those are returned,
        to be recorded as derived; anything else is a violation."""
        stored: set[str] = set()
        if experiences and self._services.has_store():
            found = self._services.store.get([e.experience_id for e in experiences])
            stored = {e.experience_id for e in found}
        derived = []
        for experience in experiences:
            if experience.experience_id in stored:
                continue
            sources = experience.provenance
            if (sources.source_split in (*TEST_SPLITS, "unknown") or not sources.source_task_ids
                    or any(self._gate.is_test_task(tid) for tid in sources.source_task_ids)):
                self._violations.record(
                    f"Method '{self._method}' showed experience {experience.experience_id} on "
                    f"{task.task_id}: it is not in the frozen store, and its provenance "
                    f"({sources.source_split}: {', '.join(sources.source_task_ids) or 'no tasks'}) "
                    "does not show it was made from non-test tasks.")
            derived.append(experience.experience_id)
        return derived
