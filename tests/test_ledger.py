"""The run's ledger (``arena.core.storage.ledger``): the one owner of state.json, typed and versioned;
every committed run's state migrates; a phase's cost travels with its records, so a run killed
after any record resumes to the cost of a run never killed."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arena.core import protocol
from arena.core.contract.results import Results
from arena.core.storage.files import RunDirError
from arena.core.storage.ledger import STATE, Ledger, LedgerError, PhaseCost, RunState
from tests.helpers.overrides import FAST
from tests.helpers.runs import killed_run

ROOT = Path(__file__).resolve().parents[1]


def committed_states() -> list[Path]:
    """Every harness state.json the repository holds (a method's own method/state.json is not one)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", f"*{STATE}"], capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / path for path in listed if Path(path).parent.name != "method"]


def test_every_committed_runs_state_migrates_with_its_figures_kept():
    states = committed_states()
    assert len(states) >= 40, "the committed boards' runs were not found"
    for path in states:
        raw = json.loads(path.read_text())
        state = Ledger(path.parent).read()
        assert state.version == 2, path
        for phase in ("learn", "evaluate"):
            kept = {k: v for k, v in raw.get(f"cost_{phase}", {}).items() if not k.startswith("base_")}
            assert state.cost(phase).model_dump() == {**PhaseCost().model_dump(), **kept}, (path, phase)
        assert state.digest_before_eval == raw.get("digest_before_eval"), path
        assert state.learn_done == raw.get("learn_done", False), path
        assert state.to_json()["provenance"] == raw["provenance"], path


def test_a_state_with_an_unknown_entry_or_from_a_newer_arena_is_refused_with_the_fix(tmp_path):
    (tmp_path / STATE).write_text(json.dumps({"version": 2, "learn_done": True, "learn_dnoe": True}))
    with pytest.raises(LedgerError, match=r"unknown entry at 'learn_dnoe'.*Restore it from a copy"):
        Ledger(tmp_path).read()
    (tmp_path / STATE).write_text(json.dumps({"version": 3}))
    with pytest.raises(LedgerError, match=r"newer Arena .*Upgrade Arena"):
        Ledger(tmp_path).read()
    (tmp_path / STATE).write_text(json.dumps({"version": 2, "gradient_steps": "many"}))
    with pytest.raises(RunDirError, match=r"bad value .* at 'gradient_steps'"):
        Ledger(tmp_path).read()


def test_each_event_is_one_write_that_keeps_what_the_others_wrote(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.create(config_sha256="c" * 64, record_key_id="k")
    ledger.start(started="2026-12-06T00:00:00Z", provenance={"git_sha": "abc"})
    ledger.violations(["first"])
    ledger.gradient_steps(3)
    cost = PhaseCost(llm_calls=4, tokens_in=40, tokens_out=5, wall_s=1.5)
    ledger.learning_done(used={"episodes": 2}, splits=["valid", "train"], digest="d" * 64, cost=cost)
    ledger.phase_session("evaluate", {"git_sha": "abc"})
    ledger.phase_session("evaluate", {"git_sha": "abc"})  # the same session twice is kept once
    state = ledger.read()
    assert state.config_sha256 == "c" * 64 and state.violations == ["first"] and state.gradient_steps == 3
    assert state.learn_done and state.splits_used_for_learning == ["train", "valid"] and state.cost_learn == cost
    assert state.phase_sessions == {"evaluate": [{"git_sha": "abc"}]}
    on_disk = json.loads((tmp_path / STATE).read_text())
    assert on_disk["version"] == 2 and RunState.model_validate(on_disk) == state
    assert "poisoned" not in on_disk  # an event that never happened writes nothing


def test_undoing_a_step_keeps_the_violations_recorded_since_and_sets_the_phases_cost(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.create(config_sha256=None, record_key_id=None)
    before = ledger.snapshot()
    ledger.gradient_steps(7)  # inside the killed step: undone
    ledger.violations(["found during the step"])  # never undone
    cost = PhaseCost(llm_calls=9)
    state = ledger.undo_step(before, "learn", cost)
    assert state.gradient_steps == 0 and state.violations == ["found during the step"]
    assert ledger.read().cost_learn == cost


def test_only_the_ledger_names_the_run_state_file():
    """No module of arena/ but the ledger (and a method's own state, method/state.json) names
    state.json in code: every read and write of the run's state goes through the ledger."""
    allowed = {ROOT / "arena/core/storage/ledger.py", ROOT / "arena/core/storage/method_state.py"}
    found = []
    for path in sorted((ROOT / "arena").rglob("*.py")):
        if path in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == STATE:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"state.json named outside the ledger: {found}"


def is_run_state(path: object) -> bool:
    path = Path(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else None
    return path is not None and path.name == STATE and path.parent.name != "method"


def first_caller() -> str:
    """The module that asked for the file: the first frame outside the file helpers."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in (
            "arena.core.storage.files", "pathlib", "pathlib._local", "os", __name__):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "?") if frame is not None else "?"


def test_a_run_reads_and_writes_its_state_through_the_ledger_only(tmp_path, monkeypatch):
    """Every read and write of a run's state.json, from its start to its results and a resume,
    comes from arena.core.storage.ledger (each file access records who asked)."""
    callers: set[str] = set()

    def watched(real, where=lambda self, *a, **k: self):
        def call(*args, **kwargs):
            if is_run_state(where(*args, **kwargs)):
                callers.add(first_caller())
            return real(*args, **kwargs)
        return call
    for name in ("read_text", "read_bytes", "write_text", "write_bytes", "open"):
        monkeypatch.setattr(Path, name, watched(getattr(Path, name)))
    monkeypatch.setattr(os, "replace", watched(os.replace, where=lambda source, target, *a, **k: target))
    monkeypatch.setattr("builtins.open", watched(open, where=lambda file, *a, **k: file))
    overrides = [*FAST, "eval.limit=1", "learn.budget.episodes=2"]
    path, results = protocol.run("memrl", overrides=overrides, out=tmp_path / "run")
    assert results.valid, results.violations
    assert (path / STATE).is_file()
    assert callers == {"arena.core.storage.ledger"}, callers


# -- cost on the record: a kill after any record ----------------------------------------------

#: Learning is sequential; evaluation one episode at a time, so no other episode is in flight
#: when a record is written (with eval.concurrency=N, the calls of episodes in flight at a kill
#: were spent and are counted; the episodes are played again).
KILLED = [*FAST, "eval.limit=2", "eval.concurrency=1", "learn.budget.episodes=3", "learn.max_steps=4"]
RECORDS = 3 + 2 * 2  # learning episodes, then two tasks of each test split


def phase_costs(results: Results) -> dict:
    return {phase: {key: getattr(getattr(results.cost, phase), key) for key in ("llm_calls", "tokens_in", "tokens_out")}
            for phase in ("learn", "evaluate")}


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> dict:
    path, results = protocol.run("memrl", overrides=KILLED, out=tmp_path_factory.mktemp("whole") / "run")
    records = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == RECORDS and all("phase_cost" in r for r in records)
    assert records[-1]["phase_cost"]["llm_calls"] == results.cost.evaluate.llm_calls > 0
    return phase_costs(results)


@pytest.mark.slow
@pytest.mark.parametrize("record", range(1, RECORDS + 1))
def test_a_run_killed_after_any_record_resumes_to_every_phases_cost_of_a_run_never_killed(
        tmp_path, whole, record):
    """Before the cost travelled with the records, a run killed right after its first evaluation
    record reported its evaluation at 84 model calls against 96 (memrl): the state was rewritten
    after the record, and the kill came between the two."""
    out = tmp_path / "killed"
    assert killed_run(out, KILLED, f"episode.recorded:{record}") == 137, "the crash point was never reached"
    _, results = protocol.run(None, resume=out)
    assert results.valid, results.violations
    assert phase_costs(results) == whole
