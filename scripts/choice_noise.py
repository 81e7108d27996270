"""How much do the transformers backend's option scores depend on the numeric path?

    python scripts/choice_noise.py [--limit 6] [--threads 1]

Runs ``base`` on the household ``easy`` level (``--limit`` test_seen tasks per type, the
defaults otherwise: bfloat16 on a CPU with native bf16, prefix cache on) and records every
``choose`` call. Then it scores each recorded prompt again canonically, batch 1 and without the
prefix cache, in bfloat16 and in float32, and prints, per pair of paths, how far the options'
summed log-probs lie apart, how far the gap between the top two options moves, and how often the
greedy pick differs. Last, the number of calls whose top-two gap is below each threshold: a
greedy pick can flip between paths only where that gap is within the noise, and rescoring those
calls on a canonical path is what pinning greedy choices would cost. docs/numerics.md gives the
figures measured with it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
from omegaconf import OmegaConf

from arena.core import protocol
from arena.core.config.plugins import Plugins
from arena.core.contract.llm import SamplingParams
from arena.testing import ChoiceRecorder

THRESHOLDS = (0.1, 0.5, 1.0, 1.5, 2.0)


def top_two_gap(totals: Sequence[float]) -> float:
    ranked = sorted(totals, reverse=True)
    return ranked[0] - ranked[1] if len(ranked) > 1 else float("inf")


def compare(name: str, first: list[list[float]], second: list[list[float]]) -> None:
    deltas = np.concatenate([np.abs(np.subtract(a, b)) for a, b in zip(first, second)])
    gap_moves = np.array([abs(top_two_gap(a) - top_two_gap(b)) for a, b in zip(first, second)])
    flips = sum(int(np.argmax(a) != np.argmax(b)) for a, b in zip(first, second))
    print(f"{name}: option total |diff| median {np.median(deltas):.3f}, p99 "
          f"{np.percentile(deltas, 99):.3f}, max {deltas.max():.3f} nats; top-two gap moves "
          f"p99 {np.percentile(gap_moves, 99):.3f}, max {gap_moves.max():.3f}; greedy picks "
          f"differ on {flips} of {len(first)} calls")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=6, help="test_seen tasks per type")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()

    plugins = Plugins()
    plugins.load_defaults()
    recorder = ChoiceRecorder(plugins)
    started = time.perf_counter()
    with TemporaryDirectory() as out:
        protocol.run("base", overrides=[
            "env.name=household", "env.level=easy", f"eval.limit={args.limit}",
            "eval.splits=[test_seen]", "llm.backend=recording", f"llm.threads={args.threads}",
        ], out=Path(out) / "run", plugins=plugins)
    calls = recorder.calls
    print(f"run (bfloat16 where native, prefix cache): {len(calls)} choose calls, "
          f"{time.perf_counter() - started:.0f} s")
    scores = {"run": [call.choice.option_logprobs for call in calls]}
    greedy = SamplingParams(temperature=0.0)
    for dtype in ("bfloat16", "float32"):
        backend = recorder.entry.factory(OmegaConf.create(
            {"model": "embedded", "threads": args.threads, "dtype": dtype, "prefix_cache": False}))
        started = time.perf_counter()
        scores[dtype] = [backend.choose([call.prompt], [call.options], greedy)[0].option_logprobs
                         for call in calls]
        print(f"{dtype}, batch 1, no cache: {(time.perf_counter() - started) / len(calls):.2f} s "
              f"per call")
    compare("run vs bfloat16 canonical", scores["run"], scores["bfloat16"])
    compare("run vs float32 canonical", scores["run"], scores["float32"])
    compare("bfloat16 vs float32 canonical", scores["bfloat16"], scores["float32"])
    for name in ("run", "float32"):
        gaps = np.array([top_two_gap(totals) for totals in scores[name]])
        counts = ", ".join(f"< {t}: {int((gaps < t).sum())}" for t in THRESHOLDS)
        print(f"{name}: calls with top-two gap {counts} (of {len(gaps)}; median gap "
              f"{np.median(gaps):.2f} nats)")


if __name__ == "__main__":
    main()
