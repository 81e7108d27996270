"""Exactly-once steps: a run killed (``os._exit``, as kill -9: no cleanup) at every point of a
learning step's window, and of an online test step's, resumes to the state and record of a run
never killed. Fault injection (``ARENA_CRASH_AT``), not sleeps: each kill lands where it says.

MemRL is the method: its ``update`` writes the store twice per step (the Q-values of the memories
used, then the new memory), so a repeated update is visible in its learned state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arena.core import protocol
from arena.core.contract.results import Results
from tests.helpers.methods import HelperCopier
from tests.helpers.overrides import FAST
from tests.helpers.runs import killed_run, register

LEARN = [*FAST, "eval.limit=1", "learn.budget.episodes=4", "learn.max_steps=4"]
ONLINE = [*FAST, "eval.limit=2", "learn.budget.episodes=0", "run.track=online"]
#: Every point of a step's window, in order: after its episode, once its journal is written,
#: once each store write's rows are journaled and once each write is done, after extract,
#: after update, after the record.
POINTS = ["step.played", "step.begun", "step.extracted", "step.undo_logged", "store.written",
          "step.updated", "step.recorded"]


def record(path: Path) -> list[tuple]:
    lines = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    return [(e["phase"], e["split"], e["task_id"], e["seed"], e["variant"], e["success"], e["steps"],
             tuple(e["experience_ids"])) for e in lines]


def learned(path: Path, results: Results) -> dict:
    """What must match an uninterrupted run: the learned state's digest, every record."""
    state = json.loads((path / "state.json").read_text())
    return {"digest_before_eval": results.state.digest_before_eval,
            "digest_after_eval": results.state.digest_after_eval,
            "memories": results.state.memory_items,
            "episodes": sorted(record(path)), "valid": results.valid,
            "learned_on": state.get("learn_used", {}).get("episodes")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("whole")
    out = {}
    for name, overrides in (("learn", LEARN), ("online", ONLINE)):
        path, results = protocol.run("memrl", overrides=overrides, out=root / name)
        out[name] = learned(path, results)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("track, overrides", [("learn", LEARN), ("online", ONLINE)])
@pytest.mark.parametrize("point", POINTS)
def test_a_step_killed_anywhere_resumes_as_if_never_killed(tmp_path, uninterrupted, track, overrides, point):
    # The second time the point is reached: the store already holds what an earlier write put
    # there (online learns nothing before its test steps, so every kill lands in one of those).
    out = tmp_path / "run"
    assert killed_run(out, overrides, f"{point}:2") == 137, "the crash point was never reached"
    assert not (out / "results.json").exists()
    path, results = protocol.run(None, resume=out)
    assert learned(path, results) == uninterrupted[track]
    assert not (out / "step.journal").exists()


def learn_tokens_after(path: Path, episodes: int) -> int:
    """The learning phase's tokens once ``episodes`` learning episodes were recorded."""
    lines = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    cost = [e["phase_cost"] for e in lines if e["phase"] == "learn"][episodes - 1]
    return cost["tokens_in"] + cost["tokens_out"]


@pytest.mark.slow
def test_a_kill_between_a_record_and_its_cost_keeps_a_binding_token_budget(tmp_path):
    """Killed after a learning episode's record and before its cost reached state.json: the
    resumed run used to start from the older cost, learn one episode more than the budget allowed
    and report fewer LLM calls. The record carries the phase's cost so far."""
    probe, _ = protocol.run("memrl", overrides=[*FAST, "eval.limit=1", "learn.budget.episodes=6",
                                                "learn.max_steps=4"], out=tmp_path / "probe")
    budget = learn_tokens_after(Path(probe), 3) + 1  # binds during the 4th episode
    overrides = [*FAST, "eval.limit=1", "learn.budget.episodes=null", f"learn.budget.tokens={budget}",
                 "learn.max_steps=4"]
    whole, whole_results = protocol.run("memrl", overrides=overrides, out=tmp_path / "whole")
    out = tmp_path / "killed"
    assert killed_run(out, overrides, "episode.recorded:3") == 137, "the crash point was never reached"
    path, results = protocol.run(None, resume=out)
    assert learned(path, results) == learned(whole, whole_results)
    assert whole_results.learn.used["episodes"] == 4
    for key in ("llm_calls", "tokens_in", "tokens_out"):
        assert getattr(results.cost.learn, key) == getattr(whole_results.cost.learn, key), key


@pytest.mark.slow
def test_a_run_killed_while_its_session_is_built_resumes_with_its_start_on_record(tmp_path):
    out = tmp_path / "killed"
    assert killed_run(out, LEARN, "session.built:1") == 137, "the crash point was never reached"
    _, results = protocol.run(None, resume=out)
    assert results.started is not None and results.provenance.arena_version


def full_disk_run(out: Path, overrides: list[str], fail_at: str) -> subprocess.CompletedProcess:
    """``arena run`` whose write of a file fails half way, as on a full disk (fault injection)."""
    code = "import sys; from arena.cli import main; sys.argv = ['arena', *sys.argv[1:]]; main()"
    env = {**os.environ, "ARENA_DISK_FULL_AT": fail_at}
    return subprocess.run([sys.executable, "-c", code, "run", "--method", "memrl", "--env", "household",
                           *overrides, "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("fail_at", ["trajectories.jsonl:3", "episodes.jsonl:3", "state.json:6",
                                     "episodes.jsonl:6"])
def test_a_full_disk_stops_the_run_with_the_fix_and_resume_loses_nothing(tmp_path, uninterrupted, fail_at):
    out = tmp_path / "full"
    done = full_disk_run(out, LEARN, fail_at)
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert "The disk is full" in said and f"arena run --resume {out.resolve()}`" in said
    assert "Traceback" not in said
    path, results = protocol.run(None, resume=out)
    assert learned(path, results) == uninterrupted["learn"]


@pytest.mark.slow
def test_a_declared_copy_of_a_helper_recorded_before_a_kill_stays_valid(tmp_path, plugins):
    """Killed right after a task's helper episode was recorded: on resume the helper comes back
    from the record, and the result copied from it is still the copy of that task's only helper."""
    overrides = [*FAST, "eval.limit=1", "learn.budget.episodes=0", "eval.concurrency=1"]
    code = ("import sys; from arena.core import protocol; from arena.core.config.plugins import Plugins; "
            "from tests.helpers.runs import register; from tests.helpers.methods import HelperCopier; "
            "p = Plugins(); p.load_defaults(); register(p, helper_copier=HelperCopier); "
            "protocol.run('helper_copier', overrides=sys.argv[2:], out=sys.argv[1], plugins=p)")
    out = tmp_path / "killed"
    done = subprocess.run([sys.executable, "-c", code, str(out), *overrides],
                          env={**os.environ, "ARENA_CRASH_AT": "episode.recorded:1"}, timeout=300)
    assert done.returncode == 137, "the crash point was never reached"
    register(plugins, helper_copier=HelperCopier)
    path, results = protocol.run(None, resume=out, plugins=plugins)
    assert results.valid is True, results.violations
    primary = [line for line in map(json.loads, (Path(path) / "episodes.jsonl").read_text().splitlines())
               if line["variant"] == "default"]
    assert len(primary) == 2 and all(line["copy_of"] == "without_skill" for line in primary)
