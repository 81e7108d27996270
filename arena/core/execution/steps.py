"""Learning steps: the default experience loop, and each step (``extract``, ``update``, the
episode's record) committed exactly once (``arena.core.storage.journal``)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from arena.core.contract.errors import BudgetExhausted
from arena.core.contract.settings import Settings
from arena.core.contract.types import EpisodeResult, Trajectory
from arena.core.execution.budget import Budget
from arena.core.execution.episodes import EpisodeRunner, checked_experiences
from arena.core.execution.views import TaskGate
from arena.core.services.run_services import Services
from arena.core.storage.journal import StepJournal, crash_point
from arena.core.storage.ledger import STATE as HARNESS_STATE
from arena.core.storage.ledger import PhaseCost
from arena.core.storage.method_state import FOLDER, STATE, MethodState
from arena.core.storage.rundir import RunDir

if TYPE_CHECKING:
    import pluggy

    from arena.core.contract.run_api import Run
    from arena.core.services.store import ExperienceStore

#: The files a step may change besides the store, as the journal names them.
METHOD_STATE_FILE = f"{FOLDER}/{STATE}"


class StepWindow:
    """The journal of the step in progress: the store's writes inside it are journaled first."""

    def __init__(self, run_dir: RunDir) -> None:
        self.journal = StepJournal(run_dir.path)
        self.open = False

    def before_store_write(self, store: ExperienceStore, ids: list[str]) -> None:
        """The store's ``before_write``: inside a step, the rows about to change go to the
        journal first (outside one, e.g. a method's own bulk load, nothing is kept)."""
        if self.open:
            self.journal.undo(store.rows_of(ids))
            crash_point("step.undo_logged")


class LearningSteps:
    """The learning loop's steps, each whole or not at all."""

    def __init__(self, run: Run, *, settings: Settings, run_dir: RunDir, runner: EpisodeRunner,
                 gate: TaskGate, budget: Budget, method_state: MethodState, window: StepWindow,
                 hooks: pluggy.HookRelay, method: str) -> None:
        self._run = run
        self._settings = settings
        self._run_dir = run_dir
        self._runner = runner
        self._gate = gate
        self._budget = budget
        self._method_state = method_state
        self._hooks = hooks
        self._method = method
        self._window = window
        self._journal = window.journal

    def experience_loop(self) -> None:
        """The default learning phase: passes over the learn split in a seeded order until a
        budget ends. A method with its own ``learn`` may call it and add steps around it.

        Each episode: ``retrieve -> solve -> extract -> update``, recorded (and so passed to
        ``episode_end``) only after ``update``, so that a resumed run neither repeats nor loses
        an update. With no episode budget it makes one pass over the split.
        """
        split, seed = self._settings.learn.split, self._settings.learn.seed
        tasks = self._gate.tasks(split)
        if not tasks:
            return
        episodes = self._budget.limits.get("episodes")
        passes = 1 if episodes is None else -(-int(episodes) // len(tasks))
        for number in range(passes):
            order = list(tasks)
            random.Random(seed * 7919 + number).shuffle(order)
            variant = f"pass{number}"
            for task in order:
                if self._budget.exhausted():
                    return
                if self._runner.finished(task, seed, variant):
                    continue
                experiences = checked_experiences("retrieve", self._method,
                                                  self._hooks.retrieve(run=self._run, task=task))
                try:
                    trajectory = self._runner.play(task, experiences, seed=seed, variant=variant,
                                                   record=False)
                except BudgetExhausted:
                    return
                self.commit(trajectory, seed=seed, variant=variant)

    def commit(self, trajectory: Trajectory, *, seed: int, variant: str = "default") -> EpisodeResult:
        """``extract``, ``update`` and the episode's record of one step, exactly once: killed
        anywhere inside, a resumed run puts the store, state.json and the method's state back
        as they were and does the step again from the same episode."""
        crash_point("step.played")
        key = (self._run.phase, trajectory.task.split, trajectory.task.task_id, seed, variant)
        self._journal.begin(key, trajectory, {HARNESS_STATE: self._run_dir.ledger.snapshot(),
                                              METHOD_STATE_FILE: self._method_state.text()})
        crash_point("step.begun")
        self._window.open = True
        try:
            new = checked_experiences("extract", self._method,
                                      self._hooks.extract(run=self._run, trajectories=[trajectory]))
            crash_point("step.extracted")
            self._hooks.update(run=self._run, trajectories=[trajectory], experiences=new)
            crash_point("step.updated")
        finally:
            self._window.open = False
        result = self._runner.record(trajectory, seed=seed, variant=variant)
        crash_point("step.recorded")
        self._journal.clear()
        return result

    def recover(self, services: Services) -> None:
        """On resume, before the method is built: undo a step that was killed inside its window
        (its store writes, its files' changes) and keep its episode to do the step again; a
        step killed after its record only leaves its journal to drop."""
        pending = self._journal.pending()
        if pending is None:
            return
        if self._run_dir.finished(pending.key) is None:
            if pending.undo:
                raw = services.raw_store()
                for rows in reversed(pending.undo):
                    raw.restore_rows(rows)
            # The state put back, and the episode's own calls, made by the killed session whose
            # counters died with it, counted once over the cost on record (its extract's,
            # unrecorded, are lost).
            phase = str(pending.key[0])
            ledger = self._run_dir.ledger
            on_record = ledger.phase_cost(phase, self._run_dir.episodes())
            played = pending.trajectory
            ledger.undo_step(pending.files.get(HARNESS_STATE), phase, on_record.plus(PhaseCost(
                llm_calls=played.llm_calls, tokens_in=played.tokens_in, tokens_out=played.tokens_out)))
            self._method_state.restore_text(pending.files.get(METHOD_STATE_FILE))
            self._runner.resume_with(pending.key, pending.trajectory)
        self._journal.clear()
