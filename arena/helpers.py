"""Helpers the built-in plugins share, public through :mod:`arena.api` (a plugin calls
``arena.plugin_files``, never this module): what several methods or environments would otherwise
each write again, none of it the harness's (the core neither calls nor knows them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from fractions import Fraction
from pathlib import Path
from typing import Any, TypedDict

from arena.core import rl
from arena.core.contract.errors import BudgetExhausted
from arena.core.contract.hookspecs import hookimpl
from arena.core.contract.run_api import STANDARD, EpisodeRequest, Run
from arena.core.contract.types import Experience, Task, Trajectory


class PluginFiles(TypedDict):
    """What :func:`plugin_files` finds, as the keyword arguments of ``register``."""

    config: Path
    presets: dict[str, Path]


def plugin_files(module_file: str | Path, *, exclude: str | None = None) -> PluginFiles:
    """``config=`` and ``presets=`` for a registration hook's ``register``: the ``config.yaml``
    beside ``module_file`` (a plugin passes its ``__file__``) and each ``presets/NAME.yaml``
    there as preset ``NAME``, in name order (none if there is no such folder).

    Every plugin folder has this layout, so the paths are found once, here, rather than spelled
    in each hook. ``exclude`` is a glob of preset names left out (those another registration of
    the same plugin uses).
    """
    folder = Path(module_file).parent
    presets = {path.stem: path for path in sorted((folder / "presets").glob("*.yaml"))
               if exclude is None or not fnmatchcase(path.stem, exclude)}
    return PluginFiles(config=folder / "config.yaml", presets=presets)


def clip_middle(text: str, max_chars: int, *, head_share: Fraction = Fraction(1, 2)) -> str:
    """``text`` stripped, cut to at most ``max_chars`` characters (none: 0 or less) by dropping
    its middle for a ``[...]`` line: a transcript's start says the task and its end the outcome,
    which prompts of several methods need. ``head_share``: the start's share of what is kept."""
    text = text.strip()
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    marker = "\n[...]\n"
    head = math.floor((max_chars - len(marker)) * head_share)
    return text[:head].rstrip() + marker + text[-(max_chars - len(marker) - head):].lstrip()


def play_round(run: Run, tasks: list[Task], seed: int, variant: str,
               experiences: Callable[[Task], list[Experience]]) -> tuple[list[Trajectory], bool]:
    """One round of episodes (say a trial of each task) that a resumed run picks up where it
    stopped: a task whose ``(seed, variant)`` episode is recorded is read back, the others are
    played with ``experiences(task)`` while the episode budget lasts.

    Returns the trajectories in task order and whether a budget ended the round (a task the
    budget left out has none).
    """
    to_play = [task for task in tasks if run.finished(task, seed, variant) is None]
    left = run.budget.left("episodes")
    stopped = left is not None and left < len(to_play)
    if left is not None:
        to_play = to_play[:left]
    requests = [EpisodeRequest(task, experiences(task), seed, variant) for task in to_play]
    played: dict[str, Trajectory] = {}
    try:
        for request, trajectory in zip(requests, run.play(requests)):
            played[request.task.task_id] = trajectory
    except BudgetExhausted:  # another budget (env steps, tokens) ran out mid-round
        stopped = True
    trajectories = []
    for task in tasks:  # what this round played, else what an earlier session recorded
        found = played.get(task.task_id)
        if found is None and run.finished(task, seed, variant) is not None:
            found = run.recorded_trajectory(task, seed, variant)
        if found is not None:
            trajectories.append(found)
    return trajectories, stopped


def stored(run: Run, *kinds: str) -> list[Experience]:
    """Every stored experience of these kinds, kind by kind, as a method's ``export`` returns
    them; none while the run has no store (reading does not create one)."""
    if not run.store_exists():
        return []
    return [experience for kind in kinds for experience in run.store.all(kind=kind)]


def export_stored(*kinds: str) -> Callable[[Any, Run], list[Experience]]:
    """The ``export`` hook of a method whose export is its store's experiences of ``kinds``
    (:func:`stored`), declared in the class body: ``export = arena.export_stored("insight")``.
    Six built-in methods export exactly that; one hook serves them all."""

    @hookimpl
    def export(self: Any, run: Run) -> list[Experience]:
        return stored(run, *kinds)

    export.__doc__ = f"The stored experiences of kind {', '.join(kinds)} (arena.export_stored)."
    return export


def run_stages(state: dict[str, Any], stages: Sequence[tuple[str, Callable[[], object]]],
               save: Callable[[dict[str, Any]], object], *, done: str = "done") -> None:
    """A learning pipeline that a resumed run re-enters at the stage a kill interrupted: from
    ``state["stage"]`` on, each stage runs, then the next one's name (``done`` after the last)
    is recorded and ``state`` saved. At ``done``, or any name not listed, nothing runs."""
    names = [name for name, _ in stages]
    for index, (name, stage) in enumerate(stages):
        if state["stage"] == name:
            stage()
            state["stage"] = names[index + 1] if index + 1 < len(names) else done
            save(state)


def resume_training(run: Run, trainer: Callable[[], rl.CheckpointedTrainer], state: dict[str, Any],
                    key: str, unit: str, *, recovered: Callable[[int], object] | None = None) -> int:
    """Where a checkpointed RL method resumes: the updates ``state[key]`` counts, or the newest
    checkpoint's (``trainer().resume``, which also loads its weights; the trainer is built only
    if there is one). An update whose checkpoint was saved just before a kill, which ``state``
    does not count yet, is counted now (``rl.StepLedger.recover``): ``state`` saved, the
    interrupted rollouts dropped, ``recovered(done)`` called, its metrics logged.
    """
    recorded = int(state[key])
    if not recorded and not run.method_state.checkpoints().latest():
        return recorded
    done = trainer().resume(recorded, unit)
    counted = rl.StepLedger(run, state).recover(done)
    if counted is not None:  # killed between a checkpoint and the state that counts it
        state[key] = done
        run.method_state.save(state)
        run.discard_rollouts()
        if recovered is not None:
            recovered(done)
        run.log_metrics(done, counted)  # its held-out point is lost
    return done


def checkpoint_update(run: Run, trainer: rl.CheckpointedTrainer, ledger: rl.StepLedger,
                      state: dict[str, Any], key: str, done: int, metrics: dict[str, Any], *,
                      save: Callable[[dict[str, Any]], None] | None = None,
                      checkpointed: Callable[[], object] | None = None) -> None:
    """Keep an RL update as checkpoint ``done`` and charge its optimizer steps exactly once,
    whatever kills the run (``rl.StepLedger``): the pending update and ``state`` saved, the
    checkpoint, the rollouts dropped (then ``checkpointed()``, for the method's own files),
    ``state[key] = done`` counted and saved, the steps charged. ``save``: how the method saves
    ``state`` (default ``run.method_state.save``).
    """
    save = save or run.method_state.save
    ledger.pending(done, int(metrics.get("updates", 0)), metrics)
    save(state)
    trainer.save(done)
    run.discard_rollouts()
    if checkpointed is not None:
        checkpointed()
    state[key] = done
    ledger.saved()
    save(state)
    ledger.charge_owed()


@dataclass(frozen=True)
class HeldOutCurve:
    """The held-out points of an iterated method's learning curve (GiGPO, Evolving-RL): success
    on the first ``tasks`` valid tasks, decoded as evaluation decodes, before any update and
    after every ``every`` iterations and the last (none: ``every`` <= 0). Nothing is learned
    from them; the harness still flags the run as having played valid tasks."""

    tasks: int
    every: int

    def due(self, done: int, last: int) -> bool:
        """Whether a point is measured after ``done`` iterations of a phase ending at ``last``."""
        return self.every > 0 and (done % self.every == 0 or done == last)

    def success(self, run: Run, after: int) -> float:
        """The success rate after ``after`` iterations (the standard solver, evaluation's sampling)."""
        tasks = run.tasks("valid")[: self.tasks]
        requests = [EpisodeRequest(task, [], run.learn_seed, f"valid/after{after}",
                                   sampling=run.settings.eval.sampling.as_mapping(), policy=STANDARD)
                    for task in tasks]
        with run.progress(f"valid after {after} iterations", total=len(requests)) as shown:
            episodes = run.play(requests, on_done=shown.advance)
        return sum(float(t.success) for t in episodes) / len(episodes) if episodes else 0.0

    def before(self, run: Run, state: dict[str, Any], done: int, last: int) -> None:
        """The point before any update, measured once (kept in ``state``, saved, logged at 0)."""
        if done == 0 and self.due(0, last) and "valid_before" not in state:
            state["valid_before"] = self.success(run, 0)
            run.method_state.save(state)
            run.log_metrics(0, {"valid_success": state["valid_before"]})

    def after(self, run: Run, done: int, last: int, metrics: dict[str, Any]) -> None:
        """Add the point after ``done`` iterations to ``metrics`` as ``valid_success`` when due."""
        if self.due(done, last):
            metrics["valid_success"] = self.success(run, done)


def require_at_least(settings: object, minimum: int, *names: str) -> None:
    """Refuse a ``method:`` setting below ``minimum`` with its key and value (a settings class's
    ``__post_init__`` calls it, so a wrong value stops the run before anything is played)."""
    for name in names:
        if getattr(settings, name) < minimum:
            raise ValueError(f"method.{name} must be >= {minimum}, got {getattr(settings, name)}")
