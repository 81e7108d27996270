"""The evaluation phase: every planned (task, seed) played once, the learned state frozen and
checked, the record compared with the plan."""

from __future__ import annotations

from collections.abc import Sequence

import pluggy

from arena.core.contract.env import TEST_SPLITS, Environment
from arena.core.contract.errors import HookReturnError
from arena.core.contract.llm import LLMBackend
from arena.core.contract.results import PRIMARY_VARIANT
from arena.core.contract.settings import Settings
from arena.core.contract.types import Experience, Task, Termination, Trajectory
from arena.core.execution.context import RunContext
from arena.core.execution.episodes import checked_experiences, run_in_threads
from arena.core.execution.phase import EVALUATE
from arena.core.execution.tasks import select_tasks
from arena.core.execution.views import public_task
from arena.core.protocol.clock import PhaseClock
from arena.core.protocol.digests import StateDigests
from arena.core.protocol.factors import Factor
from arena.core.services.progress import Reporter, phase_ending
from arena.core.storage.ledger import RunState
from arena.core.storage.rundir import RunDir

#: Random moments of a frozen evaluation at which the harness re-hashes store and weights.
SPOT_CHECKS = 8


def evaluation_plan(env: Environment, settings: Settings) -> list[tuple[Task, int]]:
    """Every (task, seed) of the evaluation, in a fixed order: no random draws."""
    seeds, splits = settings.run.seeds, settings.eval.splits
    for name, values in (("run.seeds", seeds), ("eval.splits", splits)):
        if len(set(values)) != len(values):
            raise ValueError(f"{name} lists a value twice ({values}); each must appear once.")
    plan: list[tuple[Task, int]] = []
    for split in splits:
        if split not in TEST_SPLITS:
            raise ValueError(
                f"eval.splits may only name test splits {list(TEST_SPLITS)}, got '{split}'."
            )
        tasks = select_tasks(env.tasks(split), settings.eval.limit)
        plan.extend((task, seed) for seed in seeds for task in tasks)
    return plan


class Evaluation:
    """Plays the plan's episodes (frozen: concurrently, the method's state fixed; online: one at
    a time, ``update`` after each) and records what the state and the record show."""

    def __init__(self, ctx: RunContext, env: Environment, llm: LLMBackend, hook: pluggy.HookRelay,
                 run_dir: RunDir, digests: StateDigests, clock: PhaseClock, reporter: Reporter,
                 key: object, factors: Sequence[Factor], resumed: bool) -> None:
        self._ctx, self._env, self._llm, self._hook = ctx, env, llm, hook
        self._settings = ctx.settings
        self._run_dir, self._digests, self._clock, self._reporter = run_dir, digests, clock, reporter
        self._key, self._factors, self._resumed = key, factors, resumed
        self._method = self._settings.method.name

    def run(self) -> None:
        ctx = self._ctx
        plan = evaluation_plan(self._env, self._settings)
        frozen = ctx.track == "frozen"
        state = self._freeze() if frozen else self._run_dir.ledger.read()
        ctx.episodes.begin_evaluation(self._key, plan, self._declared_variants(),
                                      spot_check=self._digests.spot_check if frozen else None,
                                      spot_checks=SPOT_CHECKS,
                                      steps=len(plan) * ctx.eval_max_steps() // 2)
        todo = [(task, seed) for task, seed in plan if ctx.finished(task, seed) is None]
        self._clock.start(EVALUATE)
        self._reporter.phase(EVALUATE, len(plan), len(plan) - len(todo))
        with phase_ending(self._reporter, EVALUATE):
            if frozen:
                run_in_threads(lambda item: self._frozen_episode(*item), todo,
                               workers=self._settings.eval.concurrency, llm=self._llm)
            else:
                for task, seed in todo:
                    self._online_episode(task, seed)
        cost = self._clock.now(EVALUATE)
        digest_after = self._digests.state()
        if frozen and digest_after != state.digest_before_eval:
            ctx.violation(
                "The method's state changed during frozen evaluation "
                f"({str(state.digest_before_eval)[:12]} -> {digest_after[:12]}): it learned from "
                "test episodes."
            )
        if frozen:
            self._check_shown_experiences()
        self._check_run_files()
        self._check_plan(plan)
        self._run_dir.ledger.evaluation_done(digest=digest_after, cost=cost)

    def _freeze(self) -> RunState:
        """The state a frozen evaluation must keep: the learned one (checked again on resume),
        with the experiment's factors applied; its digests are the random checks' reference."""
        state = self._run_dir.ledger.read()
        factors = [factor for factor in self._factors if factor.applies(state)]
        for factor in factors:
            factor.recover(state)
        if self._resumed and not any(factor.verifies_learned_state for factor in factors):
            digest_now = self._digests.state()
            if state.digest_before_eval != digest_now:
                self._ctx.violation(
                    "The method's state on resume differs from the state learning ended with "
                    f"({str(state.digest_before_eval)[:12]} -> {digest_now[:12]}): the method must "
                    "restore its learned state when constructed (e.g. load its checkpoint)."
                )
        for factor in factors:
            state = factor.apply(state)
        self._digests.freeze()
        return state

    def _declared_variants(self) -> list[str]:
        """The helper variants the method declares before the evaluation plays anything
        (``evaluation_variants``): names, none of them the result's."""
        declared = self._hook.evaluation_variants(run=self._ctx.method_run)
        if declared is None:
            return []
        if not isinstance(declared, (list, tuple)) or not all(isinstance(v, str) and v for v in declared) \
                or PRIMARY_VARIANT in declared:
            raise HookReturnError(f"evaluation_variants of method '{self._method}' returned {declared!r}; "
                                  f"expected a list of variant names (strings other than {PRIMARY_VARIANT!r}).")
        return sorted(set(declared))

    def _retrieve(self, task: Task, seed: int) -> list[Experience] | Trajectory:
        """The method's experiences for ``task`` (as methods see it), or an error trajectory if
        retrieval failed. Under ``eval.experience`` the harness decides whose experience it is:
        another task's (a decoy of another type), or none."""
        try:
            source = self._ctx.experience_control.task_for(task, seed)
            if source is None:
                return []
            return checked_experiences("retrieve", self._method,
                                       self._hook.retrieve(run=self._ctx.method_run, task=source))
        except Exception as exc:
            return Trajectory(task=task, initial_observation="", status=Termination.ERROR,
                              error=f"retrieve failed: {type(exc).__name__}: {exc}")

    def _begin(self, task: Task, seed: int) -> tuple[Task, list[Experience] | None]:
        """The task as the method sees it and its experiences; None where retrieval failed (the
        failure is recorded as the episode)."""
        self._ctx.episodes.begin_task(self._key, task, seed)
        self._reporter.plan_task_start(EVALUATE)
        task = public_task(task)
        experiences = self._retrieve(task, seed)
        if isinstance(experiences, Trajectory):
            self._ctx.episodes.record(experiences, seed=seed)
            return task, None
        return task, experiences

    def _frozen_episode(self, task: Task, seed: int) -> None:
        task, experiences = self._begin(task, seed)
        if experiences is not None:
            self._ctx.episodes.play(task, experiences, seed=seed)

    def _online_episode(self, task: Task, seed: int) -> None:
        task, experiences = self._begin(task, seed)
        if experiences is not None:
            trajectory = self._ctx.episodes.play(task, experiences, seed=seed, record=False)
            self._ctx.steps.commit(trajectory, seed=seed)

    def _check_shown_experiences(self) -> None:
        """Every experience id recorded at evaluation is in the frozen store (or was derived at
        test time from non-test tasks): memory written during evaluation and deleted before the
        end digest is caught here."""
        shown: set[str] = set()
        for record in self._run_dir.episodes():
            if record.phase == EVALUATE:
                shown.update(set(record.experience_ids) - set(record.derived_experience_ids))
        if not shown:
            return
        found = ({e.experience_id for e in self._ctx.store.get(sorted(shown))}
                 if self._ctx.store_exists() else set())
        missing = sorted(shown - found)
        if missing:
            self._ctx.violation(f"{len(missing)} experience ids recorded at evaluation are not in the "
                                f"frozen store (e.g. {missing[0]}): they were written during "
                                "evaluation and removed, or never stored.")

    def _check_plan(self, plan: list[tuple[Task, int]]) -> None:
        """Every planned (task, seed) has exactly one result on record, and nothing unplanned
        has one: what the board counts is what the harness set out to play."""
        planned = {(task.task_id, seed) for task, seed in plan}
        on_record: dict[tuple[str, int], int] = {}
        for record in self._run_dir.episodes():
            if record.phase == EVALUATE and record.variant == PRIMARY_VARIANT:
                on_record[(record.task_id, record.seed)] = on_record.get((record.task_id, record.seed), 0) + 1
        missing = sorted(planned - set(on_record))
        doubled = sorted(key for key, count in on_record.items() if count > 1)
        unplanned = sorted(set(on_record) - planned)
        for what, keys in (("has no result on record", missing), ("has more than one result", doubled),
                           ("was not planned but has a result", unplanned)):
            if keys:
                self._ctx.violation(f"{len(keys)} evaluation task(s) {what} (e.g. {keys[0][0]} seed "
                                    f"{keys[0][1]}): the record is not the harness's plan.")

    def _check_run_files(self) -> None:
        """config.yaml as the run started, and the store still on disk where there was one."""
        if self._run_dir.config_changed():
            self._ctx.violation("config.yaml was changed while the run ran: its results would not "
                                "describe the config they came from.")
        frozen = self._digests.frozen
        if frozen and frozen["store"] != "empty" and not (self._run_dir.path / "store").is_dir():
            self._ctx.violation("The run's store/ folder was deleted during evaluation.")

