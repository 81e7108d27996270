"""Rollout throughput: the harness's episodes against the backend's raw batched calls.

Run: ``python -m pytest benchmarks/bench_rollout.py --benchmark-only -s`` (about 2 minutes).

The harness plays episodes side by side (``eval.concurrency=8``) while every ``choose`` call is
recorded; the same calls are then replayed straight into the backend in batches of 8. Both move
the same tokens, so tokens/s(harness) / tokens/s(raw) is the share of the backend's batched speed
that rollouts keep (goal >= 0.8).
"""

from __future__ import annotations

import os
import time

from arena.core import protocol
from arena.core.config.plugins import Plugins
from arena.testing import ChoiceRecorder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
BATCH = 8


def test_rollout_tokens_per_second_against_raw(benchmark, tmp_path):
    plugins = Plugins()
    plugins.load_defaults()
    recorder = ChoiceRecorder(plugins)
    overrides = ["llm.backend=recording", "embedder.name=hashing", "eval.limit=4", "eval.max_steps=8",
                 f"eval.concurrency={BATCH}"]

    def harness() -> float:
        """Seconds of the evaluation phase itself (model loading excluded, as in the replay)."""
        _, results = protocol.run("base", overrides=overrides, out=tmp_path / f"h{time.time_ns()}",
                                  plugins=plugins)
        return float(results["cost"]["evaluate"]["wall_s"])

    harness_s = benchmark.pedantic(harness, rounds=1, iterations=1)
    backend = recorder.backends[-1].inner  # replayed straight into the backend, unrecorded
    tokens = backend.usage.tokens_in + backend.usage.tokens_out
    prompts = [call.prompt for call in recorder.calls]
    options = [call.options for call in recorder.calls]
    params = [call.params for call in recorder.calls]
    started = time.perf_counter()
    for i in range(0, len(prompts), BATCH):
        backend.choose(prompts[i : i + BATCH], options[i : i + BATCH], params[i : i + BATCH])
    raw_s = time.perf_counter() - started
    ratio = raw_s / harness_s  # same tokens both ways
    benchmark.extra_info.update(harness_tok_s=tokens / harness_s, raw_tok_s=tokens / raw_s, ratio=ratio)
    print(f"\nrollouts: {tokens / harness_s:.0f} tok/s in the harness, {tokens / raw_s:.0f} tok/s raw "
          f"batched ({len(prompts)} calls, batch {BATCH}): ratio {ratio:.2f}")
