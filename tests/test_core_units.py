"""Units of the core: episode loop termination, batching, statistics, run directory, config."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from arena.core.config.compose import ConfigError, compose, parse_overrides
from arena.core.contract.env import Episode
from arena.core.contract.llm import SamplingParams, sample_option
from arena.core.contract.types import EpisodeResult, Observation, Task, Termination, Trajectory
from arena.core.execution.episodes import run_in_threads
from arena.core.execution.solver import Action, play
from arena.core.host import stopping
from arena.core.services.batching import BatchingBackend
from arena.core.storage.rundir import RunDir
from arena.core.storage.stats import success_ci, wilson_interval
from arena.testing import FakeLLM, random_chat


class CountingEpisode(Episode):
    """Wins when the action 'win' is taken; 'stop' ends the game without success; 'timeout' ends
    it at the environment's own step limit."""

    def __init__(self) -> None:
        self.task = Task("t1", "toy", "train", "toy", "win the game")

    def reset(self) -> Observation:
        return Observation("start", ("look", "win", "stop"))

    def step(self, action: str) -> Observation:
        if action == "win":
            return Observation("you won", (), reward=1.0, done=True, won=True, progress=1.0)
        if action == "stop":
            return Observation("game over", (), done=True)
        if action == "timeout":
            return Observation("out of time", (), done=True, truncated=True)
        if action == "look":
            return Observation("a room", ("look", "win", "stop"), progress=0.5)
        return Observation("Nothing happens.", ("look", "win", "stop"))


def run_policy(actions, **limits):
    script = iter(actions)
    return play(CountingEpisode(), lambda obs, traj: Action(next(script), llm_calls=1, tokens_in=3),
                max_steps=limits.get("max_steps", 10), max_invalid_actions=limits.get("max_invalid", 3))


def test_episode_loop_statuses():
    won = run_policy(["look", "win"])
    assert won.status is Termination.SUCCESS and won.progress == 1.0 and won.llm_calls == 2
    assert run_policy(["stop"]).status is Termination.FAILURE
    assert run_policy(["look"] * 20, max_steps=4).status is Termination.STEP_LIMIT
    invalid = run_policy(["dance"] * 20, max_invalid=3)
    assert invalid.status is Termination.INVALID_ACTION_LIMIT
    assert invalid.n_valid_actions == 0 and len(invalid.steps) == 3
    assert run_policy(["look", "look"], max_steps=2).progress == 0.5
    # an environment that ends the game at its own step limit (ALFWorld's 50) says so: step_limit
    assert run_policy(["look", "timeout"], max_steps=10).status is Termination.STEP_LIMIT
    assert run_policy(["look", "stop"], max_steps=2).status is Termination.FAILURE


def test_a_policy_ends_its_episode_with_a_final_action():
    """``Action.final``: the action is played, then the episode ends (policy_ended), unless that
    action won or the environment ended the game."""
    def final_on(actions, last):
        script = iter(actions)
        return play(CountingEpisode(), lambda obs, traj: Action(next(script), final=len(traj.steps) == last),
                    max_steps=10, max_invalid_actions=3)

    ended = final_on(["look", "look", "look"], last=1)
    assert ended.status is Termination.POLICY_ENDED and [s.action for s in ended.steps] == ["look", "look"]
    assert final_on(["look", "win"], last=1).status is Termination.SUCCESS
    assert final_on(["look", "stop"], last=1).status is Termination.FAILURE


def test_episode_loop_records_errors():
    def broken(obs, traj):
        raise RuntimeError("model exploded")

    trajectory = play(CountingEpisode(), broken, max_steps=5, max_invalid_actions=3)
    assert trajectory.status is Termination.ERROR
    assert "model exploded" in trajectory.error


def test_sample_option_greedy_and_seeded():
    scores = [-3.0, -1.0, -1.0, -5.0]
    assert sample_option(scores, SamplingParams()) == 1  # first of the tied best
    draws = {sample_option(scores, SamplingParams(temperature=5.0, seed=s)) for s in range(50)}
    assert len(draws) > 1
    assert sample_option(scores, SamplingParams(temperature=1.0, seed=7)) == sample_option(
        scores, SamplingParams(temperature=1.0, seed=7))
    assert {sample_option(scores, SamplingParams(temperature=1.0, top_p=0.01, seed=s)) for s in range(20)} == {1}
    with pytest.raises(ValueError, match="No options"):
        sample_option([], SamplingParams())


class CountingFake(FakeLLM):
    def __init__(self):
        super().__init__()
        self.batches: list[int] = []

    def choose(self, prompts, options, params):
        self.batches.append(len(prompts))
        return super().choose(prompts, options, params)


def test_batching_merges_concurrent_calls_and_keeps_answers():
    import random

    inner = CountingFake()
    batched = BatchingBackend(inner, max_batch=4, max_wait_s=0.5)
    rng = random.Random(0)
    prompts = [random_chat(rng) for _ in range(8)]
    options = [["go to cabinet 1", "open fridge 1", "look", f"take mug {i} from desk 1"] for i in range(8)]
    expected = FakeLLM().choose(prompts, options, SamplingParams())
    results = [None] * 8
    all_active = threading.Barrier(8)

    def worker(i):
        batched.enter()
        all_active.wait()  # eight episodes in flight, as in an evaluation
        try:
            (results[i],) = batched.choose([prompts[i]], [options[i]], SamplingParams(seed=i))
        finally:
            batched.leave()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.text for r in results] == [e.text for e in expected]
    assert sum(inner.batches) == 8 and max(inner.batches) > 1 and len(inner.batches) < 8
    assert inner.usage.llm_calls == 8


def test_wilson_interval_known_values():
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)


def _result(task_id, success, seed=0):
    return EpisodeResult("evaluate", "frozen", task_id, "test_seen", "x", seed, success, 0.0, 0.0,
                         1, 1, "success" if success else "failure", 0, 0, 0, 0.0, [])


def test_ci_treats_tasks_not_seeds_as_the_sample():
    one_seed = [_result(f"t{i}", i < 5) for i in range(10)]
    three_seeds = [_result(f"t{i}", i < 5, seed) for i in range(10) for seed in range(3)]
    assert success_ci(one_seed) == success_ci(three_seeds)


def test_rundir_resume_cuts_torn_lines_and_orphans(tmp_path):
    run_dir = RunDir(tmp_path)
    task = Task("t1", "toy", "test_seen", "x", "goal")
    for i in range(3):
        trajectory = Trajectory(task=Task(f"t{i}", "toy", "test_seen", "x", "goal"), initial_observation="o")
        run_dir.record(_result(f"t{i}", True), trajectory)
    with (tmp_path / "trajectories.jsonl").open("a") as handle:  # killed between the two writes
        handle.write(json.dumps({"key": ["evaluate", "test_seen", "t9", 0, "default"],
                                 **Trajectory(task=task, initial_observation="o").to_dict()}) + "\n")
    with (tmp_path / "episodes.jsonl").open("a") as handle:  # killed mid-line
        handle.write('{"phase": "evaluate", "task_')
    reopened = RunDir(tmp_path)
    records = reopened.load_episodes()
    assert [r.task_id for r in records] == ["t0", "t1", "t2"]
    assert (tmp_path / "episodes.jsonl").read_text().endswith("\n")
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 3
    with pytest.raises(Exception, match="recorded twice"):
        reopened.record(_result("t0", True), Trajectory(task=task, initial_observation="o"))


def test_config_precedence_and_errors(plugins, tmp_path):
    cfg = compose(plugins, "base", overrides=["eval.max_steps=7", "run.seeds=[1,2]"])
    assert cfg.eval.max_steps == 7 and list(cfg.run.seeds) == [1, 2]
    assert cfg.method.name == "base" and cfg.env.name == "household"
    assert cfg.llm.backend == "transformers" and "model" in cfg.llm
    assert cfg.env.n_train >= 1000
    file = tmp_path / "c.yaml"
    file.write_text("eval:\n  max_steps: 9\nsolver:\n  history: 1\n")
    cfg = compose(plugins, "base", config_file=file, overrides=["eval.max_steps=11"])
    assert cfg.eval.max_steps == 11 and cfg.solver.history == 1
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["eval.max_steps"])
    with pytest.raises(ConfigError, match="not found"):
        compose(plugins, "base", config_file=tmp_path / "missing.yaml")


def test_an_interrupt_stops_running_episodes_at_their_next_step():
    """Ctrl-C reaches the main thread only; running episodes must not play on to their end.

    Three workers play endless episodes; one of them sends SIGINT to the main thread at its 5th
    step. The interrupt must come out of ``run_in_threads`` with every started episode stopped a
    few steps later and the items never started left unplayed.
    """
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    steps = [0] * 6

    def endless(item: int) -> Trajectory:
        def policy(observation, trajectory):
            steps[item] += 1
            if item == 0 and steps[item] == 5:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(0.002)
            return Action("look")
        return play(CountingEpisode(), policy, max_steps=2_000, max_invalid_actions=3)

    # Python's own Ctrl-C handler, whatever the suite was started with (a job started in the
    # background of a script inherits SIGINT ignored, and then no interrupt would come).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_in_threads(endless, list(range(6)), workers=3, llm=FakeLLM())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert steps[3:] == [0, 0, 0]
    assert steps[0] >= 5 and max(steps[:3]) < 200, steps


def test_a_stopping_episode_unwinds_instead_of_ending_as_an_error():
    flag = threading.Event()
    flag.set()
    with stopping.sharing(flag), pytest.raises(stopping.Stopping):
        run_policy(["look"] * 5)
    assert stopping.current_flag() is None
    assert run_policy(["look", "win"]).status is Termination.SUCCESS
