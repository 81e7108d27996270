#!/usr/bin/env python
"""The GPU paths in one script (about 5 minutes on one GPU with the tiny model):

1. one process on one GPU: ``evolving_rl --preset micro`` (LoRA on bf16 weights) and
   ``--preset paper`` (full fine-tuning, bf16 weights with float32 masters, the authors'
   context), sizes shrunk as CI shrinks them (``arena.testing.shrunk_overrides``);
2. the same under ``torchrun`` at world size 1 (FSDP2, FSDP's mixed precision, rank 0 streaming
   weights to its served copy), and at world size 2 where the machine has 2 GPUs;
3. where vLLM is installed, ``evolving_rl --preset micro`` on the vLLM backend (the trainer's
   weights synced into the engine after the update).

Each step's wall time, validity, weights digest and the GPU memory it peaked at (nvidia-smi,
sampled) go to ``OUT/gpu_check.json`` and a table. ``--device cpu`` runs the same steps on the
CPU (gloo) to check the script itself. Usage: python scripts/gpu_check.py [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-check", help="folder for the runs and gpu_check.json")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--model", default="tiny", help="llm.model (a local folder; default: the tiny model)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    gpus = torch.cuda.device_count()
    if args.device == "cuda" and not gpus:
        print("No CUDA device: run on a GPU machine, or pass --device cpu to check the script.")
        return 2
    facts: dict[str, Any] = {"torch": torch.__version__, "gpus": gpus,
                             "gpu": torch.cuda.get_device_name(0) if gpus else None,
                             "bf16": bool(gpus and torch.cuda.is_bf16_supported()),
                             "device": args.device, "model": args.model}
    paper = _shrunk("evolving_rl", "paper") + [f"llm.model={args.model}", f"llm.device={args.device}",
                                               "embedder.name=hashing"]
    machine = [f"llm.model={args.model}", f"llm.device={args.device}", "embedder.name=hashing"]
    micro = ["--method", "evolving_rl", "--preset", "micro", *_shrunk("evolving_rl", "micro"), *machine]
    steps: list[dict[str, Any]] = []
    steps.append(_step("one process, micro preset (LoRA)", out / "micro", micro, ranks=0))
    steps.append(_step("one process, paper preset", out / "single",
                       ["--method", "evolving_rl", "--preset", "paper", *paper], ranks=0))
    steps.append(_step("torchrun, world size 1 (FSDP2)", out / "fsdp1",
                       ["--method", "evolving_rl", "--preset", "paper", *paper], ranks=1))
    if args.device == "cpu" or gpus >= 2:
        steps.append(_step("torchrun, world size 2 (FSDP2)", out / "fsdp2",
                           ["--method", "evolving_rl", "--preset", "paper", *paper], ranks=2))
    if importlib.util.find_spec("vllm") is not None and args.device == "cuda":
        steps.append(_step("micro preset on vLLM (weight sync)", out / "vllm", [*micro, "llm.backend=vllm"],
                           ranks=0))
    else:
        steps.append({"step": "micro preset on vLLM (weight sync)", "skipped": "vLLM not installed or no GPU"})

    single = steps[1].get("protocol")
    for step in steps[2:]:
        if "protocol" in step and single is not None and "torchrun" in step["step"]:
            step["protocol_equals_one_process"] = step["protocol"] == single
    report = {"facts": facts, "steps": steps}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(facts))
    for step in steps:
        shown = {k: v for k, v in step.items() if k not in ("protocol", "output_tail")}
        print(json.dumps(shown))
    failed = [s["step"] for s in steps if s.get("rc", 0) != 0 or s.get("valid") is False]
    print(f"{len(steps) - len(failed)} of {len(steps)} steps passed" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


def _shrunk(method: str, preset: str | None) -> list[str]:
    from arena.core.config.compose import compose
    from arena.core.config.plugins import get_plugins
    from arena.testing import shrunk_overrides

    return shrunk_overrides(compose(get_plugins(), method, preset=preset))


def _step(name: str, run_dir: Path, arena_args: list[str], ranks: int) -> dict[str, Any]:
    """One ``arena run`` (under torchrun with ``ranks`` processes, or plain with 0)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
                if ranks else [sys.executable])
    command = [*launcher, "-m", "arena.cli", "run", *arena_args, "--out", str(run_dir)]
    peak = _GpuMemory()
    started = time.perf_counter()
    with peak:
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "4"})
    result: dict[str, Any] = {"step": name, "rc": done.returncode,
                              "wall_s": round(time.perf_counter() - started, 1),
                              "peak_gpu_mib": peak.peak_mib}
    results_file = run_dir / "results.json"
    if results_file.exists():
        results = json.loads(results_file.read_text())
        result.update(valid=results["valid"], protocol=results["protocol"],
                      weights_sha256=results["provenance"]["model"].get("weights_sha256", "")[:16],
                      gradient_steps=results["learn"]["used"]["gradient_steps"])
    if done.returncode != 0:
        result["output_tail"] = (done.stdout + done.stderr)[-4000:]
        print(f"--- {name} failed ---\n{result['output_tail']}", file=sys.stderr)
    return result


class _GpuMemory:
    """The most GPU memory in use (all GPUs, MiB) while the block runs, from nvidia-smi."""

    def __init__(self) -> None:
        self.peak_mib: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> _GpuMemory:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            query = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True)
            if query.returncode == 0:
                used = sum(int(line) for line in query.stdout.split())
                self.peak_mib = max(self.peak_mib or 0, used)


if __name__ == "__main__":
    sys.exit(main())
