"""What ``run.isolation=process`` costs against an in-process run (issue 40).

The same MemRL run (learning then frozen evaluation, ``eval.salt=public`` so both play the same
tasks) in Arena's process and with its hooks in a worker process, twice:

- ``fake``: the fake LLM backend, so the run is almost only harness and hook calls: the upper
  bound of the overhead (every step crosses the process boundary for the policy's call);
- ``embedded``: SmolLM2-135M serving, as in a real run.

Run: ``HF_HUB_OFFLINE=1 python -m pytest benchmarks/bench_isolation.py --benchmark-only -s``
(about 5 minutes on 2 cores; a first run warms imports and caches, then each mode runs
twice, alternated, and the faster of its two counts); figures in docs/security.md ("What isolation costs").
"""

from __future__ import annotations

import json
import os
import time

import pytest

from arena.core import protocol
from arena.core.config.plugins import Plugins

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SETTINGS = {
    "fake": ["llm.backend=fake", "embedder.name=hashing", "eval.limit=4", "learn.budget.episodes=12",
             "learn.max_steps=8", "eval.max_steps=12", "eval.salt=public"],
    "embedded": ["embedder.name=hashing", "eval.limit=1", "learn.budget.episodes=2", "learn.max_steps=6",
                 "eval.max_steps=8", "eval.salt=public", "llm.dtype=float32"],
}
FIGURES: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="module")
def plugins() -> Plugins:
    loaded = Plugins()
    loaded.load_defaults()
    return loaded


def timed_run(plugins: Plugins, out, overrides: list[str]) -> tuple[float, dict]:
    started = time.perf_counter()
    _, results = protocol.run("memrl", "household", overrides=overrides, out=out, plugins=plugins)
    return time.perf_counter() - started, results


@pytest.mark.parametrize("backend", list(SETTINGS))
def test_isolation_cost(benchmark, plugins, tmp_path, backend):
    def both() -> dict[str, float]:
        timed_run(plugins, tmp_path / f"{backend}-warm", SETTINGS[backend])  # imports, caches: not timed
        here, away, results = [], [], {}
        for attempt in range(2):  # alternated, the faster of two each
            seconds, results["here"] = timed_run(plugins, tmp_path / f"{backend}-here{attempt}", SETTINGS[backend])
            here.append(seconds)
            seconds, results["away"] = timed_run(plugins, tmp_path / f"{backend}-away{attempt}",
                                                 SETTINGS[backend] + ["run.isolation=process"])
            away.append(seconds)
        assert results["away"]["splits"] == results["here"]["splits"]  # the same play, only placed apart
        cost = results["here"]["cost"]
        steps = cost["learn"]["env_steps"] + cost["evaluate"]["env_steps"]
        return {"in_process_s": min(here), "isolated_s": min(away), "ratio": min(away) / min(here),
                "steps": steps, "overhead_ms_per_step": 1000 * (min(away) - min(here)) / steps,
                "sandbox": results["away"]["provenance"]["isolation"]["sandbox"]}

    FIGURES[backend] = benchmark.pedantic(both, rounds=1, iterations=1)
    print(f"\n{backend}: {json.dumps(FIGURES[backend], default=str)}")
