"""Environment worker processes (arena.core.execution.env_workers), on the household world and on a
scripted environment that fails on request: same observations as in-process, errors with the
worker's traceback, dead and hung workers replaced, steps of different workers overlapping."""

from __future__ import annotations

import functools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from arena.core.execution.env_workers import EnvWorkerError, ProcessEnvironment
from arena.envs.household import HouseholdEnvironment
from tests.helpers.worlds import HOUSEHOLD, ScriptedEnvironment, play_script

pytestmark = pytest.mark.slow  # starts worker processes


@pytest.fixture
def scripted():
    env = ProcessEnvironment(ScriptedEnvironment(), ScriptedEnvironment, workers=2, call_timeout_s=20)
    yield env
    env.close()


def test_workers_give_the_same_observations_as_in_process():
    local = HOUSEHOLD()
    tasks = local.tasks("train")[:3] + local.tasks("test_unseen")[:3]
    expected = [play_script(local, task, seed) for seed, task in enumerate(tasks)]
    remote = ProcessEnvironment(HOUSEHOLD(), HOUSEHOLD, workers=2)
    try:
        sequential = [play_script(remote, task, seed) for seed, task in enumerate(tasks)]
        with ThreadPoolExecutor(max_workers=4) as pool:  # as the harness plays them
            threaded = list(pool.map(lambda item: play_script(remote, item[1], item[0]),
                                     enumerate(tasks)))
        pids = remote.worker_pids()
    finally:
        remote.close()
    assert sequential == expected
    assert threaded == expected
    assert any(o.won for seen in expected for o, _ in seen)  # the script reaches real outcomes
    assert len(set(pids)) == 2 and os.getpid() not in pids


def test_task_lists_come_from_the_local_instance_without_starting_workers():
    local = HOUSEHOLD()
    remote = ProcessEnvironment(HOUSEHOLD(), HOUSEHOLD, workers=2)
    assert remote.name == local.name and remote.version == local.version
    assert remote.split_names() == local.split_names()
    assert remote.tasks("test_seen") == local.tasks("test_seen")
    assert remote.split_hash("train") == local.split_hash("train")
    assert remote.sizes == local.sizes  # other attributes read through to the local instance
    # Methods of Environment with a default answer the local instance's own (a level, the pool),
    # not the base class's empty default.
    easy = functools.partial(HouseholdEnvironment, level="easy", n_train=8)
    wrapped = ProcessEnvironment(easy(), easy, workers=1)
    assert wrapped.protocol_fields() == {"level": "easy"}
    assert wrapped.pool_tasks() == easy().pool_tasks() and len(wrapped.pool_tasks()) == 4
    assert wrapped.split_hash("pool") == easy().split_hash("pool")
    assert not remote.started and not wrapped.started
    remote.close()
    wrapped.close()


def test_an_environment_error_carries_the_worker_traceback(scripted):
    episode = scripted.open(scripted.tasks("train")[0])
    episode.reset()
    with pytest.raises(EnvWorkerError, match="ValueError: boom on purpose") as raised:
        episode.step("boom")
    assert "in environment worker" in str(raised.value) and "Traceback" in str(raised.value)
    assert episode.step("ok").text.startswith("ok #1")  # the episode survives its error
    with pytest.raises(EnvWorkerError, match="cannot send the result of step"):
        episode.step("unpicklable")
    assert episode.step("ok").text.startswith("ok #2")
    episode.close()


def test_a_dead_worker_fails_its_episode_and_is_replaced(scripted):
    task = scripted.tasks("train")[0]
    doomed = scripted.open(task)
    doomed.reset()
    old_pid = doomed.worker_pid
    with pytest.raises(EnvWorkerError, match="died during 'step' \\(exit code 3\\)"):
        doomed.step("exit")
    with pytest.raises(EnvWorkerError, match="not running"):
        doomed.step("ok")
    doomed.close()  # closing an episode of a dead worker is harmless
    episodes = [scripted.open(task) for _ in range(2)]
    assert all(e.reset().text == f"start {task.task_id}" for e in episodes)
    pids = {e.worker_pid for e in episodes}
    assert len(pids) == 2 and old_pid not in pids
    for episode in episodes:
        episode.close()


def test_a_hung_worker_times_out_and_is_replaced():
    env = ProcessEnvironment(ScriptedEnvironment(), ScriptedEnvironment, workers=1, call_timeout_s=1.0)
    try:
        task = env.tasks("train")[0]
        episode = env.open(task)
        episode.reset()
        started = time.perf_counter()
        with pytest.raises(EnvWorkerError, match="did not answer 'step' within 1 s"):
            episode.step("sleep:60")
        assert time.perf_counter() - started < 30
        fresh = env.open(task)
        assert fresh.reset().text == f"start {task.task_id}"
        assert fresh.worker_pid != episode.worker_pid
    finally:
        env.close()


def test_a_factory_that_fails_is_reported_on_open():
    env = ProcessEnvironment(ScriptedEnvironment(), functools.partial(ScriptedEnvironment, fail=True),
                             workers=1)
    with pytest.raises(EnvWorkerError, match="failed to start: RuntimeError: cannot build on purpose"):
        env.open(env.tasks("train")[0])
    env.close()


def test_steps_in_different_workers_overlap(scripted):
    tasks = scripted.tasks("train")
    slow, fast = scripted.open(tasks[0]), scripted.open(tasks[1])
    assert slow.worker_pid != fast.worker_pid
    slow.reset()
    fast.reset()
    finished: dict[str, float] = {}
    slow_started = threading.Event()

    def run_slow() -> None:
        slow_started.set()
        slow.step("sleep:3")
        finished["slow"] = time.perf_counter()

    thread = threading.Thread(target=run_slow)
    thread.start()
    slow_started.wait()
    time.sleep(0.3)
    fast.step("ok")  # its worker is free although the other one is busy
    finished["fast"] = time.perf_counter()
    thread.join()
    assert finished["fast"] < finished["slow"]


def test_close_stops_the_workers_and_a_later_open_starts_new_ones(scripted):
    task = scripted.tasks("train")[0]
    episode = scripted.open(task)
    processes = [w.process for w in scripted._pool]
    assert all(p.is_alive() for p in processes)
    scripted.close()
    assert not any(p.is_alive() for p in processes) and not scripted.started
    episode.close()  # its worker is gone: nothing to do
    with pytest.raises(RuntimeError, match="is closed"):
        episode.step("ok")
    again = scripted.open(task)
    assert again.reset().text == f"start {task.task_id}"


def test_workers_are_recycled_after_a_number_of_episodes():
    env = ProcessEnvironment(ScriptedEnvironment(), ScriptedEnvironment, workers=1, recycle_after=2)
    try:
        task = env.tasks("train")[0]
        first, second = env.open(task), env.open(task)
        old = env._retiring[0].process
        assert first.worker_pid == second.worker_pid and env.worker_pids() == []
        third = env.open(task)  # a fresh worker, while the old one finishes its two episodes
        assert third.worker_pid != first.worker_pid
        assert second.reset().text == f"start {task.task_id}" and second.step("ok").text.startswith("ok #1")
        first.close()
        assert old.is_alive()
        second.close()
        assert not old.is_alive() and env._retiring == []
        assert third.reset().text == f"start {task.task_id}"
    finally:
        env.close()


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers must be at least 1"):
        ProcessEnvironment(ScriptedEnvironment(), ScriptedEnvironment, workers=0)
