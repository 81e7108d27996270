"""One Evolving-RL co-evolution iteration with the embedded model, split by phase.

Run: ``python -m pytest benchmarks/bench_evolving_rl.py --benchmark-only -s`` (a few minutes).
Prints the seconds spent on source rollouts, extraction, downstream rollouts and the update.
"""

from __future__ import annotations

import json
import os

from arena.core import protocol
from arena.core.config.plugins import Plugins

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_one_iteration_time_split(benchmark, tmp_path):
    plugins = Plugins()
    plugins.load_defaults()
    overrides = ["method.iterations=1", "eval.limit=0"]  # micro preset, learning only

    def iteration() -> dict:
        path, _ = protocol.run("evolving_rl", overrides=overrides, plugins=plugins,
                               out=tmp_path / f"run{len(list(tmp_path.iterdir()))}")
        return json.loads((path / "state.json").read_text())["evolving_rl"]["metrics"][0]

    metrics = benchmark.pedantic(iteration, rounds=1, iterations=1)
    split = {key: round(value, 1) for key, value in metrics.items() if key.startswith("time/")}
    benchmark.extra_info.update(split)
    print(f"\none iteration: {split}; usable skills {metrics['skills_usable']:.0%}, "
          f"{metrics['samples']} samples, {metrics.get('n_tokens', 0):.0f} trained tokens")
