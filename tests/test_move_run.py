"""A run moved to another machine (``arena run --resume DIR --move-here``): refused without the
flag, finished with it, and the move on record, so a reader knows which lines were signed where."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from arena.core import protocol
from arena.core.storage import integrity
from arena.core.storage.rundir import RunDirError
from arena.report import ReportError, build_tables, load_run, load_runs
from tests.helpers.overrides import FAST
from tests.helpers.runs import killed_run

LEARN = [*FAST, "eval.limit=1", "learn.budget.episodes=4", "learn.max_steps=4"]


def use_key(monkeypatch: pytest.MonkeyPatch, path: Path) -> str | None:
    """Be the machine whose record key is the file ``path`` (made on first use)."""
    monkeypatch.setenv("ARENA_RECORD_KEY_FILE", str(path))
    return integrity.key_id(integrity.record_key())


def forge_success(run: Path, line: int) -> None:
    """Flip one episode line's outcome and recompute every hash after it (no key: no MACs)."""
    path = run / "episodes.jsonl"
    lines = [json.loads(raw) for raw in path.read_text().splitlines()]
    lines[line]["success"] = not lines[line]["success"]
    prev = lines[line]["chain"]["prev"]
    for record in lines[line:]:
        record["chain"]["prev"] = prev
        record["chain"]["hash"] = prev = integrity.line_hash(prev, record)
    path.write_text("".join(json.dumps(record) + "\n" for record in lines))
    if not (run / "results.json").exists():  # an unfinished run
        return
    results = json.loads((run / "results.json").read_text())
    results["record"]["head"] = prev
    for move in results["record"]["moves"]:
        if move["episodes"] > line:
            move["after"] = lines[move["episodes"] - 1]["chain"]["hash"]
    (run / "results.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A memrl run started on machine A, killed after its second learning step, finished on B."""
    root = tmp_path_factory.mktemp("moved")
    out = root / "run"
    with pytest.MonkeyPatch.context() as patch:
        key_a = use_key(patch, root / "a.key")
        assert killed_run(out, LEARN, "step.recorded:2") == 137, "the crash point was never reached"
        on_record = len((out / "episodes.jsonl").read_text().splitlines())
        shutil.copytree(out, root / "killed")  # the run as it left machine A
        key_b = use_key(patch, root / "b.key")
        with pytest.raises(RunDirError, match="--move-here") as refused:
            protocol.run(None, resume=out)
        assert not (out / "results.json").exists()
        _, results = protocol.run(None, resume=out, move_here=True)
    return {"out": out, "killed": root / "killed", "a": key_a, "b": key_b, "results": results, "on_record": on_record,
            "refusal": str(refused.value), "root": root}


def test_a_run_started_elsewhere_is_refused_naming_both_keys_and_the_flag(moved):
    assert moved["a"] in moved["refusal"] and moved["b"] in moved["refusal"]


def test_a_moved_run_finishes_valid_with_its_move_on_record(moved):
    results = moved["results"]
    assert results.valid is True
    assert results.learn.used["episodes"] == 4  # the two learned on A were not played again
    (move,) = results.record.moves
    assert (move.from_key_id, move.to_key_id) == (moved["a"], moved["b"])
    assert move.episodes == moved["on_record"] >= 2
    lines = [json.loads(raw) for raw in (moved["out"] / "episodes.jsonl").read_text().splitlines()]
    assert move.after == lines[move.episodes - 1]["chain"]["hash"]
    assert results.record.key_id == moved["b"] and len(lines) > move.episodes


def test_the_new_key_checks_the_lines_after_the_move_and_the_board_flags_it(moved, tmp_path, monkeypatch):
    copy = tmp_path / "run"
    shutil.copytree(moved["out"], copy)
    use_key(monkeypatch, moved["root"] / "b.key")
    load_run(copy)
    (row,) = build_tables(load_runs([copy]))[0].rows
    assert any("moved to another machine's record key" in flag for flag in row.flags)
    after = moved["results"].record.moves[0].episodes
    forge_success(copy, after)  # a line B signed: its MAC no longer matches
    with pytest.raises(ReportError, match="MAC"):
        load_run(copy)


def test_a_line_changed_before_the_move_breaks_the_new_keys_macs_after_it(moved, tmp_path, monkeypatch):
    copy = tmp_path / "run"
    shutil.copytree(moved["out"], copy)
    use_key(monkeypatch, moved["root"] / "b.key")
    forge_success(copy, 0)  # signed by A; but each line B signed hashes the lines before it
    with pytest.raises(ReportError, match="MAC"):
        load_run(copy)


def test_a_record_changed_in_transit_is_moved_on_its_hashes_and_flagged(moved, tmp_path, monkeypatch):
    """What no key can stop: lines rewritten between the machines, hashes recomputed. The move
    goes on from them, and the run carries the flag that says its first lines rest on hashes."""
    copy = tmp_path / "run"
    shutil.copytree(moved["killed"], copy)
    forge_success(copy, 0)
    use_key(monkeypatch, moved["root"] / "b.key")
    _, results = protocol.run(None, resume=copy, move_here=True)
    assert results.record.moves[0].episodes == moved["on_record"]
    (row,) = build_tables(load_runs([copy]))[0].rows
    assert any("moved to another machine's record key" in flag for flag in row.flags)


def test_a_move_point_outside_the_chain_is_refused(moved):
    lines = [json.loads(raw) for raw in (moved["out"] / "episodes.jsonl").read_text().splitlines()]
    key = bytes.fromhex((moved["root"] / "b.key").read_text().strip())
    integrity.verify(lines, "episodes.jsonl", key=key, expected_key_id=moved["b"],
                     macs_after=moved["results"].record.moves[0].after)
    with pytest.raises(integrity.RecordError, match="not in the chain"):
        integrity.verify(lines, "episodes.jsonl", key=key, expected_key_id=moved["b"], macs_after="f" * 64)
    with pytest.raises(integrity.RecordError, match="MAC"):  # B did not sign the lines before the move
        integrity.verify(lines, "episodes.jsonl", key=key, expected_key_id=moved["b"])


def test_move_here_without_resume_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--move-here applies to --resume"):
        protocol.run("base", overrides=[*FAST, "eval.limit=1"], out=tmp_path / "r", move_here=True)



def test_a_new_record_key_file_appears_only_whole_and_the_first_one_made_wins(tmp_path, monkeypatch):
    """The first runs on a machine (or a test session's workers) make its record key at the same
    moment: another process must never read the key file empty or half-written (its records went
    without a MAC), and a process that lost the race signs with the key the file holds."""
    import os

    key_file = tmp_path / "machine" / "record.key"
    monkeypatch.setenv("ARENA_RECORD_KEY_FILE", str(key_file))
    readable_while_written: list[str | None] = []
    fdopen, link = os.fdopen, os.link

    def writing(descriptor, *args, **kwargs):  # what another process would read at this moment
        readable_while_written.append(key_file.read_text() if key_file.exists() else None)
        return fdopen(descriptor, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", writing)
    mine = integrity.record_key()
    assert readable_while_written == [None] and mine is not None
    assert integrity.record_key() == mine and sorted(p.name for p in key_file.parent.iterdir()) == ["record.key"]

    key_file.unlink()
    theirs = "ab" * 32

    def another_process_first(source, target):
        Path(target).write_text(theirs + "\n")
        return link(source, target)

    monkeypatch.setattr(os, "link", another_process_first)
    assert integrity.record_key() == bytes.fromhex(theirs)
    assert sorted(p.name for p in key_file.parent.iterdir()) == ["record.key"]  # nothing left beside it

    key_file.unlink()

    def no_hard_links(source, target):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_hard_links)  # such a filesystem still gets a key, as before
    made = integrity.record_key()
    assert made is not None and key_file.read_text().strip() == made.hex()
    assert sorted(p.name for p in key_file.parent.iterdir()) == ["record.key"]
