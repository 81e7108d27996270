"""Peak resident memory of a run against the size of the model it serves (issue 43).

Each row is one ``arena run`` as a new process on the embedded model, measured with the kernel's
own account of that process (``os.wait4``'s ``ru_maxrss``), divided by the bytes of the model's
weights in the dtype it was served in (SmolLM2-135M: 0.27 GB in bfloat16, 0.54 GB in float32):

- ``base``: the model alone (evaluation only);
- ``evolving_rl --preset micro`` (the first command's preset) and ``grpo --preset cpu``, shrunk
  as CI shrinks presets (``arena.testing.shrunk_overrides``: counts and token limits only), so
  that every stage, the LoRA update included, runs once with the preset's sequence shapes.

Each run evaluates one task per split. Run: ``HF_HUB_OFFLINE=1 pytest benchmarks/bench_memory.py
--benchmark-only -s`` (about 10 minutes on 2 cores); figures in docs/speed.md ("Memory").
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROWS = {
    "base": ("base", None),
    "evolving_rl --preset micro": ("evolving_rl", "micro"),
    "grpo --preset cpu": ("grpo", "cpu"),
}


def overrides(method: str, preset: str | None) -> list[str]:
    if preset is None:
        return ["eval.limit=1"]
    from arena.core.config.compose import compose
    from arena.core.config.plugins import get_plugins
    from arena.testing import shrunk_overrides

    return shrunk_overrides(compose(get_plugins(), method, preset=preset))


def peak_of_run(method: str, preset: str | None, out: Path) -> dict[str, Any]:
    """One ``arena run`` in a new process: its peak resident memory and the model's size."""
    command = [sys.executable, "-m", "arena.cli", "run", "--method", method,
               *(["--preset", preset] if preset else []), *overrides(method, preset), "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{process.stderr.read()[-3000:] if process.stderr else ''}")
    model = json.loads((out / "results.json").read_text())["provenance"]["model"]
    weights = model_bytes(model.get("dtype", "float32"))
    peak = usage.ru_maxrss * 1024  # Linux reports KiB
    return {"peak_gib": round(peak / 2**30, 2), "model_gib": round(weights / 2**30, 2),
            "peak_over_model": round(peak / weights, 1), "dtype": model.get("dtype")}


def model_bytes(dtype: str) -> int:
    """Bytes of the embedded model's weights in ``dtype``, from its safetensors header."""
    from safetensors import safe_open

    from arena.backends.embedded import embedded_model_dir

    size = {"bfloat16": 2, "float16": 2, "float32": 4}[dtype]
    with safe_open(str(embedded_model_dir() / "model.safetensors"), framework="pt") as weights:
        count = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118
    return count * size


@pytest.mark.parametrize("row", list(ROWS))
def test_peak_memory_against_model_size(benchmark: Any, tmp_path: Path, row: str) -> None:
    method, preset = ROWS[row]
    figures = benchmark.pedantic(peak_of_run, args=(method, preset, tmp_path / "run"), rounds=1, iterations=1)
    benchmark.extra_info.update(figures)
    print(f"\n{row}: peak {figures['peak_gib']} GiB = {figures['peak_over_model']} x the model's "
          f"{figures['model_gib']} GiB of {figures['dtype']} weights")
    assert figures["peak_over_model"] > 1  # the process holds at least the weights it serves
