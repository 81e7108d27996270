#!/usr/bin/env python
"""Kill -9 at random points of a run, resume, and compare with a run never killed.

For each phase (learning, frozen evaluation, the online track) it runs MemRL once whole, then
TRIALS times: start the same run, wait until the phase has recorded its first episode, sleep a
random fraction of the phase's length, SIGKILL, then ``arena run --resume``. A trial counts as
identical when the resumed run's learned-state digests (before and after evaluation), memory
count, validity and every recorded episode (phase, split, task, seed, variant, success, steps,
memories used) equal the uninterrupted run's: nothing doubled, nothing lost. MemRL is the method
because its update writes the store twice a step, so a repeated or lost step shows.

The fake backend keeps a trial to seconds; the fault-injection tests
(``tests/test_exactly_once.py``) cover each point of a step's window deterministically, this
script the points nobody chose. Usage: python scripts/kill_trials.py [--trials 20] [--seed 0]
[--out DIR]; figures go to OUT/kill_trials.json and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORLD = ["llm.backend=fake", "eval.limit=null", "embedder.name=hashing", "env.n_train=120",
         "env.n_valid=12", "eval.max_steps=30", "eval.concurrency=2"]
FROZEN = [*WORLD, "env.n_test=60", "learn.budget.episodes=40", "learn.max_steps=8", "run.seeds=[0,1]"]
ONLINE = [*WORLD, "env.n_test=30", "learn.budget.episodes=0", "run.track=online", "run.seeds=[0]"]
#: phase name -> (overrides, the episodes' phase that shows it has begun, results' cost key)
PHASES = {"learning": (FROZEN, "learn", "learn"), "evaluation": (FROZEN, "evaluate", "evaluate"),
          "online": (ONLINE, "evaluate", "evaluate")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("kill-trials"))
    parser.add_argument("--phases", nargs="*", default=list(PHASES), choices=list(PHASES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    report: dict[str, Any] = {"trials_per_phase": args.trials, "seed": args.seed, "phases": {}}
    for phase in args.phases:
        overrides, marker, cost_key = PHASES[phase]
        whole = args.out / f"{phase}-whole"
        _arena(["--method", "memrl", *overrides, "--out", str(whole)], fresh=whole)
        expected = _outcome(whole)
        length = json.loads((whole / "results.json").read_text())["cost"][cost_key]["wall_s"]
        figures = {"phase_s": length, "killed": 0, "finished_before_kill": 0, "identical": 0,
                   "different": []}
        for trial in range(args.trials):
            run_dir = args.out / f"{phase}-{trial:02d}"
            delay = rng.uniform(0.0, 0.9 * length)
            killed = _kill_during(["--method", "memrl", *overrides, "--out", str(run_dir)],
                                  run_dir, marker, delay)
            figures["killed" if killed else "finished_before_kill"] += 1
            if not (run_dir / "results.json").exists():
                _arena(["--resume", str(run_dir)])
            if _outcome(run_dir) == expected:
                figures["identical"] += 1
            else:
                figures["different"].append(trial)
            shutil.rmtree(run_dir)
            print(f"{phase} trial {trial}: killed={killed} after {delay:.2f}s, "
                  f"identical={trial not in figures['different']}", file=sys.stderr)
        report["phases"][phase] = figures
    (args.out / "kill_trials.json").write_text(json.dumps(report, indent=2))
    print("| phase | trials | killed in the phase | phase over before the kill | identical after resume |")
    print("|---|---|---|---|---|")
    for phase, f in report["phases"].items():
        print(f"| {phase} | {args.trials} | {f['killed']} | {f['finished_before_kill']} | {f['identical']} |")
    return 0 if all(not f["different"] for f in report["phases"].values()) else 1


def _arena(arguments: list[str], fresh: Path | None = None) -> None:
    if fresh is not None:
        shutil.rmtree(fresh, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "arena.cli", "run", *arguments], capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"arena run {' '.join(arguments)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _kill_during(arguments: list[str], run_dir: Path, marker: str, delay: float) -> bool:
    """Start the run, SIGKILL it ``delay`` seconds after its first ``marker`` episode; whether
    the kill landed in the phase (False: the run, or its learning, had finished)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    process = subprocess.Popen([sys.executable, "-m", "arena.cli", "run", *arguments],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
    while process.poll() is None and not _has_episode(run_dir, marker):
        time.sleep(0.01)
    time.sleep(delay)
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    process.wait()
    if marker == "learn" and _has_episode(run_dir, "evaluate"):
        return False  # learning had ended: not a kill of this phase
    return not (run_dir / "results.json").exists()


def _has_episode(run_dir: Path, phase: str) -> bool:
    path = run_dir / "episodes.jsonl"
    if not path.exists():
        return False
    return any(f'"phase": "{phase}"' in line for line in path.read_text().splitlines())


def _outcome(run_dir: Path) -> dict[str, Any]:
    """What must equal the uninterrupted run's (see the module docstring)."""
    results = json.loads((run_dir / "results.json").read_text())
    lines = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    episodes = sorted((e["phase"], e["split"], e["task_id"], e["seed"], e["variant"], e["success"],
                       e["steps"], tuple(e["experience_ids"])) for e in lines)
    return {"digest_before_eval": results["state"]["digest_before_eval"],
            "digest_after_eval": results["state"]["digest_after_eval"],
            "memories": results["state"]["memory_items"], "valid": results["valid"],
            "episodes": episodes}


if __name__ == "__main__":
    sys.exit(main())
