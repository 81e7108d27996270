"""`arena leaderboard`: aggregation and intervals, protocol checks, Markdown, and the HTML page in
headless Chromium. Runs are produced by the real protocol (fake LLM), so the schema is the real one."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import arena
from arena.cli import cli
from arena.core.contract.types import EpisodeResult
from arena.report import ReportError, Run, build_tables, load_run, load_runs, write_board
from arena.report.aggregate import pooled_splits, row_cost
from arena.report.render import main_columns, protocol_line, run_isolation
from tests.helpers.browser import find_chromium, headless_page
from tests.helpers.reports import make_run, report_plugins, scripted_success
from tests.helpers.results import made_up_results

# -- real runs of the scripted method (tests.helpers.reports): known successes -------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real runs shared by the tests of this module (about a second each)."""
    root = tmp_path_factory.mktemp("runs")
    plugins = report_plugins()
    return {
        "s0": make_run(plugins, root, "scripted-s0", seeds=(0,)),
        "s1": make_run(plugins, root, "scripted-s1", seeds=(1,)),
        "s01": make_run(plugins, root, "scripted-s01", seeds=(0, 1)),
        "base": make_run(plugins, root, "base-s0", method="base", seeds=(0,)),
        "steps8": make_run(plugins, root, "base-steps8", method="base", extra=("eval.max_steps=8",)),
        "limited": make_run(plugins, root, "base-limited", method="base", extra=("eval.limit=4",)),
        "ntest8": make_run(plugins, root, "base-ntest8", method="base", extra=("env.n_test=8",)),
        "online": make_run(plugins, root, "base-online", method="base", extra=("run.track=online",)),
        "easy": make_run(plugins, root, "base-easy", method="base", extra=("env.level=easy",)),
        "pool": make_run(plugins, root, "base-pool", method="base", extra=("eval.source_pool=all_types",)),
    }


# -- aggregation and interval math, by hand ------------------------------------------------------


def _record(task: str, seed: int, success: bool, task_type: str = "t", split: str = "test_seen",
            variant: str = "default") -> EpisodeResult:
    return EpisodeResult(phase="evaluate", track="frozen", task_id=task, split=split, task_type=task_type,
                         seed=seed, success=success, reward=float(success), progress=1.0 if success else 0.5,
                         steps=4, valid_actions=3, status="success" if success else "step_limit",
                         tokens_in=10, tokens_out=1, llm_calls=4, wall_s=0.1, experience_ids=[],
                         variant=variant)


def _constructed_run(label: str, seed: int, outcomes: dict[str, bool], learn_tokens: int) -> Run:
    records = [_record(task, seed, ok, task_type="x" if task == "c" else "ab")
               for task, ok in outcomes.items()]
    phase = {"episodes": 0, "env_steps": 0, "tokens_in": learn_tokens, "tokens_out": 0, "wall_s": 3600.0}
    results = made_up_results(
        seeds=[seed], splits={"test_seen": {"n_episodes": len(records)}},
        learn={"used": {"gradient_steps": 0}},
        cost={"learn": phase, "evaluate": {**phase, "episodes": len(records), "tokens_in": 0}},
        state={"memory_items": 10 * (seed + 1)}, provenance={"model": {"id": "fake"}})
    return Run(path=Path(label), results=results, episodes=records)


def test_pooled_seeds_interval_by_hand():
    # Tasks a, b, c over seeds 0 and 1: a 1/1, b 1/0, c 0/0. Per-task means 1, 0.5, 0: 1.5 of n=3
    # tasks, p = 0.5. Wilson, z = 1.959964 (z^2 = 3.841459): denominator 1 + z^2/3 = 2.280486,
    # centre (0.5 + z^2/6) / 2.280486 = 0.5, half z*sqrt(0.25/3 + z^2/36) / 2.280486
    # = 1.959964 * 0.435939 / 2.280486 = 0.374669 -> [0.1253, 0.8747].
    runs = [_constructed_run("r0", 0, {"a": True, "b": True, "c": False}, learn_tokens=100),
            _constructed_run("r1", 1, {"a": True, "b": False, "c": False}, learn_tokens=300)]
    pooled = pooled_splits(runs)["test_seen"]
    assert (pooled["n_tasks"], pooled["n_episodes"], pooled["success_rate"]) == (3, 6, 0.5)
    assert pooled["ci95"] == [0.1253, 0.8747]
    # type "ab" (tasks a, b): means 1 and 0.5 -> p = 0.75, n = 2: denominator 1 + z^2/2 = 2.920730,
    # centre (0.75 + z^2/4)/2.920730 = 0.585596, half z*sqrt(0.1875/2 + z^2/16)/2.920730
    # = 1.959964 * 0.577790 / 2.920730 = 0.387727 -> [0.1979, 0.9733]
    assert pooled["by_task_type"]["ab"]["success_rate"] == pytest.approx(0.75)
    assert pooled["by_task_type"]["ab"]["ci95"] == [0.1979, 0.9733]
    assert pooled["by_task_type"]["x"]["success_rate"] == 0.0
    # progress: 3 successes (1.0) and 3 failures (0.5) -> 0.75; valid actions 18 of 24 steps
    assert pooled["progress_rate"] == 0.75 and pooled["valid_action_rate"] == 0.75
    cost = row_cost(runs)  # one run's cost: the mean over the pooled runs
    assert cost["learn_tokens"] == 200 and cost["learn_hours"] == 1.0 and cost["memory_items"] == 15


def test_pooling_two_runs_equals_one_run_with_both_seeds(runs):
    table, = build_tables(load_runs([runs["s0"], runs["s1"]]))
    row, = table.rows
    assert row.seeds == [0, 1] and [r.label for r in row.runs] == ["scripted-s0", "scripted-s1"]
    both = json.loads((runs["s01"] / "results.json").read_text())
    for split, summary in both["splits"].items():
        expected = {k: v for k, v in summary.items() if k != "variants"}
        assert row.splits[split] == expected
        assert row.variants[split]["without_skill"] == summary["variants"]["without_skill"]
        assert row.splits[split]["n_episodes"] == 2 * row.splits[split]["n_tasks"]
    # the outcomes are the scripted ones, so the pooled rate is checkable from the rule itself
    records = [r for r in load_run(runs["s01"]).evaluated() if r.split == "test_seen"]
    assert row.splits["test_seen"]["success_rate"] == pytest.approx(
        sum(scripted_success(r.task_id, r.seed) for r in records) / len(records), abs=1e-4)


def test_row_cost_flags_provenance_and_curves(runs):
    run = load_run(runs["s0"])
    table, = build_tables([run])
    row, = table.rows
    results = run.results
    written = json.loads((runs["s0"] / "results.json").read_text())["splits"]["test_seen"]
    assert row.splits["test_seen"] == {k: v for k, v in written.items() if k != "variants"}
    assert row.cost["learn_episodes"] == 4 == results.cost.learn.episodes
    assert row.cost["device"] == "CPU"
    helpers = sum(results.splits[s].variants["without_skill"].n_episodes for s in results.splits)
    assert helpers > 0 and row.cost["extra_test_episodes"] == helpers
    assert f"test-time extra episodes: {helpers} (without_skill)" in row.flags
    assert row.provenance["seeds"] == [0]
    assert row.provenance["weights_sha256"] == [results.provenance.model["weights_sha256"][:12]]
    assert row.provenance["git_sha"][0][:12] == str(results.provenance.git_sha)[:12]
    curve = row.learning_curves["scripted-s0"]["scripted: success"]
    assert [point[0] for point in curve] == [0, 1, 2, 3] and "scripted: time/x_s" not in row.learning_curves


def test_invalid_runs_flagged_and_ranked_last(runs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(runs["s0"], broken)
    results = json.loads((broken / "results.json").read_text())
    results.update(valid=False, violations=["played a test task while learning"], method="cheater")
    (broken / "results.json").write_text(json.dumps(results))
    table, = build_tables(load_runs([runs["base"], broken]))
    assert [row.method for row in table.rows] == ["base", "cheater"]  # cheater scores more, still last
    assert table.rows[1].flags[-1].startswith("INVALID broken: played a test task")


def test_core_never_imports_the_report_package():
    core = Path(arena.__file__).parent / "core"
    importers = [path.name for path in core.rglob("*.py") if "arena.report" in path.read_text()]
    assert importers == []


# -- refusing mixed protocols ---------------------------------------------------------------------


@pytest.mark.parametrize("other, field", [
    ("steps8", "eval.max_steps"),
    ("limited", "limited"),
    ("ntest8", "split_hashes.test_seen"),
    ("online", "track"),
    ("easy", "env.level"),
    ("pool", "eval.source_pool"),
])
def test_refuses_mixed_protocols_naming_the_field(runs, other, field):
    loaded = load_runs([runs["base"], runs[other]])
    with pytest.raises(ReportError, match=rf"{field} differs: .* in base-s0; .* in base-{other}") as error:
        build_tables(loaded)
    assert "--allow-mixed" in str(error.value)
    table, = build_tables(loaded, allow_mixed=True)
    assert field in table.mixed_fields and len(table.rows) == 2  # one row per protocol, flagged
    assert all(any(flag.startswith(f"mixed: {field}=") for flag in row.flags) for row in table.rows)


def test_runs_of_either_results_schema_share_a_table(runs, tmp_path):
    # A schema version names a file format, not a protocol: version 2 changed no figure.
    older = tmp_path / "scripted-s1"
    shutil.copytree(runs["s1"], older)
    results = json.loads((older / "results.json").read_text())
    results["schema_version"] = 1
    (older / "results.json").write_text(json.dumps(results))
    table, = build_tables(load_runs([runs["s0"], older]))
    assert table.mixed_fields == [] and [row.seeds for row in table.rows] == [[0, 1]]


def test_cli_refuses_mixed_runs_and_repeated_seeds(runs, tmp_path):
    result = CliRunner().invoke(cli, ["leaderboard", str(runs["base"]), str(runs["steps8"]),
                                      "--out", str(tmp_path / "b")])
    assert result.exit_code != 0 and "eval.max_steps differs" in result.output
    assert not (tmp_path / "b").exists()
    with pytest.raises(ReportError, match="Seed 0 of row 'scripted / arena/fake' is in both scripted-s0 and scripted-s01"):
        build_tables(load_runs([runs["s0"], runs["s01"]]))


# -- Markdown -------------------------------------------------------------------------------------


def _markdown_rows(text: str, first_column: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_column} |"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])])
    return rows


def test_markdown_table(runs, tmp_path):
    out = tmp_path / "board"
    result = CliRunner().invoke(cli, ["leaderboard", str(runs["base"]), str(runs["s0"]), str(runs["s1"]),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "README.md").read_text()
    header, rule, *body = _markdown_rows(text, "#")
    assert header[:7] == ["#", "Method", "Model", "Track", "Seeds", "test_seen success [95 % CI]",
                          "test_unseen success [95 % CI]"]
    assert set(rule) == {"---"} and len(body) == 2 and all(len(cells) == len(header) for cells in body)
    assert [cells[1] for cells in body] == ["scripted", "base"]  # sorted by success, best first
    board = json.loads((out / "leaderboard.json").read_text())
    scripted = board["tables"][0]["rows"][0]
    low, high = scripted["splits"]["test_seen"]["ci95"]
    assert body[0][:5] == ["1", "scripted", "arena/fake", "frozen", "0, 1"]
    assert body[0][5] == f"{100 * scripted['splits']['test_seen']['success_rate']:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"
    assert body[1][5] == "0.0 % [0.0, 24.2]"  # base never wins; Wilson upper bound with n = 12
    assert "test-time extra episodes" in body[0][-1] and body[1][-1] == "-"
    assert text.count("<details>") == 2 and "test_unseen: success per task type" in text
    assert "pick_two_obj_and_place" in _markdown_rows(text.split("test_unseen: success per task type")[1], "Method")[0]
    assert f"weights {scripted['provenance']['weights_sha256'][0]}; dtype not recorded)" in text  # the fake model
    for plot in ("household-success-vs-cost", "household-task-types", "household-learning-curves"):
        assert f"(plots/{plot}.png)" in text and (out / "plots" / f"{plot}.png").read_bytes()[:4] == b"\x89PNG"

    cheapest = CliRunner().invoke(cli, ["leaderboard", str(runs["base"]), str(runs["s0"]),
                                        "--out", str(tmp_path / "c"), "--sort", "learn_cost"])
    assert cheapest.exit_code == 0
    assert [c[1] for c in _markdown_rows((tmp_path / "c" / "README.md").read_text(), "#")[2:]] == ["base", "scripted"]


def test_board_is_reproducible(runs, tmp_path):
    for name in ("a", "b"):
        write_board(build_tables(load_runs([runs["base"], runs["s0"]])), tmp_path / name)
    for file in ("README.md", "index.html", "leaderboard.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file


# -- the HTML page in headless Chromium -----------------------------------------------------------


PAGE_FACTS = """JSON.stringify({
  tables: document.querySelectorAll('table').length,
  mainRows: document.querySelector('table').tBodies[0].rows.length,
  headers: Array.from(document.querySelector('table').tHead.rows[0].cells).map(c => c.textContent),
  firstCells: Array.from(document.querySelector('table').tBodies[0].rows).map(r => r.cells[1].textContent),
  details: document.querySelectorAll('details').length,
  images: Array.from(document.images).map(i => ({ok: i.complete && i.naturalWidth > 100, src: i.src.slice(0, 22)})),
  width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
  framed: Array.from(document.querySelectorAll('table')).every(
    t => t.parentElement.classList.contains('scroll') && t.parentElement.clientWidth <= window.innerWidth)
})"""


def test_html_page_renders_in_headless_chromium(runs, tmp_path):
    browser = find_chromium()
    if browser is None:
        pytest.skip("Debian's chromium is not installed (CI set-up: apt-get install -y chromium)")
    out = tmp_path / "board"
    write_board(build_tables(load_runs([runs["base"], runs["s0"], runs["s1"]])), out)
    page = (out / "index.html").read_text()
    assert "http://" not in page and "https://" not in page and "<link" not in page
    artifacts = Path(os.environ.get("ARENA_TEST_ARTIFACTS", tmp_path / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    with headless_page(browser, tmp_path / "profile") as (devtools, session):
        devtools.call("Page.navigate", {"url": (out / "index.html").resolve().as_uri()}, session=session)
        devtools.wait_for("Page.loadEventFired")
        devtools.call("Runtime.evaluate", {"expression": "document.querySelectorAll('details').forEach(d => d.open = true)"},
                      session=session)
        facts = json.loads(devtools.call("Runtime.evaluate", {"expression": PAGE_FACTS, "returnByValue": True},
                                         session=session)["result"]["value"])
        shot = devtools.call("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": facts["width"], "height": facts["height"], "scale": 1}},
            session=session)
        screenshot = artifacts / "leaderboard.png"
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        devtools.call("Runtime.evaluate", {"expression": "1"}, session=session)  # drain late events
    events = devtools.events
    errors = [e["params"] for e in events if e.get("method") == "Runtime.exceptionThrown"
              or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
              or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert errors == [], errors
    requests = [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]
    assert [url for url in requests if not url.startswith(("file:", "data:"))] == []
    # the main table, reliability over seeds (scripted pools two), its breakdown, one per-task-type table per split
    assert facts["tables"] == 1 + 1 + 1 + 2
    assert facts["mainRows"] == 2 and facts["firstCells"] == ["scripted", "base"]
    assert facts["headers"][5] == "test_seen success [95 % CI]"
    assert facts["details"] >= 3
    assert len(facts["images"]) == 3 and all(i["ok"] and i["src"] == "data:image/png;base64," for i in facts["images"])
    # A wide table scrolls inside its frame; the page itself never needs a horizontal scrollbar.
    assert facts["framed"] and facts["width"] <= 1400, facts["width"]
    assert screenshot.read_bytes()[:4] == b"\x89PNG" and screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


#: What the filter test reads of the page: each table's shown rows (every cell's text).
SHOWN_ROWS = """JSON.stringify({
  main: Array.from(document.querySelector('table').tBodies[0].rows).filter(r => !r.hidden)
    .map(r => Array.from(r.cells).map(c => c.textContent)),
  lines: Array.from(document.querySelector('table.breakdown').tBodies[0].rows).filter(r => !r.hidden)
    .map(r => Array.from(r.cells).map(c => c.textContent)),
  hiddenHeaders: Array.from(document.querySelector('table').tHead.rows[0].cells).filter(c => c.hidden)
    .map(c => c.textContent),
  counted: document.querySelector('form.filters output').textContent,
  options: Object.fromEntries(Array.from(document.querySelectorAll('form.filters select'))
    .map(s => [s.name, Array.from(s.options).map(o => o.value)]))
})"""


def _choose(devtools, session, filters: dict[str, str]) -> dict:
    """Set the page's filters as a reader would (select, then a change event) and read it."""
    script = "".join(f"document.querySelector('form.filters select[name={name}]').value = {json.dumps(value)};"
                     for name, value in filters.items())
    script += "document.querySelector('form.filters').dispatchEvent(new Event('change'));"
    devtools.call("Runtime.evaluate", {"expression": script}, session=session)
    return json.loads(devtools.call("Runtime.evaluate", {"expression": SHOWN_ROWS, "returnByValue": True},
                                    session=session)["result"]["value"])


def _click_header(devtools, session, table: str, column: str) -> None:
    devtools.call("Runtime.evaluate", {"expression": (
        f"Array.from(document.querySelector({json.dumps(table)}).tHead.rows[0].cells)"
        f".find(c => c.textContent.startsWith({json.dumps(column)})).click()")}, session=session)


def test_the_board_page_filters_and_sorts_in_headless_chromium(runs, tmp_path):
    """A reader filters the static page by split, task type, level, seed and isolation and sorts
    by a column; what shows is what the runs' episodes say."""
    browser = find_chromium()
    if browser is None:
        pytest.skip("Debian's chromium is not installed (CI set-up: apt-get install -y chromium)")
    isolated_run = make_run(report_plugins(), tmp_path, "base-isolated", method="base", seeds=(1,),
                            extra=("run.isolation=process",))
    chosen = [load_run(path) for path in (runs["base"], runs["s01"], runs["easy"], isolated_run)]
    out = tmp_path / "board"
    [table] = build_tables(chosen, allow_mixed=True)
    write_board([table], out)
    # The expected lines, from the episodes themselves: (method, split, task type, level, seed).
    expected: dict[tuple[str, str, str, str, int], list] = {}
    for run in chosen:
        level = str(run.results.protocol.env.get("level", "-"))
        for episode in run.evaluated():
            for task_type in ("(all types)", episode.task_type):
                expected.setdefault((run.method, episode.split, task_type, level, episode.seed), []).append(episode)
    levels = sorted({key[3] for key in expected})
    assert len(levels) == 2, levels  # the easy run and the others: two levels to filter by
    with headless_page(browser, tmp_path / "profile") as (devtools, session):
        devtools.call("Page.navigate", {"url": (out / "index.html").resolve().as_uri()}, session=session)
        devtools.wait_for("Page.loadEventFired")
        every = _choose(devtools, session, {"type": ""})
        assert len(every["lines"]) == len(expected) and every["counted"].startswith(f"{len(expected)} of ")
        assert set(every["options"]["level"]) == {"", *levels}
        assert set(every["options"]["isolation"]) == {"", *(run_isolation(run) for run in chosen)}
        assert every["options"]["seed"] == ["", "0", "1"]
        # One split, one task type, one level, seed 1: exactly the episodes that match, each line's
        # success their share solved; the rows above keep only a row with that level and seed.
        _, split, task_type, level, _ = max(key for key in expected if key[4] == 1 and key[2] != "(all types)")
        narrowed = _choose(devtools, session, {"split": split, "type": task_type, "level": level, "seed": "1"})
        want = {key: episodes for key, episodes in expected.items() if key[1:] == (split, task_type, level, 1)}
        assert want and narrowed["main"], (want, narrowed)
        assert sorted((line[0], line[8]) for line in narrowed["lines"]) == sorted(
            (key[0], f"{100 * sum(e.success for e in episodes) / len(episodes):.1f} %") for key, episodes in want.items())
        assert sorted(row[1] for row in narrowed["main"]) == sorted(
            row.name for row in table.rows if 1 in row.seeds
            and level in {str(run.results.protocol.env.get("level", "-")) for run in row.runs})
        assert narrowed["hiddenHeaders"] == [f"{other} success [95 % CI]" for other in table.splits if other != split]
        # Isolation: only the lines of the run made with run.isolation=process, and its row.
        isolated = _choose(devtools, session, {"split": "", "type": "", "level": "", "seed": "", "isolation": "process"})
        assert len(isolated["lines"]) == sum(1 for key in expected if key[0] == "base" and key[4] == 1
                                             and key[3] == str(chosen[3].results.protocol.env.get("level", "-")))
        assert [row[1] for row in isolated["main"]] == [row.name for row in table.rows if chosen[3] in row.runs]
        # Sorting: by success, up then down; the lines stay filtered while they move.
        shown = _choose(devtools, session, {"isolation": "", "type": "(all types)"})
        for order in ("up", "down"):
            _click_header(devtools, session, "table.breakdown", "Success")
            shown = _choose(devtools, session, {})
            values = [float(line[8].rstrip(" %")) for line in shown["lines"]]
            assert values == sorted(values, reverse=order == "down") and len(set(values)) > 1, values
        assert all(line[3] == "(all types)" for line in shown["lines"])
        _click_header(devtools, session, "table", "Learn tokens")
        column = main_columns(table).index("Learn tokens")
        tokens = [row[column] for row in _choose(devtools, session, {})["main"]]
        assert [_tokens(t) for t in tokens] == sorted(_tokens(t) for t in tokens), tokens
    errors = [e["params"] for e in devtools.events if e.get("method") == "Runtime.exceptionThrown"]
    assert errors == [], errors


def _tokens(cell: str) -> float:
    """A count as the board writes it (1.5k, 2.0M) back to a number."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(cell[-1:], 1)
    return float(cell.rstrip("kMG")) * scale


def test_plot_labels_of_equal_points_do_not_overlap():
    """Every method at 0 % with similar costs is the common case; their labels must stay legible."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    from arena.report.plots import _annotate_apart

    figure = Figure(figsize=(7.5, 4.2))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    points = [(name, x, 0.0) for name, x in
              [("expel", 2.0e5), ("memrl", 2.1e5), ("skillrl", 2.0e5), ("rag", 1.9e5), ("grpo", 1.0e5),
               ("evolving_rl", 4.2e4), ("base", 0.0)]]
    axes.plot([p[1] for p in points], [p[2] for p in points], "o")
    axes.set_xscale("symlog", linthresh=1000)
    axes.set_ylim(-0.02, 1.02)
    _annotate_apart(axes, points)
    renderer = figure.canvas.get_renderer()
    assert sorted(text.get_text() for text in axes.texts) == sorted(p[0] for p in points)
    box = {text: Text.get_window_extent(text, renderer) for text in axes.texts}  # without leader lines
    overlapping = [(a, b) for i, a in enumerate(axes.texts) for b in axes.texts[i + 1:]
                   if box[a].overlaps(box[b])]
    assert not overlapping, [(a.get_text(), b.get_text()) for a, b in overlapping]


def test_only_seeds_and_where_episodes_ran_may_differ_within_a_row():
    from arena.report.aggregate import _check_poolable

    local = _constructed_run("local", 0, {"a": True}, learn_tokens=10)
    on_ray = _constructed_run("ray", 1, {"a": True}, learn_tokens=10)
    local.results.provenance.config = {
        "learn": {"seed": 0}, "executor": {"name": "local"}, "solver": {"history": 2}}
    on_ray.results.provenance.config = {
        "learn": {"seed": 1}, "executor": {"name": "ray", "ray": {"num_cpus": 2}}, "solver": {"history": 2}}
    _check_poolable([local, on_ray], "m")  # executor.* changes no result: one row
    on_ray.results.provenance.config["solver"]["history"] = 3
    with pytest.raises(ReportError, match="differ in config solver.history"):
        _check_poolable([local, on_ray], "m")


def test_runs_of_different_solver_layouts_never_share_a_row():
    from arena.report.aggregate import _check_poolable

    old = _constructed_run("old", 0, {"a": True}, learn_tokens=10)
    window = _constructed_run("window", 1, {"a": True}, learn_tokens=10)
    transcript = _constructed_run("transcript", 2, {"a": True}, learn_tokens=10)
    old.results.provenance.config = {"solver": {"history": 2}}  # made before layouts existed
    window.results.provenance.config = {
        "solver": {"history": 2, "layout": "window"}, "llm": {"prefix_cache": False}}
    transcript.results.provenance.config = {
        "solver": {"history": 2, "layout": "transcript"}, "llm": {"prefix_cache": True}}
    _check_poolable([old, window], "m")  # the layout every earlier run had; the cache is exact
    with pytest.raises(ReportError, match=r"differ in config solver.layout \('window' vs 'transcript'\)"):
        _check_poolable([old, window, transcript], "m")


def _with_dtype(run: Run, dtype: str) -> Run:
    run.results.provenance.model["dtype"] = dtype
    run.results.cost.evaluate.tokens_in = 100  # the model was called
    return run


def test_runs_whose_model_ran_in_different_dtypes_never_share_a_row():
    from arena.report.aggregate import _check_poolable

    # the same config (llm.dtype=auto) on two machines: bfloat16 on one, float32 on the other
    native = _with_dtype(_constructed_run("avx512-bf16", 0, {"a": True}, learn_tokens=10), "bfloat16")
    emulated = _with_dtype(_constructed_run("avx2", 1, {"a": True}, learn_tokens=10), "float32")
    with pytest.raises(ReportError, match=r"different dtypes \(bfloat16 in avx512-bf16; float32 in avx2\).*"
                                          r"llm.dtype=auto resolves per machine.*rerun one side with llm.dtype"):
        _check_poolable([native, emulated], "m")
    _check_poolable([native, _with_dtype(emulated, "bfloat16")], "m")
    # a run that never called the model (the random policy) has no dtype to disagree on
    unused = _constructed_run("random", 2, {"a": True}, learn_tokens=0)
    unused.results.provenance.model["dtype"] = "float32"
    assert unused.model_dtype is None
    _check_poolable([native, unused], "m")


def test_a_table_that_mixes_dtypes_names_each_rows(runs):
    rows = {}
    for label, dtype in (("base-s0", "bfloat16"), ("scripted-s0", "float32")):
        run = load_run(runs["base" if label.startswith("base") else "s0"])
        run.results.provenance.model["dtype"] = dtype
        rows[label] = run
    (table,) = build_tables(list(rows.values()))
    flags = {row.method: row.flags for row in table.rows}
    assert "model in bfloat16 (this table mixes bfloat16 and float32)" in flags["base"]
    assert "model in float32 (this table mixes bfloat16 and float32)" in flags["scripted"]
    assert {row.method: row.provenance["dtype"] for row in table.rows} == {
        "base": ["bfloat16"], "scripted": ["float32"]}
    # one dtype: no flag
    rows["scripted-s0"].results.provenance.model["dtype"] = "bfloat16"
    (table,) = build_tables(list(rows.values()))
    assert not any("this table mixes" in flag for row in table.rows for flag in row.flags)


def test_protocol_line_names_the_level_and_the_source_pool(runs):
    easy, = build_tables(load_runs([runs["easy"]]))
    pool, = build_tables(load_runs([runs["pool"]]))
    assert "env.level easy" in protocol_line(easy) and "eval.source_pool train" in protocol_line(easy)
    assert "eval.source_pool all_types" in protocol_line(pool) and "env.level medium" in protocol_line(pool)
    assert "pool " in protocol_line(pool).split("split hashes", 1)[1]  # the pool's hash is shown


# -- isolation: each row says how its method ran; --require-isolation ---------------------------


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose method ran in a worker process of its own (run.isolation=process), on the
    public test draw of the other runs (isolation draws a secret one by default)."""
    return make_run(report_plugins(), tmp_path_factory.mktemp("isolated"), "random-isolated",
                    method="random", extra=("run.isolation=process", "eval.salt=public"))


def _unrecorded_isolation(run: Path, tmp_path: Path) -> Path:
    """A copy of ``run`` as Arena wrote it before results.json recorded the isolation."""
    older = tmp_path / f"{run.name}-older"
    shutil.copytree(run, older)
    results = json.loads((older / "results.json").read_text())
    del results["provenance"]["isolation"]
    (older / "results.json").write_text(json.dumps(results))
    return older


def test_each_row_shows_how_its_method_ran(runs, isolated, tmp_path):
    older = _unrecorded_isolation(runs["s0"], tmp_path)
    out = tmp_path / "board"
    result = CliRunner().invoke(cli, ["leaderboard", str(runs["base"]), str(isolated), str(older),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    header, _, *body = _markdown_rows((out / "README.md").read_text(), "#")
    column = header.index("Isolation")
    assert {cells[1]: cells[column] for cells in body} == {
        "base": "in process", "random": "process", "scripted": "unknown (in process)"}
    board = json.loads((out / "leaderboard.json").read_text())
    modes = {row["method"]: row["isolation"] for row in board["tables"][0]["rows"]}
    assert modes["random"] == {"mode": "process", "runs": {"random-isolated": "process"}}
    assert modes["base"]["mode"] == "in_process" and modes["scripted"]["mode"] == "unknown"
    page = (out / "index.html").read_text()
    assert "<th>Isolation</th>" in page and "<td>unknown (in process)</td>" in page
    assert "--require-isolation" in page  # the note says what the column means


def test_require_isolation_refuses_rows_that_were_not_isolated(runs, isolated, tmp_path):
    older = _unrecorded_isolation(runs["s0"], tmp_path)
    out = tmp_path / "board"
    refused = CliRunner().invoke(cli, ["leaderboard", str(runs["base"]), str(isolated), str(older),
                                       "--out", str(out), "--require-isolation"])
    assert refused.exit_code != 0
    message = " ".join(refused.output.split())
    assert "2 row(s)" in message and "base / arena/fake (base-s0: in_process)" in message
    assert "scripted / arena/fake (scripted-s0-older: unknown)" in message
    assert "random" not in message.split("Rerun")[0]  # the isolated row is not named
    assert "run.isolation=process" in message and not out.exists()  # nothing written

    accepted = CliRunner().invoke(cli, ["leaderboard", str(isolated), "--out", str(out),
                                        "--require-isolation"])
    assert accepted.exit_code == 0, accepted.output
    assert (out / "README.md").is_file()


def test_a_row_says_where_its_runs_ran_and_when_learning_spans_commits():
    """Issue 55: float32 kernels differ by instruction set and a row's runs may have run on two
    machines, or learned across commits; the row says so, and says nothing for runs made before
    Arena recorded it."""
    from arena.report.aggregate import row_flags, row_provenance

    xeon = {"git_sha": "a" * 40, "cpu": {"model": "Xeon", "isa": ["avx2", "avx512f"]}}
    epyc = {"git_sha": "b" * 40, "cpu": {"model": "EPYC", "isa": ["avx2"]}}
    first, second = (_constructed_run(label, seed, {"a": True}, 10) for label, seed in (("s0", 0), ("s1", 1)))
    assert not [f for f in row_flags([first, second], {}) if "machines" in f or "commits" in f]
    assert "machines" not in row_provenance([first, second])
    first.results.provenance.phases = {"learn": [xeon], "evaluate": [xeon]}
    second.results.provenance.phases = {"learn": [xeon, epyc], "evaluate": [epyc]}
    flags = row_flags([first, second], {})
    assert "ran on 2 machines: EPYC (avx2); Xeon (avx2+avx512f)" in flags
    assert f"learning spans commits: s1 ({'a' * 12}, {'b' * 12})" in flags
    assert not any(f.startswith("learning spans commits: s0") for f in flags)
    assert row_provenance([first, second])["machines"] == ["EPYC (avx2)", "Xeon (avx2+avx512f)"]


def test_a_row_says_in_which_precision_its_policy_updates_ran():
    """``precision: auto`` trains in bf16 autocast on a CPU with native bf16 and in float32 on
    one without: the row names what its trainer's steps logged, flags a row that trained both
    ways, and says nothing for a row that trained no policy."""
    from arena.report.aggregate import row_flags, row_provenance
    from arena.report.render import provenance_line

    def step(bf16: float) -> dict:
        return {"phase": "learn", "step": 1, "metrics": {"loss": 0.1, "bf16_autocast": bf16}}

    def line(runs: list[Run]) -> str:  # the provenance line reads the row's provenance alone
        return provenance_line(SimpleNamespace(provenance=row_provenance(runs)))  # type: ignore[arg-type]

    first, second = (_constructed_run(label, seed, {"a": True}, 10) for label, seed in (("s0", 0), ("s1", 1)))
    assert "updates" not in row_provenance([first, second]) and "policy updates" not in line([first, second])
    first.metrics, second.metrics = [step(1.0)], [step(1.0), step(1.0)]
    assert row_provenance([first, second])["updates"] == ["bf16 autocast"]
    assert "(weights unknown; dtype not recorded); policy updates in bf16 autocast; seeds" in line([first, second])
    assert not [f for f in row_flags([first, second], {}) if "precision" in f]
    second.metrics = [step(1.0), step(0.0)]  # resumed on a machine without native bf16
    assert row_provenance([first, second])["updates"] == ["bf16 autocast", "float32"]
    assert "policy updates in mixed precision: s0 (bf16 autocast); s1 (bf16 autocast and float32)" in \
        row_flags([first, second], {})


def test_a_long_curve_of_episode_outcomes_is_drawn_as_its_rolling_mean():
    from arena.report.plots import curve_to_draw

    outcomes = [[float(step), float(step % 4 == 0)] for step in range(1, 41)]  # won every 4th of 40
    label, xs, ys = curve_to_draw("rag: success", outcomes)
    assert label == "rag: success (rolling mean of 4)" and xs == [p[0] for p in outcomes]
    assert ys[:4] == [0.0, 0.0, 0.0, 0.25] and ys[-1] == 0.25 and all(0.0 <= y <= 0.5 for y in ys)
    short = outcomes[:20]  # few points, or values that are not outcomes: drawn as logged
    assert curve_to_draw("x", short) == ("x", [p[0] for p in short], [p[1] for p in short])
    rates = [[float(step), step / 40] for step in range(1, 41)]
    assert curve_to_draw("valid_success", rates)[2] == [p[1] for p in rates]
