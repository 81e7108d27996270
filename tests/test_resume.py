"""A run killed mid-evaluation and resumed equals an uninterrupted run (greedy decoding)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The tiny random model makes this a real model run, sequential so decoding is deterministic.
OVERRIDES = [
    "llm.model=tiny",
    "embedder.name=hashing",
    "env.n_train=40",
    "env.n_valid=8",
    "env.n_test=8",
    "eval.limit=4",
    "eval.max_steps=8",
    "eval.concurrency=1",
    "run.seeds=[0,1]",
]


def arena(*args: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "arena.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def episodes(path: Path) -> list[dict]:
    lines = (path / "episodes.jsonl").read_text().splitlines() if (path / "episodes.jsonl").exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def outcome(path: Path) -> list[tuple]:
    return sorted((e["split"], e["task_id"], e["seed"], e["success"], e["steps"], e["status"], e["tokens_in"])
                  for e in episodes(path))


def full_and_killed(tmp_path: Path, after: int) -> tuple[Path, Path]:
    """A whole run, and the same run killed (SIGKILL) once ``after`` episodes are recorded."""
    full = tmp_path / "full"
    process = arena("run", "--method", "base", "--out", str(full), *OVERRIDES)
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output

    killed = tmp_path / "killed"
    process = arena("run", "--method", "base", "--out", str(killed), *OVERRIDES)
    deadline = time.time() + 300
    while len(episodes(killed)) < after and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "results.json").exists()
    return full, killed


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_results(tmp_path):
    full, killed = full_and_killed(tmp_path, after=5)
    done_before = len(episodes(killed))
    assert 5 <= done_before < 16

    process = arena("run", "--resume", str(killed))
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    assert outcome(killed) == outcome(full)  # nothing redone, nothing lost, same decisions
    assert len(episodes(killed)) == 16
    first = json.loads((full / "results.json").read_text())
    second = json.loads((killed / "results.json").read_text())
    for split in ("test_seen", "test_unseen"):
        a, b = first["splits"][split], second["splits"][split]
        assert (a["n_episodes"], a["success_rate"], a["mean_steps"]) == (b["n_episodes"], b["success_rate"], b["mean_steps"])
    assert second["valid"] is True


@pytest.mark.slow
def test_two_resumes_at_once_one_refused_the_directory_as_if_uninterrupted(tmp_path):
    """Two `arena run --resume DIR` at once: the second is refused while the first holds the run's
    lock; the first finishes it, with the same episodes as a run never interrupted."""
    from arena.core.storage.rundir import running_pid

    full, killed = full_and_killed(tmp_path, after=3)
    first = arena("run", "--resume", str(killed))
    deadline = time.time() + 300
    while running_pid(killed) != first.pid and time.time() < deadline and first.poll() is None:
        time.sleep(0.02)
    assert running_pid(killed) == first.pid, "the first resume never took the lock"
    second = arena("run", "--resume", str(killed))
    refused, _ = second.communicate(timeout=300)
    assert second.returncode != 0 and f"PID {first.pid}" in refused and "Traceback" not in refused
    output, _ = first.communicate(timeout=600)
    assert first.returncode == 0, output
    assert outcome(killed) == outcome(full)
    assert len(episodes(killed)) == len(episodes(full))  # none twice, none lost
    assert json.loads((killed / "results.json").read_text())["valid"] is True
