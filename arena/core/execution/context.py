"""RunContext: what a method sees of its run, assembled from parts that each have one job.

- :class:`~arena.core.execution.phase.PhaseGuard` (``run.phases``): the phase and track, advanced only by
  the harness (which holds the key it was made with);
- :class:`~arena.core.execution.views.TaskGate` and ``run.env``: the tasks and episodes the phase opens;
- :class:`~arena.core.services.run_services.Services` (``run.services``): the LLM, auxiliary LLMs, embedder,
  store (frozen at evaluation) and progress display;
- :class:`~arena.core.execution.budget.Budget` (``run.budget``): learning budgets, persisted by the harness;
- :class:`~arena.core.execution.episodes.EpisodeRunner` (``run.episodes``): plays, verifies and records
  episodes; its ``play`` takes a policy;
- :class:`~arena.core.execution.steps.LearningSteps` (``run.steps``): the default experience loop and
  exactly-once steps;
- :class:`~arena.core.storage.method_state.MethodState` (``run.method_state``): the method's own state
  file and folder;
- :class:`~arena.core.storage.metrics.MetricsLog` (``run.log_metrics``): the run's curves, ``metrics.jsonl``.

The context is built complete and then closed: nothing is set on it from outside (the
harness's session passes the hook relay and the episode callback to the constructor), and a
method that tries to set ``run.phase`` is refused on record. The methods below are the plugin
API; each forwards to the part that owns it. Methods are typed against
:class:`~arena.core.contract.run_api.Run`, the part of it they may call (checked below by mypy).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from omegaconf import DictConfig

from arena.core.contract.env import Environment
from arena.core.contract.errors import BudgetExhausted, HookReturnError, NotTrainable, ProtocolViolation
from arena.core.contract.llm import LLMBackend, TrainableBackend
from arena.core.contract.run_api import STANDARD, EpisodeRequest, PolicyChoice, Run
from arena.core.contract.settings import Sampling, Settings
from arena.core.contract.types import EpisodeResult, Experience, Policy, Task, Trajectory
from arena.core.execution.budget import BUDGET_KEYS, Budget
from arena.core.execution.episodes import EpisodeRunner, checked_experiences, run_in_threads
from arena.core.execution.experience_controls import ExperienceControl
from arena.core.execution.method_run import MethodRun
from arena.core.execution.phase import EVALUATE, LEARN, PhaseGuard, ViolationLog
from arena.core.execution.steps import LearningSteps, StepWindow
from arena.core.execution.views import EnvironmentView, TaskGate
from arena.core.services.progress import ProgressTask, Reporter
from arena.core.services.run_services import GuardedStore, Services
from arena.core.storage.ledger import PhaseCost
from arena.core.storage.method_state import MethodState
from arena.core.storage.metrics import MetricsLog
from arena.core.storage.rundir import RunDir

if TYPE_CHECKING:
    import pluggy

    from arena.core.rl.checkpointed import CheckpointedTrainer
    from arena.core.services.embedder import Embedder
    from arena.core.services.store import ExperienceStore
    from arena.core.storage.trackers import Tracker

__all__ = [
    "BUDGET_KEYS", "EVALUATE", "LEARN", "STANDARD", "Budget", "BudgetExhausted", "EpisodeRequest",
    "HookReturnError", "NotTrainable", "ProtocolViolation", "RunContext", "checked_experiences",
    "run_in_threads",
]

#: What to write instead of an assignment older plugins made (Arena 0.1 -> 0.2).
_MIGRATION = {
    "keep_rollouts": "call run.keep_rollouts() once, in the method's constructor",
    "hook": "the harness passes the hook relay when it builds the run",
    "on_episode": "implement the episode_end hook",
}


class RunContext:
    """One run as its method sees it (see the module docstring for its parts)."""

    _built = False

    def __init__(
        self,
        cfg: DictConfig,
        run_dir: RunDir,
        env: Environment,
        llm: LLMBackend,
        *,
        hooks: pluggy.HookRelay,
        key: object,
        make_embedder: Callable[[], Embedder],
        make_store: Callable[[Embedder, Callable[[ExperienceStore, list[str]], None]], ExperienceStore],
        make_backend: Callable[[Mapping[str, Any]], LLMBackend] | None = None,
        on_episode: Callable[[EpisodeResult], None] = lambda result: None,
        phase_cost: Callable[[str], PhaseCost] | None = None,
        reporter: Reporter | None = None,
        trackers: Sequence[Tracker] = (),
        settings: Settings | None = None,
    ) -> None:
        self.cfg = cfg
        #: The harness's sections of ``cfg``, typed (the session's, built once when it was prepared).
        self.settings = settings if settings is not None else Settings.of(cfg)
        self.method_name: str = self.settings.method.name
        self._run_dir = run_dir  # the harness's: methods keep their state in run.method_state
        self.hook = hooks
        # From the signed record, not state.json's list (a resumed run: RunDir.violations_on_record).
        recorded, unrecorded = run_dir.violations_on_record()
        self.violations_log = ViolationLog(self.method_name, recorded,
                                           persist=run_dir.record_violation, unrecorded=unrecorded)
        self.phases = PhaseGuard(self.settings.run.track, key=key, violations=self.violations_log)
        self.method_state = MethodState(run_dir.path)
        self.metrics = MetricsLog(run_dir.path, trackers)
        self.gate = TaskGate(env, self.phases, self.violations_log, self.settings.eval.source_pool)
        self.env = EnvironmentView(env, self.gate, self.phases, self.violations_log)
        self.experience_control = ExperienceControl(
            self.settings.eval.experience, self.gate.tasks)
        window = StepWindow(run_dir)
        self.services = Services(
            llm, store_path=run_dir.path / "store", make_embedder=make_embedder,
            make_store=make_store, before_store_write=window.before_store_write,
            frozen=self.phases.is_frozen, make_backend=make_backend, reporter=reporter)
        self.budget = Budget(
            self.settings.learn.budget.limits(),
            tokens_now=self.services.tokens,
            persist=lambda counters: run_dir.ledger.gradient_steps(counters["gradient_steps"]))
        #: What every method hook is handed as ``run`` (in one process; a worker gets the same names).
        self.method_run = MethodRun(self)
        self.episodes = EpisodeRunner(
            self.method_run, settings=self.settings, run_dir=run_dir, env=env, phases=self.phases, gate=self.gate,
            violations=self.violations_log, budget=self.budget, services=self.services,
            hooks=hooks, on_episode=on_episode, phase_cost=phase_cost)
        self.steps = LearningSteps(
            self.method_run, settings=self.settings, run_dir=run_dir, runner=self.episodes, gate=self.gate,
            budget=self.budget, method_state=self.method_state, window=window, hooks=hooks,
            method=self.method_name)
        self._built = True

    def __setattr__(self, name: str, value: Any) -> None:
        if not self._built:
            object.__setattr__(self, name, value)
            return
        if name in ("phase", "track"):
            owner = "the harness advances the phase" if name == "phase" else \
                "the track is the user's (run.track in the config)"
            raise self.violations_log.refusal(
                f"Method '{self.method_name}' tried to set run.{name} to {value!r}; {owner}.")
        hint = _MIGRATION.get(name, "keep your own state on the method object or in "
                                    "run.method_state")
        raise AttributeError(f"The run context is built complete; nothing is set on it from "
                             f"outside (run.{name} = ...): {hint}.")

    # -- phase and track ---------------------------------------------------------------------

    @property
    def phase(self) -> str:
        return self.phases.phase

    @property
    def track(self) -> str:
        return self.phases.track

    def is_learning(self) -> bool:
        return self.phases.is_learning()

    def is_frozen(self) -> bool:
        return self.phases.is_frozen()

    @property
    def run_dir(self) -> RunDir:
        raise AttributeError("run.run_dir is the harness's since Arena 0.2: keep the method's state "
                             "in run.method_state (load, save, folder) and use "
                             "run.recorded_trajectory / run.discard_rollouts for episodes.")

    @property
    def learn_seed(self) -> int:
        """The learning phase's seed (``learn.seed``), typed: a method's own shuffles and sampling
        derive from it (the evaluation's seeds are the harness's, ``run.seeds``)."""
        return self.settings.learn.seed

    @property
    def learn_split(self) -> str:
        """The split the learning phase draws tasks from (``learn.split``: train or valid)."""
        return self.settings.learn.split

    @property
    def concurrency(self) -> int:
        """Episodes the harness plays side by side (``eval.concurrency``): a method's own
        parallel episodes should use as many."""
        return self.settings.eval.concurrency

    @property
    def env_name(self) -> str:
        """The registered name of the run's environment (``env.name``)."""
        return self.settings.env.name

    def learning_finished(self) -> bool:
        """Whether this run's learning phase is over (a method resumed for evaluation serves
        its learned state from its constructor)."""
        return self._run_dir.ledger.read().learn_done

    def violation(self, message: str) -> None:
        """Record a protocol violation (kept at once, so a resume keeps it too)."""
        self.violations_log.record(message)

    @property
    def splits_used_for_learning(self) -> set[str]:
        return self.gate.used_for_learning

    # -- services ----------------------------------------------------------------------------

    @property
    def llm(self) -> LLMBackend:
        return self.services.llm

    @property
    def embedder(self) -> Embedder:
        return self.services.embedder

    @property
    def store(self) -> GuardedStore:
        return self.services.store

    def has_store(self) -> bool:
        return self.services.has_store()

    def store_exists(self) -> bool:
        """Whether the run has a store (opened now, or left on disk by an earlier session)."""
        return self.services.store_exists()

    def progress(self, label: str, total: int | None = None) -> ProgressTask:
        """Show a long step of the method while it lasts (a bar on a terminal, timestamped lines
        in a log): ``with run.progress("skill extraction", total=8) as bar: ... bar.advance()``."""
        return self.services.progress(label, total)

    def auxiliary_llm(self, settings: Mapping[str, Any]) -> LLMBackend:
        """Another backend (a teacher): counted in the run's costs and budget, closed at the end."""
        return self.services.auxiliary_llm(settings)

    def trainable_backend(self, hint: str = "") -> TrainableBackend:
        """The served model, for in-process training (:class:`NotTrainable` names the fix)."""
        return self.services.trainable(hint)

    def fine_tune(self, rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any],
                  hint: str = "") -> dict[str, float]:
        """A supervised fine-tune of the served model on ``rows`` (prompt/completion dicts;
        ``settings``: the method's SFT section), made by the harness (:meth:`Services.fine_tune`)
        so an isolated method fine-tunes the model the harness serves; its metrics. Kept and
        restored by the harness on resume. Refused, on record, in a frozen evaluation."""
        if self.is_frozen():
            raise self.violations_log.refusal(
                f"Method '{self.method_name}' asked for run.fine_tune during a frozen evaluation; the "
                "served model changes only while learning.")
        return self.services.fine_tune(rows, settings, seed=self.learn_seed, label=f"{self.method_name}: SFT steps",
                                       hint=hint)

    def trainer(self, settings: Mapping[str, Any], hint: str = "") -> CheckpointedTrainer:
        """The run's checkpointed policy trainer on the served model (``settings``: the
        trainer's section of the method's config), kept by the harness
        (:meth:`Services.policy_trainer`), so a method isolated in a worker process trains the
        model the harness serves."""
        return self.services.policy_trainer(settings, self.method_state.checkpoints(), seed=self.learn_seed,
                                            hint=hint)

    # -- tasks -------------------------------------------------------------------------------

    def tasks(self, split: str) -> list[Task]:
        """Tasks of a split. While learning only train (and valid, which is recorded) are open."""
        return self.gate.tasks(split)

    def experience_task(self, task: Task) -> Task | None:
        """The task whose experience to bring to ``task``: itself, except at an evaluation under
        ``eval.experience`` (``arena experiment relevance``): a test task of another type, or
        None (bring nothing). For methods that retrieve inside ``solve``."""
        if self.phase != EVALUATE:
            return task
        return self.experience_control.task_for(task, self.current_seed())

    def source_pool(self) -> list[Task]:
        """The train tasks a method may consult at test time (``TaskGate.source_pool``)."""
        return self.gate.source_pool()

    # -- episodes ----------------------------------------------------------------------------

    def sampling(self) -> Sampling:
        return self.episodes.sampling()

    def max_steps(self) -> int:
        return self.episodes.max_steps()

    def eval_max_steps(self) -> int:
        return self.episodes.eval_max_steps()

    def finished(self, task: Task, seed: int, variant: str = "default") -> EpisodeResult | None:
        return self.episodes.finished(task, seed, variant)

    def recorded_trajectory(self, task: Task, seed: int, variant: str = "default") -> Trajectory | None:
        return self.episodes.recorded_trajectory(task, seed, variant)

    @overload
    def play(self, request: EpisodeRequest, *, on_done: Callable[[], object] | None = None) -> Trajectory: ...
    @overload
    def play(self, request: Sequence[EpisodeRequest], *,
             on_done: Callable[[], object] | None = None) -> list[Trajectory]: ...
    def play(self, request: EpisodeRequest | Sequence[EpisodeRequest], *legacy_args: Any,
             on_done: Callable[[], object] | None = None, **legacy: Any) -> Trajectory | list[Trajectory]:
        """Play one request, or many side by side (results in their order, ``on_done()`` after
        each): the method's ``solve``, the standard solver or a policy of the method's; inside a
        ``solve``, the episode it is solving (:class:`EpisodeRequest`). At evaluation every
        episode a method plays is recorded (and counted on the board): ``record=False`` is for
        learning. The 0.2 form ``run.play(task, experiences, seed=..., ...)`` still works, with
        a ``DeprecationWarning``."""
        if isinstance(request, Task):
            request = self._legacy_request("run.play(task, ...)", request, *legacy_args, **legacy)
        elif legacy or legacy_args:
            raise TypeError(f"run.play takes an EpisodeRequest (or a list of them) and on_done, not "
                            f"{', '.join(sorted(legacy)) or 'more arguments'}: put them on the request.")
        requests = [request] if isinstance(request, EpisodeRequest) else list(request)
        for one in requests:
            if not one.record and not self.phases.is_learning():
                raise self.violations_log.refusal(
                    f"Method '{self.method_name}' played {one.task.task_id} with record=False at "
                    "evaluation; every evaluation episode is recorded (drop record=False).")
        if isinstance(request, EpisodeRequest):
            trajectory = self.episodes.play_request(request)
            if on_done is not None:
                on_done()
            return trajectory
        return self.episodes.play_many(requests, on_done=on_done)

    # -- the ways to play before one run.play(request): kept for plugins written for Arena 0.2 --

    def _legacy_request(self, form: str, task: Task, experiences: list[Experience] | None = None, *,
                        seed: int | None = None, variant: str = "default", record: bool = True,
                        policy: PolicyChoice = None, max_steps: int | None = None,
                        sampling: Mapping[str, float] | None = None, standard: bool = False) -> EpisodeRequest:
        warnings.warn(f"{form} is run.play(EpisodeRequest(...)) since Arena 0.3 (docs/plugin_hooks.md)",
                      DeprecationWarning, stacklevel=3)
        return EpisodeRequest(task, list(experiences or []), seed, variant, sampling,
                              STANDARD if standard else policy, max_steps, record)

    def play_many(self, requests: Sequence[EpisodeRequest], *, policy: PolicyChoice = None,
                  on_done: Callable[[], object] | None = None, standard: bool = False) -> list[Trajectory]:
        warnings.warn("run.play_many(requests) is run.play(requests) since Arena 0.3", DeprecationWarning,
                      stacklevel=2)
        chosen = STANDARD if standard else policy
        return self.play([dataclasses.replace(r, policy=r.policy if r.policy is not None else chosen)
                          for r in requests], on_done=on_done)

    def standard_solve(self, task: Task, experiences: list[Experience], seed: int,
                       max_steps: int | None = None,
                       sampling: Mapping[str, float] | None = None) -> Trajectory:
        return self.play(self._legacy_request("run.standard_solve", task, experiences, seed=seed,
                                              policy=STANDARD, max_steps=max_steps, sampling=sampling))

    def play_policy(self, task: Task, policy: Policy, experiences: list[Experience],
                    max_steps: int | None = None) -> Trajectory:
        return self.play(self._legacy_request("run.play_policy", task, experiences,
                                              policy=policy, max_steps=max_steps))

    def record(self, trajectory: Trajectory, *, seed: int, variant: str = "default") -> EpisodeResult:
        """Record a learning episode played with ``record=False`` (after ``update``). At
        evaluation only the harness records: every episode a method plays there is recorded by
        ``run.play`` itself, and a task's result is what the harness plays or verifies."""
        if not self.phases.is_learning():
            raise self.violations_log.refusal(
                f"Method '{self.method_name}' called run.record at evaluation (task "
                f"{trajectory.task.task_id}, variant {variant!r}); only the harness records evaluation "
                "episodes: play them with run.play, which records them.")
        return self.episodes.record(trajectory, seed=seed, variant=variant)

    def current_seed(self) -> int:
        return self.episodes.current_seed()

    def standard_policy(self, task: Task, experiences: list[Experience], seed: int,
                        sampling: Mapping[str, float] | None = None) -> Policy:
        return self.episodes.standard_policy(task, experiences, seed, sampling)

    def keep_rollouts(self) -> None:
        self.episodes.keep_rollouts()

    def discard_rollouts(self) -> None:
        self.episodes.discard_rollouts()

    # -- learning ----------------------------------------------------------------------------

    def experience_loop(self) -> None:
        self.steps.experience_loop()

    def commit_step(self, trajectory: Trajectory, *, seed: int, variant: str = "default") -> EpisodeResult:
        return self.steps.commit(trajectory, seed=seed, variant=variant)

    def charge(self, **amounts: int) -> None:
        """Add to the learning budget's use, e.g. ``run.charge(gradient_steps=1)`` (the harness
        persists it)."""
        self.budget.charge(**amounts)

    def budget_exhausted(self) -> list[str]:
        return self.budget.exhausted()

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Log the learning's figures at ``step`` (an iteration, an RL step, a learning episode)
        to ``metrics.jsonl``, which the leaderboard's learning curves read; numbers and flags."""
        self.metrics.log(self.phase, step, metrics)

    def refresh_token_usage(self) -> None:
        self.budget.refresh()


def _is_a_run(context: RunContext) -> Run:
    """Never called: mypy checks here that RunContext still offers every member of ``Run``."""
    return context
