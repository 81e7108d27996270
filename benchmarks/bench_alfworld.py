"""ALFWorld: walkthrough replays of the valid games, and the speedup of environment workers.

Not part of the test suite. Run (needs ``pip install 'arena[alfworld]'``)::

    python -m pytest benchmarks/bench_alfworld.py --benchmark-only -q -s -k speedup   # ~1 min
    python -m pytest benchmarks/bench_alfworld.py --benchmark-only -q -s -k all_valid # ~4 min on 2 cores

The games come from the data folder (``$ALFWORLD_DATA`` or the user data folder) if it is
complete, else from the archives in ``../shared/data/alfworld/``, unpacked once. Settings:
``ARENA_BENCH_WORKERS`` (default: the number of cores) and ``ARENA_BENCH_GAMES`` (games of the
speedup measurement, default 12). The speedup goal is at least 0.8 x N with N workers, against
the same episodes played in threads in one process (as the harness does without workers).
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil  # installed with accelerate, a core dependency
import pytest

from arena.core.contract.env import Environment
from arena.core.contract.types import Task
from arena.core.execution.env_workers import ProcessEnvironment
from arena.envs.alfworld import data
from arena.envs.alfworld.environment import AlfworldEnvironment, engine, missing_engine_packages
from arena.envs.alfworld.plugin import build_local, build_worker

SHARED_ARCHIVES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "alfworld"
WORKERS = int(os.environ.get("ARENA_BENCH_WORKERS", os.cpu_count() or 1))
SPEEDUP_GAMES = int(os.environ.get("ARENA_BENCH_GAMES", "12"))

pytestmark = pytest.mark.skipif(bool(missing_engine_packages()),
                                reason="alfworld not installed: pip install 'arena[alfworld]'")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    engine()  # import TextWorld outside the timings, as the workers do when they start
    root, _ = data.resolve_data_dir(None)
    if all(data.data_status(root).values()):
        return root.resolve()
    if not SHARED_ARCHIVES.is_dir():
        pytest.skip(f"no ALFWorld data in {root} and no archives in {SHARED_ARCHIVES}")
    root = tmp_path_factory.mktemp("alfworld-data")
    data.install(str(SHARED_ARCHIVES), root)
    return root


def replay(env: Environment, task: Task) -> tuple[bool, int]:
    """The game's walkthrough from a reset; (won, steps)."""
    episode = env.open(task)
    try:
        observation = episode.reset()
        steps = 0
        while not observation.done:
            observation = episode.step(episode.expert_action())
            steps += 1
        return observation.won, steps
    finally:
        episode.close()


def replay_all(env: Environment, tasks: list[Task], threads: int) -> list[tuple[bool, int]]:
    """The tasks played side by side in threads, as the harness plays a batch."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(functools.partial(replay, env), tasks))


def in_workers(data_dir: Path, workers: int) -> ProcessEnvironment:
    settings = {"data_dir": str(data_dir), "split_scheme": "type", "max_steps": 50}
    env = ProcessEnvironment(build_local(**settings), functools.partial(build_worker, **settings),
                             workers=workers, recycle_after=50)  # the config's default
    env.open(env.tasks("test_seen")[0]).close()  # start the workers outside the timing
    return env


def cpu_seconds(env: Environment) -> float:
    """CPU time used so far by the processes that play the games (this one, or the workers)."""
    if not isinstance(env, ProcessEnvironment):
        return time.process_time()
    total = 0.0
    for pid in env.worker_pids():
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def timed(env: Environment, tasks: list[Task], threads: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of replaying ``tasks``; every game must be won."""
    cpu, started = cpu_seconds(env), time.perf_counter()
    outcomes = replay_all(env, tasks, threads)
    elapsed = time.perf_counter() - started
    assert all(won for won, _ in outcomes)
    return elapsed, cpu_seconds(env) - cpu


def test_worker_speedup(benchmark, data_dir: Path) -> None:
    local = AlfworldEnvironment(data_dir)
    tasks = local.all_tasks("valid_unseen")[::11][:SPEEDUP_GAMES]
    threads = 2 * WORKERS
    load_before = os.getloadavg()[0]
    one_process, one_process_cpu = timed(local, tasks, threads)
    single = in_workers(data_dir, 1)
    try:
        one_worker, _ = timed(single, tasks, threads)
    finally:
        single.close()
    pool = in_workers(data_dir, WORKERS)
    try:
        many, many_cpu = benchmark.pedantic(timed, args=(pool, tasks, threads), rounds=1, iterations=1)
    finally:
        pool.close()
    speedup = one_process / many
    figures = {
        "games": len(tasks), "workers": WORKERS, "cores": os.cpu_count(),
        "in_process_s": round(one_process, 2), "one_worker_s": round(one_worker, 2),
        "n_workers_s": round(many, 2), "speedup_vs_one_process": round(speedup, 2),
        "speedup_vs_one_worker": round(one_worker / many, 2),
        # CPU seconds per wall second: how many cores the games really got.
        "cores_used_in_process": round(one_process_cpu / one_process, 2),
        "cores_used_n_workers": round(many_cpu / many, 2),
        "cpu_s_per_game": round(many_cpu / len(tasks), 2),
        "load_average_before": round(load_before, 2),
    }
    benchmark.extra_info.update(figures)
    print(f"\nalfworld workers: {figures}")
    cores = os.cpu_count() or 1
    if cores >= WORKERS and load_before < 0.5 * cores:
        assert speedup >= 0.8 * WORKERS, f"speedup {speedup:.2f} below 0.8 x {WORKERS}"
    else:
        print(f"machine busy (load {load_before:.1f} on {cores} cores): the 0.8 x N goal is not checked")


def test_all_valid_games_win_by_walkthrough(benchmark, data_dir: Path) -> None:
    local = AlfworldEnvironment(data_dir)
    tasks = local.all_tasks("valid_seen") + local.all_tasks("valid_unseen")
    pool = in_workers(data_dir, WORKERS)
    try:
        outcomes = benchmark.pedantic(replay_all, args=(pool, tasks, 2 * WORKERS), rounds=1, iterations=1)
    finally:
        pool.close()
    lost = [task.task_id for task, (won, _) in zip(tasks, outcomes) if not won]
    elapsed = benchmark.stats.stats.mean
    steps = sum(n for _, n in outcomes)
    benchmark.extra_info.update({"games": len(tasks), "won": len(tasks) - len(lost), "steps": steps,
                                 "workers": WORKERS, "seconds_per_game": round(elapsed / len(tasks), 3)})
    print(f"\nalfworld: {len(tasks) - len(lost)}/{len(tasks)} valid games won by walkthrough, "
          f"{steps} steps, {elapsed:.0f} s with {WORKERS} workers")
    assert not lost, f"walkthrough lost: {lost}"
