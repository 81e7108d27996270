"""``arena verify``: an honest run replays exactly; a changed record, a method that plays otherwise
on replay and a learned state that is not on disk are told apart; boards show the state."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import arena
from arena import Run
from arena.cli import cli
from arena.core.contract.results import Results
from arena.report import ReportError, build_tables, load_run, load_runs
from arena.report.evaluate_state import evaluate_state
from arena.report.render import board_json, markdown
from arena.report.verification import VERIFICATION
from arena.report.verify import NOT_RESTORED, OUTCOMES_ONLY, verify_run
from arena.testing import fresh_plugins, run_method
from tests.helpers.results import made_up_results

COUNTER_ENV = "ARENA_TEST_HOSTILE_COUNTER"

#: A method whose play depends on a file outside its saved state: a counter of the processes
#: that built it. The first plays the standard solver; any later one (the replay) stops after two
#: steps. Written as an installed plugin (a module and its dist-info with an ``arena`` entry
#: point), so that the replay's fresh process finds it as it would a real package.
HOSTILE = textwrap.dedent('''
    import os
    from pathlib import Path

    import arena


    class Hostile:
        def __init__(self, run):
            counter = Path(os.environ["ARENA_TEST_HOSTILE_COUNTER"])
            self.built_before = int(counter.read_text()) if counter.exists() else 0
            counter.write_text(str(self.built_before + 1))

        @arena.hookimpl
        def solve(self, run, task, experiences, seed):
            return run.play(arena.EpisodeRequest(task, experiences, seed, policy=arena.STANDARD,
                                                 max_steps=None if self.built_before == 0 else 2))


    @arena.hookimpl
    def register_methods(register):
        register("hostile_replay", Hostile, description="plays otherwise on replay (a test)")
''')


def _install_hostile(site: Path) -> None:
    site.mkdir()
    (site / "arena_hostile_replay.py").write_text(HOSTILE)
    info = site / "arena_hostile_replay-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: arena-hostile-replay\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[arena]\nhostile_replay = arena_hostile_replay\n")


def _verify_cli(path: Path) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(cli, ["verify", str(path)])
    return result.exit_code, json.loads((path / VERIFICATION).read_text())


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_method("base", out=tmp_path_factory.mktemp("verify") / "base").path


@pytest.fixture(scope="module")
def memrl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_method("memrl", out=tmp_path_factory.mktemp("verify") / "memrl").path


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns(VERIFICATION, "run.lock"))
    return to


# -- honest runs ------------------------------------------------------------------------------


def test_an_honest_base_run_verifies_in_a_fresh_process(base_run: Path, tmp_path: Path) -> None:
    run = _copy(base_run, tmp_path / "base")
    before = {name: (run / name).read_bytes() for name in ("episodes.jsonl", "results.json", "state.json")}
    code, written = _verify_cli(run)
    assert code == 0, written
    assert written["verified"] is True and written["status"] == "verified"
    assert written["episodes_compared"] == 8 and written["episodes_differing"] == 0
    assert written["record_head"] == json.loads((run / "results.json").read_text())["record"]["head"]
    # The signed record and the run's own files are as they were; the replay folder is gone.
    assert {name: (run / name).read_bytes() for name in before} == before
    assert written["replay"]["folder"] is None


def test_an_honest_learning_run_verifies(memrl_run: Path, tmp_path: Path) -> None:
    run = _copy(memrl_run, tmp_path / "memrl")
    results = json.loads((run / "results.json").read_text())
    assert results["state"]["memory_items"] > 0  # a learned store, restored by the replay
    shown = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    assert any(r["experience_ids"] for r in shown if r["phase"] == "evaluate")  # and compared
    kept = tmp_path / "replay"
    outcome = verify_run(run, keep=kept)
    assert outcome.status == "verified", outcome.reason
    # The replay kept its own record: learning skipped (its records copied), evaluation played.
    replayed = [json.loads(line) for line in (kept / "episodes.jsonl").read_text().splitlines()]
    assert {r["phase"] for r in replayed} == {"learn", "evaluate"}
    assert json.loads((kept / "results.json").read_text())["valid"]


# -- changed records, other play, missing state ------------------------------------------------


def test_a_record_changed_after_the_fact_is_unverified(base_run: Path, tmp_path: Path) -> None:
    run = _copy(base_run, tmp_path / "forged")
    lines = (run / "episodes.jsonl").read_text().splitlines()
    forged = []
    for line in lines:
        record = json.loads(line)
        if record["phase"] == "evaluate" and not record["success"]:
            record.update(success=True, status="success")
        forged.append(json.dumps(record, sort_keys=True))
    (run / "episodes.jsonl").write_text("\n".join(forged) + "\n")
    code, written = _verify_cli(run)
    assert code == 1
    assert written["verified"] is False and written["status"] == "unverified"
    assert "integrity check" in written["reason"] and "changed after it was written" in written["reason"]


def test_a_method_that_plays_otherwise_on_replay_is_unverified(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    _install_hostile(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv(COUNTER_ENV, str(tmp_path / "counter"))
    run = run_method("hostile_replay", out=tmp_path / "hostile", plugins=fresh_plugins()).path
    assert json.loads((run / "results.json").read_text())["valid"]  # nothing the run itself saw
    code, written = _verify_cli(run)  # the replay: a fresh process, the plugin as installed
    assert code == 1, written
    assert written["status"] == "unverified"
    assert written["episodes_differing"] >= 1
    first = written["differing"][0]
    assert first["episode"].startswith("test_") and "steps" in first["difference"]
    assert first["first_difference"]["step"] == 3  # two steps alike, then the replay stopped
    assert first["episode"] in written["reason"]


class Forgetful:
    """Learns a number it keeps only in memory (its digest covers it): not restorable."""

    def __init__(self, run: Run) -> None:
        self.learned = "nothing"

    @arena.hookimpl
    def learn(self, run: Run) -> bool:
        self.learned = "something"
        return True

    @arena.hookimpl
    def state_digest(self, run: Run) -> str:
        return self.learned


class OtherEachTime:
    """Registered in-process: plays the standard solver, then after two steps on a later build."""

    builds = 0

    def __init__(self, run: Run) -> None:
        self.build = OtherEachTime.builds
        OtherEachTime.builds += 1

    @arena.hookimpl
    def solve(self, run: Run, task: Any, experiences: list[Any], seed: int) -> Any:
        return run.play(arena.EpisodeRequest(task, experiences, seed, policy=arena.STANDARD,
                                             max_steps=None if self.build == 0 else 2))


@pytest.mark.parametrize(("method", "status", "says"), [
    (Forgetful, "unverifiable", "could not be restored"),
    (OtherEachTime, "unverified", "differ on replay"),
])
def test_in_process_methods_replay_in_a_fresh_session(method: Callable[..., Any], status: str, says: str,
                                                      tmp_path: Path) -> None:
    plugins = fresh_plugins(entry_points=False)
    run = run_method(method, out=tmp_path / "run", plugins=plugins).path
    outcome = verify_run(run, plugins=plugins)
    assert outcome.status == status and says in outcome.reason, outcome.reason
    assert json.loads((run / VERIFICATION).read_text())["verified"] is False


def test_a_run_without_its_learned_state_cannot_be_verified(memrl_run: Path, tmp_path: Path) -> None:
    run = _copy(memrl_run, tmp_path / "no-store")
    shutil.rmtree(run / "store")
    code, written = _verify_cli(run)
    assert code == 3
    assert written["status"] == "unverifiable" and written["verified"] is False
    assert "could not be restored" in written["reason"]
    # A board's run keeps no trajectories: said, never claimed verified.
    small = _copy(memrl_run, tmp_path / "small")
    for name in ("trajectories.jsonl", "store", "method"):
        path = small / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    assert verify_run(small).status == "unverifiable"


# -- a board's committed run: its small files, and its learned state put back -------------------

#: What .gitignore keeps of a board's run (tests/test_boards.py: SMALL_FILES).
BOARD_FILES = ("results.json", "episodes.jsonl", "config.yaml", "state.json", "metrics.jsonl",
               "violations.jsonl")


def _as_committed(run: Path, to: Path) -> Path:
    """``run`` as a board commits it: its small files only (no trajectories, no learned state)."""
    to.mkdir()
    for name in BOARD_FILES:
        if (run / name).is_file():
            shutil.copy2(run / name, to / name)
    return to


def test_a_board_run_of_a_method_that_learns_nothing_reverifies_where_it_sits(base_run: Path,
                                                                              tmp_path: Path) -> None:
    board = _as_committed(base_run, tmp_path / "base-seed0")
    outcome = verify_run(board, write=False)
    assert outcome.status == "verified", outcome.reason
    assert "same outcomes" in outcome.reason and OUTCOMES_ONLY in outcome.notes
    assert outcome.compared == 8 and outcome.replay["compared"] == "outcomes"


def test_a_board_run_reverifies_once_its_learned_state_is_back(memrl_run: Path, tmp_path: Path) -> None:
    board = _as_committed(memrl_run, tmp_path / "memrl-seed0")
    missing = verify_run(board, write=False)
    assert missing.status == "unverifiable"
    assert "has no store/ or method/" in missing.reason and "digest_before_eval" in missing.reason
    for name in ("store", "method"):  # the learned state its maker kept, put back
        shutil.copytree(memrl_run / name, board / name)
    outcome = verify_run(board, write=False)
    assert outcome.status == "verified", outcome.reason
    assert OUTCOMES_ONLY in outcome.notes
    # And the board's digest is what `arena evaluate --state` checks a learned state against.
    _, again = evaluate_state(board, tmp_path / "again", ["eval.salt=public"])
    original = json.loads((memrl_run / "results.json").read_text())
    assert again.valid, again.violations
    assert again.splits["test_seen"].success_rate == original["splits"]["test_seen"]["success_rate"]


def test_another_learned_state_put_beside_a_board_run_is_refused(memrl_run: Path, tmp_path: Path) -> None:
    board = _as_committed(memrl_run, tmp_path / "memrl-seed0")
    for name in ("store", "method"):
        shutil.copytree(memrl_run / name, board / name)
    snapshot = board / "method" / "memory-after-learning.jsonl.gz"
    assert snapshot.is_file()
    (board / "method" / "state.json").write_text("{}")  # a method state the run never had
    outcome = verify_run(board, write=False)
    assert outcome.status == "unverifiable" and "could not be restored" in outcome.reason
    _, again = evaluate_state(board, tmp_path / "again", ["eval.salt=public"])
    assert again.valid is False
    assert any(v.startswith(NOT_RESTORED) for v in again.violations), again.violations


def test_a_board_run_on_a_secret_draw_names_why_it_cannot_be_replayed(base_run: Path, tmp_path: Path) -> None:
    board = _as_committed(base_run, tmp_path / "secret")
    results = json.loads((board / "results.json").read_text())
    results["protocol"]["eval_salt"] = "secret:0123456789abcdef"
    (board / "results.json").write_text(json.dumps(results))
    outcome = verify_run(board, write=False)
    assert outcome.status == "unverifiable" and "eval_salt" in outcome.reason
    assert "arena evaluate --state" in outcome.reason


# -- what boards show --------------------------------------------------------------------------


def test_the_leaderboard_shows_each_rows_verification(base_run: Path, memrl_run: Path, tmp_path: Path) -> None:
    base, memrl = _copy(base_run, tmp_path / "base"), _copy(memrl_run, tmp_path / "memrl")
    table, = build_tables(load_runs([base, memrl]))
    assert all(row.verification is None for row in table.rows)  # no column where none was checked
    assert "Verified" not in markdown([table], {})
    assert "verification" not in json.dumps(board_json([table]))

    assert verify_run(base).status == "verified"
    table, = build_tables(load_runs([base, memrl]))
    states = {row.method: row.verification["status"] for row in table.rows if row.verification}
    assert states == {"base": "verified", "memrl": "not verified"}
    text = markdown([table], {})
    assert "| Verified |" in text and "arena verify" in text
    rows = {row["method"]: row["verification"] for row in board_json([table])["tables"][0]["rows"]}
    assert rows["base"] == {"status": "verified", "runs": {"base": "verified"}}

    # An unverified run says so; a verification.json of another record is not shown.
    verdict = json.loads((base / VERIFICATION).read_text())
    shutil.rmtree(memrl / "store")
    assert verify_run(memrl).status == "unverifiable"
    table, = build_tables(load_runs([base, memrl]))
    assert {row.method: row.verification["status"] for row in table.rows} == {
        "base": "verified", "memrl": "not verified"}
    (base / VERIFICATION).write_text(json.dumps({**verdict, "record_head": "0" * 64}))
    with pytest.raises(ReportError, match="changed after `arena verify` wrote it"):
        load_run(base)  # the MAC no longer matches: this machine holds the key that signed it


def test_an_unverified_row_is_shown_as_such(base_run: Path, tmp_path: Path) -> None:
    run = _copy(base_run, tmp_path / "base")
    lines = (run / "episodes.jsonl").read_text().splitlines()
    verdict = {"verified": False, "status": "unverified", "reason": "test", "record_head":
               json.loads((run / "results.json").read_text())["record"]["head"]}
    from arena.report.verification import write_verification

    write_verification(run, verdict)
    assert load_run(run).verification_status == "unverified"
    table, = build_tables(load_runs([run]))
    assert table.rows[0].verification == {"status": "unverified", "runs": {"base": "unverified"}}
    assert len(lines) == len((run / "episodes.jsonl").read_text().splitlines())


def test_a_tiny_model_run_in_float32_verifies(tmp_path: Path) -> None:
    """The transformers backend, greedy in float32 on CPU: bit for bit on replay."""
    from arena.testing import TINY_MODEL_OVERRIDES

    run = run_method("base", [*TINY_MODEL_OVERRIDES, "llm.dtype=float32", "eval.limit=2",
                              "eval.max_steps=6"], out=tmp_path / "tiny").path
    outcome = verify_run(run)
    assert outcome.status == "verified", outcome.reason
    assert outcome.replay["dtype"] == "float32"


def test_differences_in_bfloat16_carry_the_dtype_note() -> None:
    from arena.report.verify import dtype_notes

    def results(dtype: str | None) -> Results:
        return made_up_results(provenance={"model": {} if dtype is None else {"dtype": dtype}})

    assert dtype_notes(results("float32"), results("float32")) == []
    assert dtype_notes(results(None), results(None)) == []  # the fake backend
    assert "not bit-reproducible" in dtype_notes(results("bfloat16"), results("bfloat16"))[0]
    assert "llm.dtype=float32" in dtype_notes(results("bfloat16"), results("float32"))[0]
