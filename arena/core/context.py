"""RunContext: everything a method sees during a run, with the protocol's guards built in.

Methods reach tasks, the store, the LLM and episodes only through the context, so the harness
can enforce the protocol (no test data while learning, no writes while frozen, budgets) and count
every cost, without trusting the method.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import DictConfig

from arena.core.env import (
    POOL_SPLIT,
    TEST_SPLITS,
    TRAIN_SPLIT,
    VALID_SPLIT,
    Environment,
)
from arena.core.journal import StepJournal, crash_point
from arena.core.llm import LLMBackend
from arena.core.progress import NullReporter, ProgressTask, Reporter
from arena.core.rundir import RunDir
from arena.core.solver import Policy, StandardSolver, episode_seed, play
from arena.core.types import EpisodeResult, Experience, Task, Termination, Trajectory
from arena.core.views import EnvironmentView, public_task

if TYPE_CHECKING:
    import pluggy

    from arena.core.embedder import Embedder
    from arena.core.store import ExperienceStore

LEARN = "learn"
EVALUATE = "evaluate"


class ProtocolViolation(RuntimeError):
    """A method did something the evaluation protocol forbids (e.g. read a test split to learn)."""


class HookReturnError(ValueError):
    """A method's hook returned something of the wrong type; the message names the hook, the
    method and the type expected."""


class BudgetExhausted(RuntimeError):
    """The learning phase used up one of its budgets; the method must stop learning."""


BUDGET_KEYS = ("episodes", "env_steps", "tokens", "gradient_steps")


@dataclass
class Budget:
    """Learning-phase budgets (None = unlimited) and what has been used of them."""

    limits: dict[str, int | None]
    used: dict[str, int] = field(default_factory=lambda: {key: 0 for key in BUDGET_KEYS})

    def exhausted(self) -> list[str]:
        """Names of the budgets that are used up."""
        return [
            key
            for key, limit in self.limits.items()
            if limit is not None and self.used.get(key, 0) >= limit
        ]

    def left(self, key: str) -> int | None:
        limit = self.limits.get(key)
        return None if limit is None else max(0, limit - self.used.get(key, 0))


@dataclass
class EpisodeRequest:
    """One episode for :meth:`RunContext.play_many`."""

    task: Task
    experiences: list[Experience]
    seed: int
    variant: str = "default"
    #: Sampling of a standard-solver episode (``temperature``, ``top_p``); None: the phase's
    #: (e.g. a learning method's held-out check decoded as evaluation decodes).
    sampling: Mapping[str, float] | None = None


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
                          "arena.core.types.Experience (or None).")


T = TypeVar("T")
R = TypeVar("R")


def run_in_threads(work: Callable[[T], R], items: list[T], *, workers: int, llm: LLMBackend) -> list[R]:
    """``work`` over ``items`` in up to ``workers`` threads, each registered with a batching
    backend (``enter``/``leave``) so that their LLM calls are merged; results in item order."""
    enter = getattr(llm, "enter", lambda: None)
    leave = getattr(llm, "leave", lambda: None)

    def registered(item: T) -> R:
        enter()
        try:
            return work(item)
        finally:
            leave()

    if workers <= 1 or len(items) <= 1:
        return [registered(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="episode") as pool:
        return list(pool.map(registered, items))


class GuardedStore:
    """The run's experience store as methods see it: writable while learning, frozen otherwise.

    It is one object for the whole run, so a method that kept a reference from the learning phase
    is still refused (and the run marked invalid) when it writes during frozen evaluation.
    """

    _WRITES = ("add", "update_metadata", "delete")

    def __init__(self, store: ExperienceStore, frozen: Callable[[], bool]) -> None:
        self._store = store
        self._view = store.read_only()
        self._frozen = frozen

    @property
    def violations(self) -> list[str]:
        return [f"{v.operation} {', '.join(v.ids)}" for v in self._view.violations]

    def __getattr__(self, name: str) -> Any:
        target = self._view if self._frozen() else self._store
        return getattr(target, name)


class RunContext:
    """One run: config, environment, LLM, store, budgets, costs and the per-run hooks."""

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: RunDir,
        env: Environment,
        llm: LLMBackend,
        make_embedder: Callable[[], Embedder],
        make_store: Callable[[Embedder], ExperienceStore],
        reporter: Reporter | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self._env = env  # the harness's; methods get the guarded view below
        self.llm = llm
        self.method_name: str = cfg.method.name
        self._phase = LEARN
        self._track: str = cfg.run.track
        #: The environment as methods may see it (``arena.core.views``).
        self.env = EnvironmentView(env, self, self._refusal)
        self._test_tasks: dict[str, Task] = {}  # the evaluation's tasks, with their payloads
        self._sealed: set[str] = set()  # seals of the episodes the harness played (evaluation)
        self._spot_check: Callable[[], None] | None = None
        self._spot_rate = 0.0
        self._journal = StepJournal(run_dir.path)  # exactly-once learning steps
        self._step_open = False
        self._journaled: dict[tuple, Trajectory] = {}  # a killed step's episode, to finish it
        self.violations: list[str] = []
        self.splits_used_for_learning: set[str] = set()
        self.hook: pluggy.HookRelay | None = None  # set by the protocol once the method exists
        #: An RL method sets this so learning episodes keep their exact tokens on disk until it
        #: calls ``run.run_dir.discard_rollouts()``: a resumed iteration trains on them as played.
        self.keep_rollouts = False
        self.budget = Budget(
            limits={key: cfg.learn.budget.get(key) for key in BUDGET_KEYS},
        )
        self.learn_tokens_before = 0  # learn-phase tokens of earlier sessions (resume)
        self._learn_usage_start = 0
        self.on_episode: Callable[[EpisodeResult], None] = lambda result: None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._make_embedder = make_embedder
        self._make_store = make_store
        self._embedder: Embedder | None = None
        self._store: GuardedStore | None = None
        self.solver = StandardSolver.from_config(llm, cfg.solver)
        self._reporter: Reporter = reporter or NullReporter()

    # -- lazily built shared services -------------------------------------------------------

    @property
    def embedder(self) -> Embedder:
        with self._build_lock:  # episodes in threads may ask at once; build one
            if self._embedder is None:
                self._embedder = self._make_embedder()
            return self._embedder

    @property
    def store(self) -> GuardedStore:
        embedder = self.embedder
        with self._build_lock:
            if self._store is None:
                raw = self._make_store(embedder)
                raw.before_write = self._journal_undo
                self._store = GuardedStore(raw, self.is_frozen)
            return self._store

    def has_store(self) -> bool:
        return self._store is not None

    def progress(self, label: str, total: int | None = None) -> ProgressTask:
        """Show a long step of the method while it lasts (a bar on a terminal, timestamped lines
        in a log): ``with run.progress("skill extraction", total=8) as bar: ... bar.advance()``."""
        return ProgressTask(self._reporter, label, total)

    def violation(self, message: str) -> None:
        """Record a protocol violation: kept in state.json at once, so a resume keeps it too."""
        with self._lock:
            if message not in self.violations:
                self.violations.append(message)
            state = self.run_dir.state()
            recorded = state.get("violations", [])
            if message not in recorded:
                self.run_dir.update_state(violations=[*recorded, message])

    def _refusal(self, message: str) -> ProtocolViolation:
        """Record ``message`` as a violation; the error to raise."""
        self.violation(message)
        return ProtocolViolation(message)

    # -- phase and track: the harness's to change, read-only for methods ----------------------

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        raise self._refusal(f"Method '{self.method_name}' tried to set run.phase to {value!r}; "
                            "only the harness advances the phase.")

    @property
    def track(self) -> str:
        return self._track

    @track.setter
    def track(self, value: str) -> None:
        raise self._refusal(f"Method '{self.method_name}' tried to set run.track to {value!r}; "
                            "the track is the user's (run.track in the config).")

    def is_learning(self) -> bool:
        return self._phase == LEARN

    def is_frozen(self) -> bool:
        return self._phase == EVALUATE and self._track == "frozen"

    # -- task access, guarded by phase -------------------------------------------------------

    def tasks(self, split: str) -> list[Task]:
        """Tasks of a split. While learning only train (and valid, which is recorded) are open."""
        if self.phase == LEARN:
            if split in (*TEST_SPLITS, POOL_SPLIT):
                kind = "the test-time source pool" if split == POOL_SPLIT else f"test split '{split}'"
                message = (
                    f"Method '{self.method_name}' asked for {kind} while learning; "
                    f"learn from '{TRAIN_SPLIT}' (or '{VALID_SPLIT}', recorded as such)."
                )
                self.violation(message)
                raise ProtocolViolation(message)
            self.splits_used_for_learning.add(split)
        tasks = self._env.tasks(split)
        return [public_task(t) for t in tasks] if split in TEST_SPLITS else tasks

    def source_pool(self) -> list[Task]:
        """The train tasks a method may consult at test time (to retrieve a source game, say).

        The train split; at evaluation with ``eval.source_pool: all_types`` also the
        environment's pool of train-like tasks of the types train holds out. While learning it is
        the train split alone: the pool is for test time, never for learning.
        """
        train = self.tasks(TRAIN_SPLIT)
        if self.phase == LEARN or str(self.cfg.eval.get("source_pool", "train")) == "train":
            return train
        return train + self._env.pool_tasks()

    # -- episodes -----------------------------------------------------------------------------

    def sampling(self) -> DictConfig:
        return self.cfg.learn.sampling if self.phase == LEARN else self.cfg.eval.sampling

    def finished(self, task: Task, seed: int, variant: str = "default") -> EpisodeResult | None:
        """The recorded result of this episode if an earlier session finished it (resume)."""
        return self.run_dir.finished((self.phase, task.split, task.task_id, seed, variant))

    def play(
        self,
        task: Task,
        experiences: list[Experience] | None = None,
        *,
        seed: int,
        variant: str = "default",
        record: bool = True,
        standard: bool = False,
        max_steps: int | None = None,
        sampling: Mapping[str, float] | None = None,
    ) -> Trajectory:
        """Play one episode through the method's ``solve`` hook and (by default) record it.

        Learning episodes are charged to the learn budget; a call with the budget used up raises
        :class:`BudgetExhausted`. Pass ``record=False`` to record later with :meth:`record`
        (e.g. after ``update``, so a killed run never loses an update of a recorded episode).
        ``standard=True`` plays with the harness's standard solver instead of the ``solve`` hook
        (for a method's own ``solve`` that plays helper episodes); only then may ``max_steps``
        set a helper episode's own step limit, and ``sampling`` its decoding.
        """
        if (max_steps is not None or sampling is not None) and not standard:
            raise ValueError("max_steps and sampling apply to standard=True (helper) episodes only")
        if self.phase == LEARN:
            if task.split in (*TEST_SPLITS, POOL_SPLIT):
                kind = "source-pool" if task.split == POOL_SPLIT else "test"
                message = f"Method '{self.method_name}' played {kind} task {task.task_id} while learning."
                self.violation(message)
                raise ProtocolViolation(message)
            exhausted = self.budget_exhausted()
            if exhausted:
                raise BudgetExhausted(f"Learning budget used up: {', '.join(exhausted)}")
        experiences = list(experiences or [])
        assert self.hook is not None, "the protocol sets run.hook before any episode"
        journaled = self._journaled.pop((self.phase, task.split, task.task_id, seed, variant), None)
        if journaled is not None:  # a step killed after its episode: finish it with that episode
            self._seal(journaled)
            return journaled
        if record and self.finished(task, seed, variant) is not None:
            # Recorded by an interrupted session (e.g. a helper episode of a method's own
            # solve): give back what was played instead of playing it again.
            key = (self.phase, task.split, task.task_id, seed, variant)
            stored = self.run_dir.load_trajectory(key)
            if stored is not None:
                if self.keep_rollouts and self.phase == LEARN:
                    self.run_dir.attach_rollouts(key, stored)
                self._seal(stored)  # played and recorded (the record's chain was checked)
                return stored
        started = time.perf_counter()
        previous_seed = getattr(self._local, "seed", None)
        self._local.seed = seed
        try:
            episode_seed_ = episode_seed(seed, task.task_id, variant)
            if standard:
                trajectory = self.standard_solve(task, experiences, episode_seed_, max_steps=max_steps,
                                                 sampling=sampling)
            else:
                trajectory = self.hook.solve(
                    run=self, task=task, experiences=experiences, seed=episode_seed_
                )
        except Exception as exc:  # a method bug ends this episode as an error, not the run
            trajectory = Trajectory(task=task, initial_observation="", status=Termination.ERROR)
            trajectory.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._local.seed = previous_seed
        if not isinstance(trajectory, Trajectory):
            message = (f"solve of method '{self.method_name}' returned {type(trajectory).__name__}; "
                       "expected a Trajectory (or None, for the standard solver)")
            trajectory = Trajectory(task=task, initial_observation="", status=Termination.ERROR,
                                    error=message)
        elif trajectory.task.task_id != task.task_id:
            trajectory = Trajectory(task=task, initial_observation="", status=Termination.ERROR,
                                    error="solve returned no trajectory of this task")
        elif task.split in TEST_SPLITS and not self.is_learning():
            trajectory = self._verified(trajectory)
        trajectory.wall_s = max(trajectory.wall_s, time.perf_counter() - started)
        if record:
            self.record(trajectory, seed=seed, variant=variant)
        return trajectory

    def current_seed(self) -> int:
        """The run seed of the episode being played on this thread (``solve`` receives a derived
        per-episode seed; helper episodes a method plays inside ``solve`` take this one)."""
        seed = getattr(self._local, "seed", None)
        if seed is None:
            raise RuntimeError("current_seed() is only defined while an episode is being played")
        return int(seed)

    def play_many(self, requests: Sequence[EpisodeRequest], *, standard: bool = False,
                  on_done: Callable[[], object] | None = None) -> list[Trajectory]:
        """Play and record many episodes side by side (``eval.concurrency`` threads, their LLM
        calls batched); results come back in request order. ``on_done()`` after each episode
        (a progress bar's ``advance``)."""

        def play_one(request: EpisodeRequest) -> Trajectory:
            trajectory = self.play(request.task, request.experiences, seed=request.seed,
                                   variant=request.variant, standard=standard,
                                   sampling=request.sampling)
            if on_done is not None:
                on_done()
            return trajectory

        return run_in_threads(play_one, list(requests), workers=int(self.cfg.eval.concurrency),
                              llm=self.llm)

    def record(self, trajectory: Trajectory, *, seed: int, variant: str = "default") -> EpisodeResult:
        """Write a finished episode to the run directory and charge it to the phase."""
        track = LEARN if self.phase == LEARN else self.track
        result = EpisodeResult.from_trajectory(
            trajectory, phase=self.phase, track=track, seed=seed, variant=variant
        )
        if self.keep_rollouts and self.phase == LEARN:
            self.run_dir.save_rollouts(result.key, trajectory)
        self.run_dir.record(result, trajectory)
        if self.phase == LEARN:
            self.charge(episodes=1, env_steps=result.steps)
        self.on_episode(result)
        if self.hook is not None:
            try:
                self.hook.episode_end(run=self, result=result, trajectory=trajectory)
            except Exception as exc:  # an observer's bug must not end the run; it is on record
                self.violation(f"episode_end raised {type(exc).__name__}: {exc}")
        return result

    def experience_loop(self) -> None:
        """The default learning phase: passes over the learn split in a seeded order until a
        budget ends. A method with its own ``learn`` may call it and add steps around it.

        Each episode: ``retrieve -> solve -> extract -> update``, recorded (and so passed to
        ``episode_end``) only after ``update``, so that a resumed run neither repeats nor loses
        an update. With no episode budget it makes one pass over the split.
        """
        assert self.hook is not None, "the protocol sets run.hook before learning"
        split = str(self.cfg.learn.split)
        seed = int(self.cfg.learn.seed)
        tasks = self.tasks(split)
        if not tasks:
            return
        episodes = self.budget.limits.get("episodes")
        passes = 1 if episodes is None else -(-int(episodes) // len(tasks))
        for number in range(passes):
            order = list(tasks)
            random.Random(seed * 7919 + number).shuffle(order)
            variant = f"pass{number}"
            for task in order:
                if self.budget_exhausted():
                    return
                if self.finished(task, seed, variant):
                    continue
                experiences = checked_experiences("retrieve", self.method_name,
                                                  self.hook.retrieve(run=self, task=task))
                try:
                    trajectory = self.play(task, experiences, seed=seed, variant=variant, record=False)
                except BudgetExhausted:
                    return
                self.commit_step(trajectory, seed=seed, variant=variant)

    def commit_step(self, trajectory: Trajectory, *, seed: int, variant: str = "default") -> EpisodeResult:
        """``extract``, ``update`` and the episode's record of one step, exactly once
        (``arena.core.journal``): killed anywhere inside, a resumed run puts the store and
        state.json back as they were and does the step again from the same episode."""
        assert self.hook is not None, "the protocol sets run.hook before any step"
        crash_point("step.played")
        key = (self.phase, trajectory.task.split, trajectory.task.task_id, seed, variant)
        self._journal.begin(key, trajectory, self.run_dir.state_text())
        crash_point("step.begun")
        self._step_open = True
        try:
            new = checked_experiences("extract", self.method_name,
                                      self.hook.extract(run=self, trajectories=[trajectory]))
            crash_point("step.extracted")
            self.hook.update(run=self, trajectories=[trajectory], experiences=new)
            crash_point("step.updated")
        finally:
            self._step_open = False
        result = self.record(trajectory, seed=seed, variant=variant)
        crash_point("step.recorded")
        self._journal.clear()
        return result

    def _journal_undo(self, store: ExperienceStore, ids: list[str]) -> None:
        """The store's ``before_write``: inside a step, the rows about to change go to the
        journal first (outside one, e.g. a method's own bulk load, nothing is kept)."""
        if self._step_open:
            self._journal.undo(store.rows_of(ids))
            crash_point("step.undo_logged")

    def recover_step(self) -> None:
        """On resume, before the method is built: undo a step that was killed inside its window
        (its store writes, its state.json changes) and keep its episode to do the step again; a
        step killed after its record only leaves its journal to drop."""
        pending = self._journal.pending()
        if pending is None:
            return
        if self.run_dir.finished(pending.key) is None:
            if pending.undo:
                raw = self.store._store  # the harness's own handle, frozen or not
                for rows in reversed(pending.undo):
                    raw.restore_rows(rows)
            if pending.state_text is not None:
                self.run_dir.restore_state_text(pending.state_text)
            # The episode's own calls were made by the killed session, whose counters died
            # with it: count them here, once (its extract's, unrecorded, are lost).
            phase_cost = f"cost_{pending.key[0]}"
            cost = dict(self.run_dir.state().get(phase_cost, {}))
            for name in ("llm_calls", "tokens_in", "tokens_out"):
                cost[name] = int(cost.get(name, 0)) + int(getattr(pending.trajectory, name))
            self.run_dir.update_state(**{phase_cost: cost})
            self._journaled[pending.key] = pending.trajectory
        self._journal.clear()

    def start_learning(self, tokens_before: int = 0) -> None:
        """Enter the learning phase; token usage is measured from here (plus earlier sessions)."""
        self._phase = LEARN
        self.learn_tokens_before = tokens_before
        self._learn_usage_start = self.llm.usage.tokens_in + self.llm.usage.tokens_out

    def start_evaluation(self, tasks: Sequence[Task], spot_check: Callable[[], None] | None = None,
                         spot_checks: int = 0, steps: int = 1) -> None:
        """Enter evaluation (the harness's call): ``tasks`` are the test tasks with their
        payloads (methods get them without); ``spot_check`` runs before about ``spot_checks``
        of the evaluation's ``steps`` decisions, chosen at random, so a method cannot tell when
        its state is looked at."""
        self._phase = EVALUATE
        self._test_tasks = {task.task_id: task for task in tasks}
        self._spot_check = spot_check
        self._spot_rate = min(1.0, spot_checks / max(1, steps)) if spot_check else 0.0

    def _full_task(self, task: Task) -> Task:
        """The harness's own copy of a test task (a method's copy has no payload)."""
        return self._test_tasks.get(task.task_id, task) if task.split in TEST_SPLITS else task

    # -- what is credited: episodes the harness played, or that replay exactly ---------------

    @staticmethod
    def _seal_of(trajectory: Trajectory) -> str:
        played = [trajectory.task.task_id, trajectory.initial_observation, trajectory.status.value,
                  [[s.action, s.observation, s.valid] for s in trajectory.steps]]
        return hashlib.sha256(json.dumps(played).encode()).hexdigest()

    def _seal(self, trajectory: Trajectory) -> None:
        with self._lock:
            self._sealed.add(self._seal_of(trajectory))

    def _verified(self, trajectory: Trajectory) -> Trajectory:
        """``trajectory`` if the harness played it, or if a fresh episode of the (deterministic)
        environment reproduces every observation and the outcome; else an error episode, and
        the run is marked invalid."""
        seal = self._seal_of(trajectory)
        with self._lock:
            if seal in self._sealed:
                return trajectory
        problem = self._replay_problem(trajectory)
        if problem is None:
            self._seal(trajectory)
            return trajectory
        task = trajectory.task
        self.violation(f"Method '{self.method_name}' returned an episode of {task.task_id} that the "
                       f"environment does not reproduce ({problem}); it is not credited.")
        return Trajectory(task=task, initial_observation=trajectory.initial_observation,
                          status=Termination.ERROR, experience_ids=list(trajectory.experience_ids),
                          error=f"not reproduced by the environment: {problem}")

    def _replay_problem(self, trajectory: Trajectory) -> str | None:
        """What in ``trajectory`` a fresh episode contradicts (None: it replays exactly)."""
        if trajectory.status is Termination.ERROR:
            return None  # an error is credited as a failure whatever its steps
        if len(trajectory.steps) > self.max_steps():
            return f"{len(trajectory.steps)} steps, over the limit of {self.max_steps()}"
        episode = self._env.open(self._full_task(trajectory.task))
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

    def refresh_token_usage(self) -> None:
        """Every LLM token of the learning phase counts, extraction included, not only episodes."""
        now = self.llm.usage.tokens_in + self.llm.usage.tokens_out
        self.budget.used["tokens"] = self.learn_tokens_before + now - self._learn_usage_start

    def budget_exhausted(self) -> list[str]:
        self.refresh_token_usage()
        return self.budget.exhausted()

    def charge(self, **amounts: int) -> None:
        """Add to the learning budget's usage, e.g. ``run.charge(gradient_steps=1)``."""
        with self._lock:
            for key, amount in amounts.items():
                if key not in BUDGET_KEYS:
                    raise ValueError(f"Unknown budget '{key}'. Budgets: {', '.join(BUDGET_KEYS)}")
                self.budget.used[key] = self.budget.used.get(key, 0) + int(amount)

    def max_steps(self) -> int:
        """Step limit of an episode in the current phase."""
        if self.phase == LEARN and self.cfg.learn.get("max_steps") is not None:
            return int(self.cfg.learn.max_steps)
        return self.eval_max_steps()

    def eval_max_steps(self) -> int:
        """``eval.max_steps``, or the environment's own limit where it is null."""
        configured = self.cfg.eval.get("max_steps")
        return int(configured) if configured is not None else int(self.env.max_steps)

    def standard_solve(self, task: Task, experiences: list[Experience], seed: int,
                       max_steps: int | None = None,
                       sampling: Mapping[str, float] | None = None) -> Trajectory:
        """The harness's standard solver, for methods that wrap rather than replace it.
        ``max_steps`` and ``sampling`` (helper episodes only) override the phase's."""
        chosen = self.sampling() if sampling is None else sampling
        policy = self.solver.policy(
            task, experiences, seed, temperature=float(chosen["temperature"]),
            top_p=float(chosen.get("top_p", 1.0)),
        )
        return self.play_policy(task, policy, experiences, max_steps=max_steps)

    def play_policy(self, task: Task, policy: Policy, experiences: list[Experience],
                    max_steps: int | None = None) -> Trajectory:
        """One episode of ``task`` driven by ``policy`` (observation + trajectory -> action) under
        the harness's step, invalid-action and error rules: for a ``solve`` hook that changes how
        the agent acts (its own prompt or decoding) rather than what it is shown."""
        if self.is_learning():
            return play(
                self._env.open(task), policy,
                max_steps=self.max_steps() if max_steps is None else int(max_steps),
                max_invalid_actions=int(self.cfg.eval.max_invalid_actions),
                experience_ids=[e.experience_id for e in experiences],
            )
        derived = self._derived_experiences(task, experiences)
        spot_check, rate = self._spot_check, self._spot_rate

        def checked(observation: Any, trajectory: Trajectory) -> Any:
            if spot_check is not None and secrets.randbelow(1_000_000) < rate * 1_000_000:
                spot_check()
            return policy(observation, trajectory)

        trajectory = play(
            self._env.open(self._full_task(task)),
            checked if spot_check is not None else policy,
            max_steps=self.max_steps() if max_steps is None else int(max_steps),
            max_invalid_actions=int(self.cfg.eval.max_invalid_actions),
            experience_ids=[e.experience_id for e in experiences],
        )
        trajectory.task = task  # the method's copy: no payload in what it gets back or in records
        trajectory.derived_experience_ids = derived
        self._seal(trajectory)
        return trajectory

    def _derived_experiences(self, task: Task, experiences: list[Experience]) -> list[str]:
        """At evaluation every experience shown must be in the frozen store, or be made at test
        time from non-test tasks (e.g. a skill card from a train episode): those are returned,
        to be recorded as derived; anything else is a violation."""
        stored: set[str] = set()
        if experiences and self.has_store():
            stored = {e.experience_id for e in self.store.get([e.experience_id for e in experiences])}
        derived = []
        for experience in experiences:
            if experience.experience_id in stored:
                continue
            sources = experience.provenance
            if (sources.source_split in (*TEST_SPLITS, "unknown") or not sources.source_task_ids
                    or any(tid in self._test_tasks for tid in sources.source_task_ids)):
                self.violation(
                    f"Method '{self.method_name}' showed experience {experience.experience_id} on "
                    f"{task.task_id}: it is not in the frozen store, and its provenance "
                    f"({sources.source_split}: {', '.join(sources.source_task_ids) or 'no tasks'}) "
                    "does not show it was made from non-test tasks.")
            derived.append(experience.experience_id)
        return derived
