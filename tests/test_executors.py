"""Executors (arena.core.execution.executors): the Ray executor against a local Ray of 2 CPUs gives the
same observations and the same run results as the local executor; actor errors carry their
traceback, dead actors are replaced, bad settings get errors that say what to do."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from arena.core.config.registry import UnknownNameError
from arena.core.execution.env_workers import EnvWorkerError
from arena.testing import TINY_MODEL_OVERRIDES, run_method
from tests.helpers.worlds import HOUSEHOLD, ScriptedEnvironment, play_script

pytestmark = [
    pytest.mark.slow,  # starts Ray and its actors
    pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                       reason="Ray is not installed: pip install 'arena[ray]' (scripts/install.sh --dev does)"),
]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray of 2 CPUs for the module (2.5 s to start); environments use it as they
    would use a cluster's, and leave it running."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def ray_env(local, factory, **options):
    from arena.core.execution.executors import RayEnvironment

    options.setdefault("actors", 2)
    return RayEnvironment(local, factory, **options)


def comparable(run) -> dict[tuple, dict]:
    """Each recorded episode by its key, without its wall time and its phase's cost so far (which
    counts the calls of concurrent episodes in the order they ran)."""
    return {record.key: {k: v for k, v in record.to_dict().items() if k not in ("wall_s", "phase_cost")}
            for record in run.episodes()}


def test_a_run_under_ray_matches_the_local_executor(tmp_path):
    """Same seeds, greedy tiny model: the same episodes, step counts, tokens and results. The run
    starts its own local Ray of 2 CPUs (first test of the module: no Ray is running yet), fits
    its 4 actors (eval.concurrency) to the 2 CPUs, and shuts Ray down at the end."""
    import ray

    own_ray = not ray.is_initialized()
    settings = [*TINY_MODEL_OVERRIDES, "eval.limit=2", "learn.budget.episodes=2", "eval.concurrency=4"]
    local = run_method("base", settings, out=tmp_path / "local")
    with pytest.warns(UserWarning, match="room for 2 environment actors of 1 CPU each, not 4"):
        ray_run = run_method("base", [*settings, "executor.name=ray", "executor.ray.num_cpus=2"],
                             out=tmp_path / "ray")
    if own_ray:
        assert not ray.is_initialized()  # the run stopped the Ray it started
    assert comparable(ray_run) == comparable(local)
    assert len(local.episodes("evaluate")) == 4
    for split in ("test_seen", "test_unseen"):
        for field in ("success_rate", "ci95", "progress_rate", "valid_action_rate", "mean_steps"):
            assert getattr(ray_run.results.splits[split], field) == getattr(local.results.splits[split], field)
    assert ray_run.results.provenance.config["executor"]["name"] == "ray"


def test_actors_give_the_same_observations_as_in_process(local_ray):
    local = HOUSEHOLD()
    tasks = local.tasks("train")[:2] + local.tasks("test_unseen")[:2]
    expected = [play_script(local, task, seed) for seed, task in enumerate(tasks)]
    remote = ray_env(HOUSEHOLD(), HOUSEHOLD)
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:  # as the harness plays them
            threaded = list(pool.map(lambda item: play_script(remote, item[1], item[0]),
                                     enumerate(tasks)))
        pids = remote.worker_pids()
        nodes = remote.worker_nodes()
    finally:
        remote.close()
    assert threaded == expected
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert all(nodes)
    assert local_ray.is_initialized()  # a Ray the environment did not start is left running


def test_an_actor_error_carries_its_traceback_and_the_episode_survives(local_ray):
    env = ray_env(ScriptedEnvironment(), ScriptedEnvironment, actors=1)
    try:
        episode = env.open(env.tasks("train")[0])
        episode.reset()
        with pytest.raises(EnvWorkerError, match="ValueError: boom on purpose") as raised:
            episode.step("boom")
        assert "in environment worker 0" in str(raised.value) and "Traceback" in str(raised.value)
        assert episode.step("ok").text.startswith("ok #1")
        episode.close()
    finally:
        env.close()


def test_a_dead_actor_fails_its_episode_and_is_replaced(local_ray):
    env = ray_env(ScriptedEnvironment(), ScriptedEnvironment, actors=1)
    try:
        task = env.tasks("train")[0]
        doomed = env.open(task)
        doomed.reset()
        old_pid = doomed.worker_pid
        with pytest.raises(EnvWorkerError, match="died during 'step'"):
            doomed.step("exit")
        with pytest.raises(EnvWorkerError, match="not running"):
            doomed.step("ok")
        doomed.close()
        fresh = env.open(task)
        assert fresh.reset().text == f"start {task.task_id}"
        assert fresh.worker_pid != old_pid
        fresh.close()
    finally:
        env.close()


def test_a_hung_actor_times_out(local_ray):
    env = ray_env(ScriptedEnvironment(), ScriptedEnvironment, actors=1, call_timeout_s=1.0)
    try:
        episode = env.open(env.tasks("train")[0])
        episode.reset()
        with pytest.raises(EnvWorkerError, match="did not answer 'step' within 1 s.*call_timeout_s"):
            episode.step("sleep:60")
    finally:
        env.close()


def test_a_factory_that_fails_is_reported_on_open(local_ray):
    env = ray_env(ScriptedEnvironment(), functools.partial(ScriptedEnvironment, fail=True), actors=1)
    with pytest.raises(EnvWorkerError, match="failed to start: RuntimeError: cannot build on purpose"):
        env.open(env.tasks("train")[0])
    env.close()


def test_an_unknown_executor_names_the_choices(tmp_path):
    with pytest.raises(UnknownNameError, match="Unknown executor 'rey'. Did you mean 'ray'\\? "
                                               "Available: local, ray"):
        run_method("base", ["executor.name=rey"], out=tmp_path / "run")


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    from arena.core.execution.executors import RayEnvironment

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"pip install 'arena\[ray\]'"):
        RayEnvironment(HOUSEHOLD(), HOUSEHOLD, actors=1)
