"""``arena view`` on a run of 10,000 episodes: loading it, listing its episodes, opening one.

Not part of the test suite. Run::

    python -m pytest benchmarks/bench_viewer.py --benchmark-only -q -s

The run is made here: a real small run's results.json and config, and 10,000 recorded episodes of
30 household-like steps each (about 7.7 kB a trajectory, as the easy level records them), chained
and signed by the run directory as ``arena run`` writes them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from arena.core import protocol
from arena.core.contract.types import EpisodeResult, Step, Task, Termination, Trajectory
from arena.core.storage.rundir import RunDir
from arena.report.viewer import Viewer

EPISODES = 10_000
OBSERVATION = ("You arrive at cabinet 3. On the cabinet 3, you see a mug 2, a bowl 1, a dishsponge 1, "
               "and a spatula 2. ") * 2


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("viewer")
    path, _ = protocol.run("base", overrides=["llm.backend=fake", "embedder.name=hashing", "eval.limit=1",
                                              "eval.max_steps=2"], out=root / "template")
    template = json.loads((path / "results.json").read_text())
    big = RunDir(root / "big")
    big.create(RunDir(path).load_config())
    for number in range(EPISODES):
        task = Task(f"household/1.0/s0/test_seen/{number:05d}", "household", "test_seen",
                    "pick_and_place_simple", "put a mug in cabinet.")
        trajectory = Trajectory(task=task, initial_observation=OBSERVATION,
                                steps=[Step(f"go to cabinet {i}", OBSERVATION, True, logprob=-0.5) for i in range(30)],
                                status=Termination.STEP_LIMIT)
        result = EpisodeResult.from_trajectory(trajectory, phase="evaluate", track="frozen", seed=0)
        big.record(result, trajectory)
    template["record"] = {"episodes": EPISODES, "head": big.head, "key_id": big.record_key_id(),
                          "damaged_lines": [], "breaks": []}
    (big.path / "results.json").write_text(json.dumps(template))
    return big.path


def test_viewer_on_10000_episodes(benchmark, big_run: Path) -> None:
    size = (big_run / "trajectories.jsonl").stat().st_size
    clock = time.perf_counter()
    viewer = Viewer([big_run])
    loaded = time.perf_counter() - clock
    clock = time.perf_counter()
    status, _, listing = viewer.answer("/api/episodes?run=0")
    listed = time.perf_counter() - clock
    assert status == 200 and len(json.loads(listing)) == EPISODES
    status, _, body = benchmark(viewer.answer, f"/api/trajectory?run=0&episode={EPISODES - 1}")
    assert status == 200 and len(json.loads(body)["trajectory"]["steps"]) == 30
    print(f"\n{EPISODES} episodes, trajectories.jsonl {size / 1e6:.0f} MB: load (chain check + index) "
          f"{loaded:.2f} s, episode list {listed * 1000:.0f} ms ({len(listing) / 1e6:.1f} MB), "
          f"one trajectory {benchmark.stats.stats.mean * 1000:.2f} ms")
