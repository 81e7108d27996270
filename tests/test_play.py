"""One way to play: ``run.play(EpisodeRequest(...))``, or a list of requests."""

from __future__ import annotations

import json

import pytest

import arena
from arena import STANDARD, EpisodeRequest
from arena.core import protocol
from tests.helpers.runs import register

EVAL = ["eval.limit=1", "learn.budget.episodes=2"]  # every learning episode is budgeted


class OwnEpisode:
    """Plays two train tasks side by side while learning, and each test task's own episode from
    its ``solve`` with the standard solver (the request carries no seed)."""

    def __init__(self, run) -> None:
        self.run = run

    @arena.hookimpl
    def learn(self, run) -> bool:
        tasks = run.tasks("train")[:2]
        advanced: list[int] = []
        played = run.play([EpisodeRequest(task, [], run.learn_seed, policy=STANDARD) for task in tasks],
                          on_done=lambda: advanced.append(1))
        run.method_state.save({"order": [t.task.task_id for t in played], "expected": [t.task_id for t in tasks],
                               "advanced": len(advanced)})
        return True

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        return run.play(EpisodeRequest(task, experiences, policy=STANDARD))


def test_requests_play_in_order_and_a_solve_plays_its_own_episode_once(plugins, fast, tmp_path) -> None:
    register(plugins, own_episode=OwnEpisode)
    path, results = protocol.run("own_episode", overrides=[*fast, *EVAL], out=tmp_path / "r", plugins=plugins)
    assert results.valid, results.violations
    learned = json.loads((path / "method" / "state.json").read_text())
    assert learned["order"] == learned["expected"] and learned["advanced"] == 2
    records = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if r["phase"] == "evaluate"]
    # Each planned test task once: the episode its solve played is its result, not an extra one.
    assert len(evaluated) == sum(s.n_episodes for s in results.splits.values()) == 2
    assert {r["variant"] for r in evaluated} == {"default"}


class Seedless:
    def __init__(self, run) -> None:
        self.run = run

    @arena.hookimpl
    def learn(self, run) -> bool:
        try:
            run.play(EpisodeRequest(run.tasks("train")[0], policy=STANDARD))
        except ValueError as exc:
            run.method_state.save({"error": str(exc)})
        return True


def test_a_new_episode_without_its_run_seed_is_refused_with_the_fix(plugins, fast, tmp_path) -> None:
    register(plugins, seedless=Seedless)
    path, _ = protocol.run("seedless", overrides=[*fast, *EVAL], out=tmp_path / "r", plugins=plugins)
    error = json.loads((path / "method" / "state.json").read_text())["error"]
    assert "has no seed" in error and "run seed" in error


class Legacy:
    """Written for Arena 0.2: play_many, play(task, ...), standard_solve and play_policy."""

    def __init__(self, run) -> None:
        self.run = run

    @arena.hookimpl
    def learn(self, run) -> bool:
        tasks = run.tasks("train")[:2]
        run.play_many([EpisodeRequest(tasks[0], [], 0)], policy=STANDARD)
        run.play(tasks[1], [], seed=0, policy="standard")
        return True

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        if task.split == "test_seen":
            return run.standard_solve(task, experiences, seed)
        return run.play_policy(task, lambda observation, trajectory: arena.Action(
            observation.admissible_actions[0]), experiences)


def test_the_ways_to_play_of_arena_0_2_still_work_in_process_with_a_warning(plugins, fast, tmp_path) -> None:
    register(plugins, legacy=Legacy)
    with pytest.warns(DeprecationWarning) as warned:
        _, results = protocol.run("legacy", overrides=[*fast, *EVAL], out=tmp_path / "r", plugins=plugins)
    assert results.valid, results.violations
    said = " ".join(str(w.message) for w in warned)
    for form in ("run.play_many", "run.play(task, ...)", "run.standard_solve", "run.play_policy"):
        assert form in said, form
    assert results.learn.used["episodes"] == 2
