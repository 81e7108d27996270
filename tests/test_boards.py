"""Every committed board rebuilds from the runs committed beside it (``<board>/runs/*/``).

A board is only worth what can be checked: this rebuilds each ``leaderboards/<name>/`` from its
runs' small files (results.json, episodes.jsonl, config.yaml, state.json, and verification.json
where ``arena verify`` checked the run before it was committed), and its experiments
(``<board>/experiments/*/``: experiment.json and each arm's small files), exactly as
``arena leaderboard`` does (with the ``--control`` rows the board names), and compares the result
with the committed ``leaderboard.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arena.report import build_tables, load_runs
from arena.report.experiments import load_experiment
from arena.report.learning import learning_report
from arena.report.render import board_json

BOARDS = Path(__file__).resolve().parents[1] / "leaderboards"
#: Boards made before their runs were kept; each entry is a debt, removed when its runs land.
WITHOUT_RUNS: dict[str, str] = {}
#: Keys whose values are clocks, not results.
CLOCK_KEYS = frozenset({"started", "finished", "generated", "built"})


def without_clocks(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_clocks(v) for k, v in value.items() if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [without_clocks(v) for v in value]
    return value


#: What a committed run (or an experiment's arm) keeps: its small files (violations.jsonl where
#: the harness recorded a violation: it is part of the record's chain).
SMALL_FILES = {"results.json", "episodes.jsonl", "config.yaml", "state.json", "metrics.jsonl", "verification.json",
               "violations.jsonl"}
#: Row keys Arena added after boards were committed: compared where the committed board has them
#: (`arena leaderboard` writes them when the board is next rebuilt).
ROW_KEYS_ADDED = frozenset({"isolation", "pass_k"})


def without_added_keys(rebuilt: dict[str, Any], committed: dict[str, Any]) -> dict[str, Any]:
    """``rebuilt`` without the row keys of :data:`ROW_KEYS_ADDED` its committed rows lack."""
    for table, old_table in zip(rebuilt.get("tables", []), committed.get("tables", [])):
        for row, old_row in zip(table.get("rows", []), old_table.get("rows", [])):
            for key in ROW_KEYS_ADDED - set(old_row):
                row.pop(key, None)
    return rebuilt


def board_runs(board: Path) -> list[Path]:
    return sorted(path.parent for path in (board / "runs").glob("*/results.json"))


@pytest.mark.parametrize("board", sorted(p.name for p in BOARDS.iterdir() if (p / "leaderboard.json").is_file()))
def test_committed_board_rebuilds_from_its_committed_runs(board: str) -> None:
    folder = BOARDS / board
    runs = board_runs(folder)
    if board in WITHOUT_RUNS:
        assert not runs, f"{board} has runs now: remove it from WITHOUT_RUNS"
        pytest.xfail(f"{board}: {WITHOUT_RUNS[board]}")
    assert runs, f"{folder} has no runs/*/results.json: commit the runs it was built from"
    for run in runs:
        kept = {path.name for path in run.iterdir()}
        assert kept <= SMALL_FILES, (run, kept)
    committed = json.loads((folder / "leaderboard.json").read_text())
    # The experiments the board shows (one still running keeps its finished arms beside them).
    experiments = [folder / "experiments" / shown["folder"] for shown in committed.get("experiments", [])]
    for experiment in experiments:  # each arm's small files, as a run's
        for arm in (p for p in experiment.iterdir() if p.is_dir()):
            assert {path.name for path in arm.iterdir()} <= SMALL_FILES, arm
    tables = build_tables(load_runs(runs))
    # A board built with --control rebuilds with its controls (its learning section).
    learning = learning_report(tables, committed.get("controls", []))
    rebuilt = json.loads(json.dumps(board_json(tables, [load_experiment(path) for path in experiments], learning)))
    for row in (row for table in rebuilt["tables"] for row in table["rows"]):  # as its runs recorded it
        assert row["isolation"]["mode"] in ("process", "in_process", "unknown", "mixed"), row["isolation"]
        assert set(row["isolation"]["runs"]) == set(row["runs"])
    assert without_clocks(without_added_keys(rebuilt, committed)) == without_clocks(committed)


@pytest.mark.parametrize("board", sorted(p.name for p in BOARDS.iterdir() if (p / "base").is_dir()))
def test_a_board_on_a_warm_start_commits_its_base_and_every_run_names_it(board: str) -> None:
    """The committed base/ loads (its adapter matches its manifest), is small enough to carry,
    and is the very base every run of the board served (docs/warmstart.md)."""
    from arena.warmstart.build import load

    base = load(BOARDS / board / "base")
    size = sum(path.stat().st_size for path in (BOARDS / board / "base").rglob("*") if path.is_file())
    assert size <= 25 * 2**20, f"{board}/base is {size / 2**20:.1f} MB; a board carries at most 25 MB"
    for run in board_runs(BOARDS / board):
        results = json.loads((run / "results.json").read_text())
        warm = results["provenance"]["model"].get("warmstart")
        assert warm is not None, f"{run.name} ran without the board's warm start"
        assert warm["adapter_sha256"] == base.manifest["adapter_sha256"], run.name
        assert warm["recipe_sha256"] == base.manifest["recipe_sha256"], run.name


ABLATION = BOARDS / "household-easy-warm" / "ablation"


def test_the_evolving_rl_ablation_page_states_what_its_committed_arms_show() -> None:
    """docs/evolving_rl_ablation.md's figures, recomputed from the arms committed beside the board:
    the three arms win the same tasks (no discordant pair) and each arm's card costs what the
    page says (test_seen 4 against 6, test_unseen 0 against 4 of 16)."""
    from arena.report.compare import compare_runs
    from arena.report.runs import load_run

    arms = {name: load_run(ABLATION / name) for name in ("coevolve", "solver_only", "extractor_only")}
    for other in ("solver_only", "extractor_only"):
        for split in compare_runs(arms["coevolve"], arms[other])["splits"]:
            assert (split["a_only"], split["b_only"], split["pairs"]) == (0, 0, 16), (other, split)
    for arm in arms.values():
        with_card = {s["split"]: s for s in compare_runs(arm, None, "without_skill")["splits"]}
        assert (round(with_card["test_seen"]["success_a"] * 16), round(with_card["test_seen"]["success_b"] * 16)) == (4, 6)
        assert (round(with_card["test_unseen"]["success_a"] * 16), round(with_card["test_unseen"]["success_b"] * 16)) == (0, 4)


TABLES_START, TABLES_END = "<!-- tables: python scripts/evolving_rl_ablation_tables.py ", "<!-- end of tables -->"


def page_tables(text: str) -> list[tuple[list[str], str]]:
    """Each (the script's arguments, the lines pasted below them) of a page's table markers."""
    blocks = []
    for chunk in text.split(TABLES_START)[1:]:
        arguments, rest = chunk.split(" -->\n", 1)
        blocks.append((arguments.split(), rest.split(TABLES_END, 1)[0]))
    return blocks


def test_the_ablation_pages_tables_are_their_arms_own() -> None:
    """Every table an ablation page pastes from scripts/evolving_rl_ablation_tables.py is what the
    script prints now from the committed arms: the usable-card rate per iteration, the with-card /
    without-card pairs, each arm against co-evolution."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ablation_tables", BOARDS.parent / "scripts"
                                                  / "evolving_rl_ablation_tables.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    blocks = page_tables((BOARDS.parent / "docs" / "evolving_rl_ablation.md").read_text())
    assert blocks, "the ablation page pastes no tables"
    for arguments, pasted in blocks:
        assert pasted == script.tables([BOARDS.parent / path for path in arguments]), arguments
    # the check sees a changed figure
    arguments, pasted = blocks[0]
    assert pasted.replace("| 0.625 |", "| 0.5 |") != script.tables([BOARDS.parent / path for path in arguments])


def test_the_medium_board_shows_where_and_at_which_commit_each_phase_of_a_row_ran() -> None:
    """Issue 55's provenance: every row of the medium board names its CPU and instruction set and
    the commit each phase ran at, as its runs recorded them, and its isolation mode."""
    from arena.report.render import provenance_line

    runs = load_runs(board_runs(BOARDS / "household-medium-warm"))
    (table,) = build_tables(runs)
    for row in table.rows:
        line = provenance_line(row)
        sessions = [s for run in row.runs for phase in (run.results.provenance.phases or {}).values() for s in phase]
        assert sessions, row.name
        for session in sessions:
            assert f"{session['cpu']['model']} ({'+'.join(session['cpu']['isa'])})" in line, line
            assert str(session["git_sha"])[:12] in line.split("commits ", 1)[1], line
        assert row.isolation["mode"] == "process", row.name


README = BOARDS.parent / "README.md"
VERDICTS_START, VERDICTS_END = "<!-- The board's verdict table", "<!-- End of the verdicts. -->"


def readme_verdicts(text: str) -> list[str]:
    """The lines the README quotes between its verdict markers (the marker lines themselves out)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(VERDICTS_START))
    end = lines.index(VERDICTS_END, start)
    return [line for line in lines[start + 1:end] if line.strip()]


def test_the_readme_states_every_row_of_the_medium_board_as_the_board_does() -> None:
    """Issue 55's README lines: the medium board's verdict table, one line per learning row (its
    success, and against base, random and its memory reset the difference with its paired
    p-value), rendered from leaderboard.json's verdicts, so a README figure cannot drift from the
    committed episodes that test_committed_board_rebuilds recomputes."""
    from arena.report.learning import Verdict
    from arena.report.render import markdown_table, verdict_columns, verdict_rows

    board = json.loads((BOARDS / "household-medium-warm" / "leaderboard.json").read_text())
    assert board["controls"] == ["base", "random"]
    verdicts = [Verdict.from_json(verdict) for verdict in board["verdicts"]]
    assert verdicts, "the medium board has no learning row yet"
    expected = markdown_table(verdict_columns(verdicts), verdict_rows(verdicts))
    assert len(expected) == 2 + len(verdicts)
    assert readme_verdicts(README.read_text()) == expected
    # and the board's own page shows the same table
    assert "\n".join(expected) in (BOARDS / "household-medium-warm" / "README.md").read_text()


def test_the_readme_verdict_check_sees_a_changed_figure() -> None:
    text = README.read_text()
    quoted = readme_verdicts(text)
    changed = text.replace(quoted[-1], quoted[-1].replace("(p ", "(p 0", 1))
    assert readme_verdicts(changed) != quoted
