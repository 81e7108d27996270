"""How fast the command line answers: each command as a whole new process, as a user types it.

Run: ``python -m pytest benchmarks/bench_cli.py --benchmark-only -q -s`` (about a minute).
Goals on 2 cores: ``arena --help``, ``arena run --help``, ``arena plugins`` and a mistyped method
name each under 2 s; a whole run on the fake backend under 5 s. Each figure is the median of
several runs (pytest-benchmark's rounds), so one slow start does not decide it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ARENA = [sys.executable, "-m", "arena.cli"]


def run(args: list[str], expect_ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([*ARENA, *args], capture_output=True, text=True, timeout=120)
    assert (done.returncode == 0) == expect_ok, done.stdout + done.stderr
    return done


@pytest.mark.parametrize(
    ("label", "args", "ok", "goal_s"),
    [
        ("arena --help", ["--help"], True, 2.0),
        ("arena run --help", ["run", "--help"], True, 2.0),
        ("arena plugins", ["plugins"], True, 2.0),
        ("arena run --method evolvng_rl", ["run", "--method", "evolvng_rl"], False, 2.0),
    ],
)
def test_command_answers_quickly(benchmark, label, args, ok, goal_s):
    done = benchmark.pedantic(run, args=(args, ok), rounds=5, iterations=1, warmup_rounds=1)
    if label.endswith("evolvng_rl"):
        assert "Did you mean 'evolving_rl'?" in done.stderr + done.stdout
    median = benchmark.stats.stats.median
    print(f"\n{label}: median {median:.2f} s (goal < {goal_s} s)")
    assert median < goal_s


def test_fake_backend_run(benchmark, tmp_path: Path):
    """The laptop loop of a plugin author: a whole default run on the fake model."""
    counter = iter(range(100))

    def fake_run() -> subprocess.CompletedProcess:
        out = tmp_path / f"run{next(counter)}"
        return run(["run", "--method", "base", "--out", str(out), "llm.backend=fake",
                    "embedder.name=hashing"])

    benchmark.pedantic(fake_run, rounds=3, iterations=1, warmup_rounds=1)
    median = benchmark.stats.stats.median
    print(f"\nfake-backend run (base, defaults): median {median:.2f} s (goal < 5 s)")
    assert median < 5.0
