"""The board's learning claims: memory resets as rows of their own, pass^k over seeds, and each row
against its controls (`arena leaderboard --control`), paired by task over unequal seed counts."""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from arena.cli import cli
from arena.core.contract.types import EpisodeResult
from arena.report import ReportError, Run, build_tables, load_run, load_runs
from arena.report.aggregate import is_memory_reset, pass_k
from arena.report.compare import compare_runs, compare_split
from arena.report.evaluate_state import EvaluateError, board_overrides, evaluate_state
from arena.report.learning import CONTROL, MEMORY_RESET, VARIANT, compare_tasks, learning_report
from arena.report.render import board_json
from tests.helpers.reports import make_run, report_plugins
from tests.helpers.results import made_up_results

RESET = "eval.experience.source=none"

# -- real runs: a learning row of two seeds, its memory resets, and two controls ------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """scripted (seeds 0 and 1, salt 1: other outcomes than the controls'), the memory reset of
    each (`arena evaluate --state RUN eval.experience.source=none`), base and scripted at salt 0
    (the controls)."""
    root = tmp_path_factory.mktemp("learning")
    plugins = report_plugins()
    made = {f"s{seed}": make_run(plugins, root, f"scripted-seed{seed}", seeds=(seed,), extra=("method.salt=1",))
            for seed in (0, 1)}
    for seed in (0, 1):
        made[f"reset{seed}"], _ = evaluate_state(made[f"s{seed}"], root / f"scripted-none-seed{seed}", [RESET],
                                                 plugins=plugins)
    made["base"] = make_run(plugins, root, "base-seed0", method="base", seeds=(0,))
    return made


def test_a_board_may_reset_the_memory_and_nothing_else_of_the_experience(runs):
    reset = load_run(runs["reset0"])
    assert (reset.results.protocol.experience or {})["source"] == "none" and is_memory_reset(reset)
    assert not is_memory_reset(load_run(runs["s0"]))
    learned = load_run(runs["s0"]).results.state.digest_before_eval
    assert reset.results.provenance.model_extra["evaluated_from"]["digest_before_eval"] == learned
    for refused in ("eval.experience.source=other_type", "eval.experience.poison=0.1"):
        with pytest.raises(EvaluateError, match="not a board's to set"):
            board_overrides([refused])


def test_a_memory_reset_is_a_row_of_its_own_paired_with_the_row_it_reset(runs):
    loaded = load_runs([runs[name] for name in ("s0", "s1", "reset0", "reset1", "base")])
    table, = build_tables(loaded)
    assert table.mixed_fields == [] and "eval.experience.source" not in table.protocol
    rows = {row.name: row for row in table.rows}
    assert set(rows) == {"scripted", "scripted [memory reset]", "base"}
    learned, reset = rows["scripted"], rows["scripted [memory reset]"]
    assert learned.seeds == reset.seeds == [0, 1]  # the resets pool with each other, never with the row
    assert {run.label for run in reset.runs} == {"scripted-none-seed0", "scripted-none-seed1"}
    assert reset.reset_of == sorted(learned.learned_digests) and learned.reset_of is None
    assert reset.protocol["eval.experience.source"] == "none"
    assert reset.to_json()["reset_of"] == reset.reset_of and "reset_of" not in learned.to_json()
    assert not any("memory reset of" in flag for flag in reset.flags)
    learning = learning_report([table], ["base"])
    assert learning is not None
    pairs = sorted({(line.row, line.against, line.kind) for line in learning.comparisons})
    assert pairs == [("scripted", "base", CONTROL), ("scripted", "scripted [memory reset]", MEMORY_RESET),
                     ("scripted", "scripted [without_skill]", VARIANT)]
    for line in learning.comparisons:
        if line.kind == MEMORY_RESET and line.task_type == "all":  # the scripted method ignores its memory
            assert line.result.success_a == line.result.success_b == learned.success(line.split)
            assert line.result.difference == 0.0 and line.result.p_value == 1.0 and line.seeds_b == 2


def test_a_reset_of_a_state_no_row_holds_is_shown_but_compared_with_nothing(runs):
    """Decided: a reset whose learned state is of no row stays on the board (its figures are a
    measurement) with a flag saying it is paired with nothing; it is never compared with a control."""
    table, = build_tables(load_runs([runs["reset0"], runs["base"]]))
    reset = next(row for row in table.rows if row.reset_of is not None)
    assert reset.name == "scripted [memory reset]"
    assert "memory reset of scripted-seed0, whose learned state no row of this table holds: compared with no row" \
        in reset.flags
    learning = learning_report([table], ["base"])
    assert learning is not None and learning.comparisons == []


def test_an_emptied_experience_is_a_reset_only_where_arena_evaluate_made_it(runs):
    """A run with another experience source, or with none but not made by `arena evaluate`, keeps
    its protocol field: refused beside the others unless --allow-mixed."""
    for experience, keep_origin in (({"source": "other_type"}, True), ({"source": "none"}, False)):
        other = load_run(runs["reset0"])
        other.results.protocol.experience = experience
        if not keep_origin:
            del other.results.provenance.model_extra["evaluated_from"]
        with pytest.raises(ReportError, match="eval.experience.source differs"):
            build_tables([load_run(runs["s0"]), other])


# -- pass^k over seeds ----------------------------------------------------------------------------


def _record(task: str, seed: int, success: bool, task_type: str = "t", split: str = "test_seen") -> EpisodeResult:
    return EpisodeResult(phase="evaluate", track="frozen", task_id=task, split=split, task_type=task_type,
                         seed=seed, success=success, reward=float(success), progress=float(success), steps=4,
                         valid_actions=4, status="success" if success else "step_limit", tokens_in=0,
                         tokens_out=0, llm_calls=0, wall_s=0.1, experience_ids=[])


def _run(method: str, seed: int, outcomes: dict[str, bool], types: dict[str, str] | None = None) -> Run:
    """A run of ``method`` at ``seed`` with these test_seen outcomes (task -> success)."""
    records = [_record(task, seed, ok, (types or {}).get(task, "t")) for task, ok in outcomes.items()]
    results = made_up_results(method=method, seeds=[seed], splits={"test_seen": {"n_episodes": len(records)}})
    return Run(path=Path(f"{method}-seed{seed}"), results=results, episodes=records)


def test_pass_k_over_three_seeds_by_hand():
    # a won 3/3, b 2/3, c 0/3: pass^1 = (1 + 2/3 + 0)/3 = 5/9; pass^2 = (1 + C(2,2)/C(3,2) + 0)/3
    # = (1 + 1/3)/3; pass^3 = (1 + 0 + 0)/3
    wins = {"a": (1, 1, 1), "b": (1, 0, 1), "c": (0, 0, 0)}
    seeds = [_run("m", seed, {task: bool(won[seed]) for task, won in wins.items()}) for seed in range(3)]
    table, = build_tables(seeds)
    row, = table.rows
    expected = {"1": round(5 / 9, 4), "2": round((1 + 1 / 3 + 0) / 3, 4), "3": round(1 / 3, 4)}
    assert row.pass_k == {"test_seen": expected} == row.to_json()["pass_k"]
    assert row.pass_k["test_seen"]["1"] == row.success("test_seen")
    one, = build_tables(seeds[:1])[0].rows
    assert one.pass_k == {} and "pass_k" not in one.to_json()  # one seed: no pass^k


def test_pass_k_is_left_out_of_a_split_where_a_task_lacks_a_seed():
    first = _run("m", 0, {"a": True, "b": True})
    second = _run("m", 1, {"a": True})  # task b was not played at seed 1
    reliability, flags = pass_k([first, second])
    assert reliability == {} and flags == ["no pass^k on test_seen: tasks with 1 episodes, not one per seed (2)"]


# -- the paired test over tasks with unequal seed counts -----------------------------------------


def test_one_seed_each_gives_exactly_compare_splits_figures():
    draw = random.Random(7)
    for n in (5, 12, 40):
        outcomes = [(f"t{i:02d}", draw.random() < 0.6, draw.random() < 0.4) for i in range(n)]
        expected = compare_split("test_seen", [(task, 0, a, b) for task, a, b in outcomes])
        got = compare_tasks({task: [a] for task, a, _ in outcomes}, {task: [b] for task, _, b in outcomes})
        assert (got.tasks, got.success_a, got.success_b, got.difference, got.ci95, got.a_better,
                got.b_better, got.p_value) == (expected.tasks, expected.success_a, expected.success_b,
                                               expected.difference, expected.ci95, expected.a_only,
                                               expected.b_only, expected.p_value)


def test_three_seeds_against_one_by_hand():
    # t1: A 3/3, B 1/1 won -> no, B 0/1: d = 1*3 - 3*0 = 3; t2: A 1/3, B 1/1: d = 1 - 3 = -2;
    # t3: A 0/3, B 0/1: 0; t4: A 2/3, B 0/1: d = 2. Difference = mean(1, -2/3, 0, 2/3) = 0.25.
    # Sign flips of (3, 2, 2): 7, 3, 3, -1, 1, -3, -3, -7; six of eight reach |3|: p = 0.75.
    a = {"t1": [True] * 3, "t2": [True, False, False], "t3": [False] * 3, "t4": [True, True, False]}
    b = {"t1": [False], "t2": [True], "t3": [False], "t4": [False]}
    result = compare_tasks(a, b)
    assert (result.tasks, result.episodes_a, result.episodes_b) == (4, 12, 4)
    assert (result.success_a, result.success_b, result.difference) == (0.5, 0.25, 0.25)
    assert (result.a_better, result.b_better, result.p_value) == (2, 1, 0.75)
    assert result.ci95[0] <= 0.25 <= result.ci95[1] and result.ci95[0] < result.ci95[1]


def test_rows_of_unequal_seeds_are_compared_per_split_and_task_type():
    types = {"t1": "x", "t2": "x", "t3": "y", "t4": "y"}
    learned = [_run("learner", seed, {"t1": True, "t2": seed == 0, "t3": False, "t4": seed < 2}, types)
               for seed in range(3)]
    base = _run("base", 0, {"t1": False, "t2": True, "t3": False, "t4": False}, types)
    table, = build_tables([*learned, base])
    learning = learning_report([table], ["base"])
    assert learning is not None
    lines = {line.task_type: line for line in learning.comparisons}
    assert set(lines) == {"all", "x", "y"} and all(line.row == "learner" for line in lines.values())
    assert (lines["all"].seeds_a, lines["all"].seeds_b, lines["all"].result.difference) == (3, 1, 0.25)
    # x: t1 (1 - 0) and t2 (1/3 - 1): mean 1/6; y: t3 (0) and t4 (2/3): mean 1/3
    assert (lines["x"].result.difference, lines["y"].result.difference) == (round(1 / 6, 4), round(1 / 3, 4))
    assert lines["all"].result.p_value == 0.75 and 0 < lines["x"].result.p_value <= 1


def test_rows_that_played_other_tasks_are_refused():
    table, = build_tables([_run("learner", 0, {"t1": True, "t2": False}), _run("base", 0, {"t1": True, "t3": False})],
                          allow_mixed=True)
    with pytest.raises(ReportError, match=r"(?s)did not play the same test tasks.*test_seen: base did not play 1 "
                                          r"task\(s\) learner played \(e.g. t2\)"):
        learning_report([table], ["base"])


def test_an_unknown_control_is_refused_with_a_suggestion():
    table, = build_tables([_run("learner", 0, {"t1": True}), _run("base", 0, {"t1": False})])
    with pytest.raises(ReportError, match=r"Unknown control row of the e table 'bsae'. Did you mean 'base'\? "
                                          r"Available: base, learner"):
        learning_report([table], ["bsae"])
    assert learning_report([table], []) is None  # no controls: no section


# -- the CLI writes the section; a board built with controls rebuilds ----------------------------


def test_a_row_is_paired_with_the_variant_it_played_of_every_test_episode(runs):
    """The with-card / without-card pairs of Evolving-RL, for any method that plays a variant: with
    one seed, the figures of `arena compare RUN --variant without_skill`."""
    table, = build_tables(load_runs([runs["s0"], runs["base"]]))
    learning = learning_report([table], ["base"])
    assert learning is not None
    lines = {line.split: line for line in learning.comparisons if line.kind == VARIANT and line.task_type == "all"}
    expected = {s["split"]: s for s in compare_runs(load_run(runs["s0"]), None, "without_skill")["splits"]}
    assert set(lines) == set(expected) == {"test_seen", "test_unseen"}
    for split, line in lines.items():
        assert line.against == "scripted [without_skill]" and line.row == "scripted"
        want = expected[split]
        assert (line.result.success_a, line.result.success_b, line.result.a_better, line.result.b_better,
                line.result.p_value) == (want["success_a"], want["success_b"], want["a_only"], want["b_only"],
                                         want["p_value"])
    assert all("without_skill" not in claim for verdict in learning.verdicts for claim in verdict.claims)


# -- verdicts: the sentence a README quotes -------------------------------------------------------


def _verdicts(table, controls):
    learning = learning_report([table], controls)
    assert learning is not None
    return learning.verdicts


def test_a_verdict_states_each_control_and_waits_for_three_seeds_before_a_claim():
    # 8 tasks: the learner wins all, base none (p = 2/256), random wins the same as the learner.
    tasks = [f"t{i}" for i in range(8)]
    base = _run("base", 0, dict.fromkeys(tasks, False))
    chance = _run("random", 0, dict.fromkeys(tasks, True))
    one_seed = _run("learner", 0, dict.fromkeys(tasks, True))
    table, = build_tables([one_seed, base, chance])
    learning = learning_report([table], ["base", "random"])
    assert learning is not None
    verdict, = learning.verdicts
    assert verdict.text == ("learner (1 seed): test_seen 100.0 %, above base (+100.0 points, p = 0.0078), "
                            "not separated from random (p = 1). Not yet a claim: 3 learning seeds are needed, "
                            "1 has run.")
    assert (verdict.claims, verdict.seeds_needed) == (["test_seen: above base (+100.0 points, p = 0.0078)"], 2)

    three = [_run("learner", seed, dict.fromkeys(tasks, True)) for seed in range(3)]
    table, = build_tables([*three, base, chance])
    verdict, = _verdicts(table, ["base", "random"])
    assert verdict.seeds_needed == 0 and verdict.text.startswith("learner (3 seeds): test_seen 100.0 %, above base")
    assert "Not yet a claim" not in verdict.text

    level = _run("learner", 0, dict.fromkeys(tasks, False))
    table, = build_tables([level, base])
    verdict, = _verdicts(table, ["base"])
    assert verdict.text == "learner (1 seed): test_seen 0.0 %, not separated from base (p = 1)."
    assert (verdict.claims, verdict.seeds_needed) == ([], 0)  # no claim: nothing to wait for


def test_the_verdict_table_shows_each_sentences_figures_and_marks_only_claims():
    """The README quotes the verdicts as a table (a line per row): each cell is a clause of the
    sentence, a claim marked by its side, a comparison the row lacks shown as '-'; a verdict read
    back from leaderboard.json renders the same table."""
    from arena.report.learning import Verdict
    from arena.report.render import verdict_columns, verdict_rows

    tasks = [f"t{i}" for i in range(8)]
    base = _run("base", 0, dict.fromkeys(tasks, False))
    chance = _run("random", 0, dict.fromkeys(tasks, True))
    learner = _run("learner", 0, dict.fromkeys(tasks, True))
    loser = _run("loser", 0, dict.fromkeys(tasks, False))
    table, = build_tables([learner, loser, base, chance])
    verdicts = _verdicts(table, ["base", "random"])
    assert verdict_columns(verdicts) == ["Row", "Seeds", "test_seen", "vs base", "vs random"]
    rows = {cells[0]: cells for cells in verdict_rows(verdicts)}
    assert rows["learner"] == ["learner", "1 of 3", "100.0 %", "▲ +100.0 (p 0.0078)", "+0.0 (p 1)"]
    assert rows["loser"] == ["loser", "1 of 3", "0.0 %", "+0.0 (p 1)", "▼ -100.0 (p 0.0078)"]
    back = [Verdict.from_json(json.loads(json.dumps(asdict(v)))) for v in verdicts]
    assert back == verdicts and verdict_rows(back) == verdict_rows(verdicts)

    level = _run("level", 0, dict.fromkeys(tasks, False))
    table, = build_tables([level, base])
    verdict, = _verdicts(table, ["base"])
    assert verdict_rows([verdict]) == [["level", "1", "0.0 %", "+0.0 (p 1)"]]  # no claim: no seeds to wait for


def _markdown_rows(text: str, first_column: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_column} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])])
    return rows


def test_the_cli_writes_the_learning_section_and_the_board_rebuilds(runs, tmp_path):
    out = tmp_path / "board"
    given = [str(runs[name]) for name in ("s0", "s1", "reset0", "reset1", "base")]
    result = CliRunner().invoke(cli, ["leaderboard", *given, "--out", str(out), "--control", "base"])
    assert result.exit_code == 0, result.output
    text = (out / "README.md").read_text()
    assert "### Learning: each row against its controls" in text
    lines = _markdown_rows(text, "Method | Against")
    assert {(cells[0], cells[1], cells[2]) for cells in lines} == {
        (row, against, split) for row, against in (("scripted", "base"), ("scripted", "scripted [memory reset]"),
                                                   ("scripted", "scripted [without_skill]"))
        for split in ("test_seen", "test_unseen")}
    board = json.loads((out / "leaderboard.json").read_text())
    assert board["controls"] == ["base"]
    verdict, = board["verdicts"]
    assert verdict["row"] == "scripted" and verdict["seeds"] == 2
    shown, = _markdown_rows(text, "Row | Seeds")  # the verdict table: the verdict's figures
    reset = next(s for s in verdict["standings"] if s["split"] == "test_seen" and s["against"] == "memory reset")
    assert shown[0] == "scripted" and f"{reset['difference'] * 100:+.1f} (p {reset['p_value']:.2g})" in shown
    assert "not separated from its memory reset (p = 1)" in verdict["text"]  # it ignores its memory
    assert verdict["text"] in " ".join(result.output.split())  # and on the console
    seen = next(c for c in board["comparisons"] if c["against"] == "base" and c["split"] == "test_seen"
                and c["task_type"] == "all")
    row = next(cells for cells in lines if cells[1] == "base" and cells[2] == "test_seen")
    assert row[3] == f"{100 * seen['success_a']:.1f} % / {100 * seen['success_b']:.1f} %"
    assert row[5] == f"{seen['a_better']} / {seen['b_better']}" and row[6] == f"{seen['p_value']:.3g}"
    assert seen["success_b"] == 0.0 and seen["a_better"] > 0 and seen["p_value"] < 0.05  # base never wins
    per_type = [c for c in board["comparisons"] if c["task_type"] != "all"]
    assert per_type and "<summary>per task type</summary>" in text
    # pass^k of the two-seed rows, in README.md and in leaderboard.json
    reliability = _markdown_rows(text, "Method | Model | Seeds")
    assert [cells[0] for cells in reliability] == [r["method"] + (" [memory reset]" if "reset_of" in r else "")
                                                    for r in board["tables"][0]["rows"] if "pass_k" in r]
    page = (out / "index.html").read_text()
    assert "Learning: each row against its controls" in page and "Reliability over seeds" in page
    # rebuilt as tests/test_boards.py rebuilds a committed board: with the controls it names
    tables = build_tables(load_runs(given))
    assert json.loads(json.dumps(board_json(tables, [], learning_report(tables, board.get("controls", []))))) == board

    plain = CliRunner().invoke(cli, ["leaderboard", *given, "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    assert not {"controls", "comparisons", "verdicts"} & set(json.loads((tmp_path / "plain" / "leaderboard.json").read_text()))
    assert "Learning: each row" not in (tmp_path / "plain" / "README.md").read_text()

    wrong = CliRunner().invoke(cli, ["leaderboard", *given, "--out", str(tmp_path / "wrong"), "--control", "bas"])
    assert wrong.exit_code != 0 and "Did you mean 'base'?" in wrong.output and not (tmp_path / "wrong").exists()


def test_a_reset_run_copied_elsewhere_still_pairs_by_its_digest(runs, tmp_path):
    """The pairing is by the learned state's digest, not by where the run lay when it was reset."""
    moved = tmp_path / "elsewhere"
    shutil.copytree(runs["reset0"], moved)
    table, = build_tables(load_runs([runs["s0"], moved, runs["base"]]))
    learning = learning_report([table], ["base"])
    assert learning is not None and any(line.kind == MEMORY_RESET for line in learning.comparisons)
