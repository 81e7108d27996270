"""Real runs with known outcomes for the report tests: a scripted method, its plugins, its runs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import arena
from arena.core import protocol
from arena.core.config.plugins import Plugins
from arena.core.execution.solver import Action, play
from tests.helpers.overrides import FAST
from tests.helpers.runs import harness_of, oracle_episode

# -- a scripted method: known successes on the real protocol -------------------------------------


def scripted_success(task_id: str, seed: int, salt: int = 0) -> bool:
    """Deterministic, varied outcomes: about two tasks in three succeed."""
    return int(hashlib.sha256(f"{task_id}/{seed}/{salt}".encode()).hexdigest()[:8], 16) % 3 != 0


class ScriptedMethod:
    """Solves a task with the environment's expert when :func:`scripted_success` says so, else
    with the standard solver (which the fake LLM never wins with). Plays a ``without_skill``
    helper episode per test task (a paired variant like Evolving-RL's), and learns nothing but
    logs per-iteration metrics (run.log_metrics), as learning methods do."""

    def __init__(self, run: Any) -> None:
        self.run = run

    @arena.hookimpl
    def learn(self, run: Any) -> bool:
        for iteration, task in enumerate(run.tasks("train")[:4]):
            trajectory = run.play(arena.EpisodeRequest(task, [], 0))
            run.log_metrics(iteration, {"success": float(trajectory.success), "time/x_s": 0.1})
        return True

    @arena.hookimpl
    def evaluation_variants(self, run: Any) -> list[str]:
        return ["without_skill"]

    @arena.hookimpl
    def solve(self, run: Any, task: Any, experiences: Any, seed: int) -> Any:
        run_seed = run.current_seed()  # the run seed (``seed`` is the episode's sampling seed)
        if run.phase == "evaluate":
            run.play(arena.EpisodeRequest(task, [], run_seed, "without_skill", policy="standard"))
        if not scripted_success(task.task_id, run_seed, int(run.cfg.method.get("salt", 0))):
            return None  # the standard solver
        episode = oracle_episode(run, task)
        return play(episode, lambda observation, trajectory: Action(text=episode.expert_action()),
                    max_steps=harness_of(run).max_steps(), max_invalid_actions=3)


class _Module:
    __name__ = "scripted_test_plugin"

    @staticmethod
    @arena.hookimpl
    def register_methods(register: Any) -> None:
        register("scripted", ScriptedMethod, description="scripted outcomes for report tests")


def report_plugins() -> Plugins:
    loaded = Plugins()
    loaded.load_defaults()
    loaded.register_plugin(_Module(), name="scripted_test_plugin")
    return loaded


def make_run(plugins: Plugins, root: Path, name: str, method: str = "scripted",
             seeds: tuple[int, ...] = (0,), extra: tuple[str, ...] = ()) -> Path:
    # 30 steps: every expert plan fits, so the scripted rule alone decides an outcome (the
    # harness replays the expert's episodes and credits only what the limit allows)
    overrides = list(FAST) + [f"run.seeds=[{','.join(map(str, seeds))}]", "eval.max_steps=30"]
    if method == "scripted":
        overrides.append("learn.budget.episodes=4")
    path, _ = protocol.run(method, overrides=overrides + list(extra), out=root / name, plugins=plugins)
    return path
