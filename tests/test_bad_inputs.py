"""Bad input, as a careless user and a crashing machine give it: every case exits non-zero with
one message that names the problem and the fix, prints no traceback, and leaves no run directory
behind (or, for a damaged run, changes nothing in it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import arena
from arena.cli import cli
from tests.helpers.overrides import FAST

#: (overrides, what the message must say) for `arena run --method base`.
RUN_CASES: list[tuple[list[str], str]] = [
    # misspelt and unknown keys
    (["eval.limt=2"], "Unknown config key 'eval.limt'. Did you mean 'eval.limit'?"),
    (["no.such.key=1"], "Unknown config key 'no.such.key'"),
    (["seeds=abc"], "Unknown config key 'seeds'. Did you mean 'run.seeds'?"),
    (["run.seed=1"], "Did you mean 'run.seeds'?"),
    (["eval.max_step=5"], "Did you mean 'eval.max_steps'?"),
    (["method.lr=1"], "Unknown config key 'method.lr'"),
    (["solver.layot=window"], "Did you mean 'solver.layout'?"),
    (["learn.budget.episode=3"], "Did you mean 'learn.budget.episodes'?"),
    (["env.n_trian=5"], "Did you mean 'env.n_train'?"),
    (["llm.reply_text=x"], "Unknown config key 'llm.reply_text'"),
    (["executor.nme=ray"], "Did you mean 'executor.name'?"),
    (["eval.sampling.temprature=0.5"], "Did you mean 'eval.sampling.temperature'?"),
    (["embedder.dimension=8"], "Embedder 'hashing' does not take option(s) dimension"),
    # values out of range or of the wrong type
    (["run.seeds=[]"], "run.seeds=[] is not a non-empty list of integers"),
    (["run.seeds=abc"], "run.seeds='abc' is not a non-empty list of integers"),
    (["run.seeds=[-1]"], "run.seeds=[-1] is not"),
    (["run.seeds=[1.5]"], "run.seeds=[1.5] is not"),
    (["run.seeds=[0,0]"], "run.seeds lists a value twice"),
    (["eval.max_steps=-5"], "eval.max_steps=-5 is not an integer from 1 to 10000 (or null)"),
    (["eval.max_steps=0"], "eval.max_steps=0 is not"),
    (["eval.max_steps=99999999999999999999"], "eval.max_steps=99999999999999999999 is not"),
    (["eval.max_steps=ten"], "eval.max_steps='ten' is not"),
    (["eval.limit=-1"], "eval.limit=-1 is not an integer from 1"),
    (["eval.limit=0"], "eval.limit=0 is not"),
    (["eval.limit=abc"], "eval.limit='abc' is not"),
    (["run.track=bogus"], "run.track='bogus' is not one of frozen, online"),
    (["learn.budget.episodes=-1"], "learn.budget.episodes=-1 is not"),
    (["learn.budget.tokens=-5"], "learn.budget.tokens=-5 is not"),
    (["learn.budget.env_steps=1.5"], "learn.budget.env_steps=1.5 is not"),
    (["learn.budget.gradient_steps=abc"], "learn.budget.gradient_steps='abc' is not"),
    (["eval.concurrency=0"], "eval.concurrency=0 is not an integer from 1 to 1024"),
    (["eval.concurrency=100000"], "eval.concurrency=100000 is not"),
    (["eval.max_invalid_actions=0"], "eval.max_invalid_actions=0 is not"),
    (["eval.sampling.temperature=-1"], "eval.sampling.temperature=-1 is not a number in [0.0, 10.0]"),
    (["eval.sampling.temperature=nan"], "eval.sampling.temperature='nan' is not"),
    (["eval.sampling.top_p=0"], "eval.sampling.top_p=0 is not a number in (0.0, 1.0]"),
    (["eval.sampling.top_p=1.5"], "eval.sampling.top_p=1.5 is not"),
    (["learn.sampling.temperature=hot"], "learn.sampling.temperature='hot' is not"),
    (["learn.max_steps=0"], "learn.max_steps=0 is not"),
    (["learn.split=test_seen"], "learn.split='test_seen' is not one of train, valid"),
    (["learn.seed=-3"], "learn.seed=-3 is not"),
    (["eval.splits=[]"], "eval.splits=[] is not a non-empty list of test_seen, test_unseen"),
    (["eval.splits=[valid]"], "eval.splits=['valid'] is not"),
    (["eval.splits=[test_seen,test_seen]"], "eval.splits lists a value twice"),
    (["eval.source_pool=all"], "eval.source_pool='all' is not one of train, all_types"),
    (["solver.layout=grid"], "solver.layout='grid' is not one of window, transcript"),
    (["solver.mode=think"], "solver.mode='think' is not one of choose, react"),
    (["solver.history=-1"], "solver.history=-1 is not"),
    (["solver.show_admissible=maybe"], "solver.show_admissible='maybe' is not true or false"),
    (["solver.admissible_turns=some"], "solver.admissible_turns='some' is not one of full, changes"),
    (["solver.reasoning_max_tokens=0"], "solver.reasoning_max_tokens=0 is not"),
    (["solver.max_experiences=-1"], "solver.max_experiences=-1 is not"),
    (["solver.max_experience_chars=0"], "solver.max_experience_chars=0 is not"),
    (["store.collection=x"], "store.collection='x' is not a name of 3 to 63 characters"),
    (["executor.name=slurm"], "Unknown executor 'slurm'. Available: local, ray"),
    (["solver.layout=transcrpt"], "Did you mean 'transcript'?"),
    (["run.root="], "run.root"),
    (["embedder.name=nosuch"], "Unknown embedder 'nosuch'. Available:"),
    (["env.level=impossible"], "env.level"),
    (["env.n_train=-1"], "train size must be in [0, 1000000]"),
    (["llm.backend=transfomers"], "Did you mean 'transformers'?"),
    (["env.n_test=many"], "env.n_test='many' is not a number (its default is 120)"),
    (["llm.reply=[1,2]"], "llm.reply=[1, 2] is not a single value"),
    (["eval.max_steps"], "key=value"),
]

#: Whole command lines (no --method given) and the message.
CLI_CASES: list[tuple[list[str], str]] = [
    (["run", "--method", "evolvng_rl"], "Unknown method 'evolvng_rl'. Did you mean 'evolving_rl'?"),
    (["run", "--method", "base", "--env", "househld"], "Did you mean 'household'?"),
    (["run", "--method", "base", "--env", ""], "Unknown environment ''"),
    (["run", "--method", "base", "--preset", "nosuch"], "Unknown preset 'nosuch' for method 'base'"),
    (["run"], "Name a method with --method"),
    (["run", "--method", "evolving_rl", "method.iterations=abc"],
     "method.iterations='abc' is not a number (its default is 1)"),
]


def run_args(tmp_path: Path, overrides: list[str]) -> list[str]:
    return ["run", "--method", "base", "--out", str(tmp_path / "run"), *FAST, "eval.limit=1", *overrides]


def assert_refused(result, expected: str, tmp_path: Path) -> None:
    assert result.exit_code != 0, result.output
    assert expected in result.output, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "run").exists(), "a refused run left its directory behind"


@pytest.mark.parametrize("overrides, expected", RUN_CASES, ids=[" ".join(o) for o, _ in RUN_CASES])
def test_a_bad_override_is_refused_before_any_run_directory(tmp_path, overrides, expected):
    assert_refused(CliRunner().invoke(cli, run_args(tmp_path, overrides)), expected, tmp_path)


@pytest.mark.parametrize("args, expected", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_a_bad_command_line_is_refused(tmp_path, args, expected):
    assert_refused(CliRunner().invoke(cli, args), expected, tmp_path)


@pytest.mark.parametrize("content, expected", [
    ("runs:\n  seeds: [1]\n", "Unknown config key 'runs.seeds'. Did you mean 'run.seeds'?"),
    ("run: 5\n", "run"),
    ("- a list\n", "must hold a mapping at the top level"),
    ("eval: {limit: [\n", "Could not parse config file"),
    ("learn:\n  seed: -3\n", "learn.seed=-3 is not"),
])
def test_a_bad_config_file_is_refused(tmp_path, content, expected):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    result = CliRunner().invoke(cli, run_args(tmp_path, ["--config", str(config)]))
    assert_refused(result, expected, tmp_path)


def test_a_missing_config_file_is_named(tmp_path):
    result = CliRunner().invoke(cli, run_args(tmp_path, ["--config", str(tmp_path / "nope.yaml")]))
    assert_refused(result, "nope.yaml", tmp_path)


def test_an_unwritable_out_is_a_user_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = CliRunner().invoke(cli, ["run", "--method", "base", "--out", str(blocker / "run"), *FAST])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "Cannot create the run directory" in result.output and "--out" in result.output


@pytest.mark.parametrize("model", ["/nonexistent/folder", "EMPTY"])
def test_a_model_path_that_holds_no_model_is_a_user_error(tmp_path, model):
    if model == "EMPTY":
        model = str(tmp_path / "empty")
        Path(model).mkdir()
    result = CliRunner().invoke(cli, run_args(tmp_path, ["llm.backend=transformers", f"llm.model={model}"]))
    assert_refused(result, f"llm.model='{model}'", tmp_path)
    assert "set llm.model to a folder holding a Hugging Face model" in result.output
    assert isinstance(result.exception, SystemExit), result.exception  # a message, no traceback
    assert len(result.output.strip().splitlines()) == 1, result.output


# -- damaged runs: one line naming the file, nothing changed ---------------------------------------


@pytest.fixture
def finished(tmp_path) -> Path:
    out = tmp_path / "done"
    result = CliRunner().invoke(cli, ["run", "--method", "base", "--out", str(out), *FAST, "eval.limit=1"])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("command", ["show", "leaderboard", "compare"])
@pytest.mark.parametrize("damage", ["", "{\"method\": ", "[1, 2]", "\x00\x01"])
def test_a_damaged_results_file_is_one_line_naming_it(finished, tmp_path, command, damage):
    (finished / "results.json").write_text(damage)
    extra = {"leaderboard": ["--out", str(tmp_path / "board")], "compare": [str(finished)]}
    args = [command, str(finished), *extra.get(command, [])]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "results.json" in result.output


def test_a_damaged_state_file_on_resume_is_named(finished):
    (finished / "results.json").unlink()
    (finished / "state.json").write_text('{"learn_done": tru')
    before = (finished / "episodes.jsonl").read_bytes()
    result = CliRunner().invoke(cli, ["run", "--resume", str(finished)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "state.json" in result.output and "line 1" in result.output
    assert (finished / "episodes.jsonl").read_bytes() == before


def test_an_emptied_config_on_resume_is_named(finished):
    (finished / "results.json").unlink()
    (finished / "config.yaml").write_text("")
    result = CliRunner().invoke(cli, ["run", "--resume", str(finished)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "config.yaml" in result.output


def test_a_corrupted_middle_line_stops_resume_and_loses_nothing(finished):
    (finished / "results.json").unlink()
    lines = (finished / "episodes.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) >= 2
    lines[0] = "#garbage#" + lines[0][1:]  # no longer JSON (a disk error, a bad edit)
    (finished / "episodes.jsonl").write_text("".join(lines))
    before = (finished / "episodes.jsonl").read_bytes()
    result = CliRunner().invoke(cli, ["run", "--resume", str(finished)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "episodes.jsonl, line 1" in result.output and "--repair" in result.output
    assert (finished / "episodes.jsonl").read_bytes() == before  # no good record dropped

    # --repair: the damaged line moves aside, every good line stays, its episode is played again
    repaired = CliRunner().invoke(cli, ["run", "--resume", str(finished), "--repair"])
    assert repaired.exit_code == 0, repaired.output
    after = (finished / "episodes.jsonl").read_text().splitlines(keepends=True)
    assert all(line in after for line in lines[1:])
    moved = [json.loads(line) for line in (finished / "episodes.damaged.jsonl").read_text().splitlines()]
    assert [entry["line"] for entry in moved] == [1] and "#garbage#" in moved[0]["bytes"]
    results = json.loads((finished / "results.json").read_text())
    assert results["valid"] is True and results["record"]["damaged_lines"] == [1]
    assert results["cost"]["evaluate"]["episodes"] == len(lines)
    board = CliRunner().invoke(cli, ["leaderboard", str(finished), "--out", str(finished.parent / "b")])
    assert board.exit_code == 0, board.output
    assert "record repaired" in (finished.parent / "b" / "README.md").read_text()


def test_repair_is_refused_for_a_record_damaged_before_learning_finished(finished):
    (finished / "results.json").unlink()
    state = json.loads((finished / "state.json").read_text())
    state["learn_done"] = False
    (finished / "state.json").write_text(json.dumps(state))
    lines = (finished / "episodes.jsonl").read_text().splitlines(keepends=True)
    (finished / "episodes.jsonl").write_text("".join(["{broken\n", *lines[1:]]))
    before = (finished / "episodes.jsonl").read_bytes()
    result = CliRunner().invoke(cli, ["run", "--resume", str(finished), "--repair"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "from before learning finished" in result.output
    assert (finished / "episodes.jsonl").read_bytes() == before


def test_repair_without_resume_is_refused(tmp_path):
    result = CliRunner().invoke(cli, run_args(tmp_path, ["--repair"]))
    assert_refused(result, "--repair applies to --resume RUN_DIR only", tmp_path)


def test_only_a_torn_last_line_is_repaired(finished):
    (finished / "results.json").unlink()
    whole = (finished / "episodes.jsonl").read_bytes()
    (finished / "episodes.jsonl").write_bytes(whole + b'{"phase": "evalu')  # killed mid-write
    result = CliRunner().invoke(cli, ["run", "--resume", str(finished)])
    assert result.exit_code == 0, result.output
    assert (finished / "episodes.jsonl").read_bytes().startswith(whole)
    assert json.loads((finished / "results.json").read_text())["valid"] is True



def test_a_run_started_by_another_version_resumes_only_when_allowed(finished):
    (finished / "results.json").unlink()
    state = json.loads((finished / "state.json").read_text())
    state["provenance"]["arena_version"] = "0.0.1"
    (finished / "state.json").write_text(json.dumps(state))
    refused = CliRunner().invoke(cli, ["run", "--resume", str(finished)])
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "started by another Arena (arena_version '0.0.1' -> " in refused.output
    assert "--allow-version-change" in refused.output
    assert "git worktree" not in refused.output  # the same commit: nothing to check out
    state["provenance"]["git_sha"] = "1c4ddae7f45531a9599b25610d23f5f8d676e4c1"  # started by another commit
    (finished / "state.json").write_text(json.dumps(state))
    refused = CliRunner().invoke(cli, ["run", "--resume", str(finished)], terminal_width=400)
    assert refused.exit_code != 0
    assert "(its commit 1c4ddae7f455: `git worktree add --detach ../arena-1c4ddae7f455 1c4ddae7f455`" in refused.output
    allowed = CliRunner().invoke(cli, ["run", "--resume", str(finished), "--allow-version-change"])
    assert allowed.exit_code == 0, allowed.output
    resumed_by = json.loads((finished / "results.json").read_text())["provenance"]["resumed_by"]
    assert [entry["arena_version"] for entry in resumed_by] == [arena.__version__]


@pytest.mark.parametrize("where", ["under a file", "/proc/forbidden", "over a folder"])
def test_an_unwritable_leaderboard_out_is_one_line_and_loses_nothing(finished, tmp_path, where):
    if where == "/proc/forbidden" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    board = tmp_path / "board"
    made = CliRunner().invoke(cli, ["leaderboard", str(finished), "--out", str(board)])
    assert made.exit_code == 0, made.output
    if where == "under a file":
        (tmp_path / "file").write_text("not a folder")
        out = str(tmp_path / "file" / "board")
    elif where == "over a folder":  # a board whose leaderboard.json cannot be replaced
        (board / "leaderboard.json").unlink()
        (board / "leaderboard.json").mkdir()
        (board / "leaderboard.json" / "keep").write_text("kept")
        out = str(board)
    else:
        out = where
    before = {path: path.read_bytes() for path in finished.rglob("*") if path.is_file()}
    result = CliRunner().invoke(cli, ["leaderboard", str(finished), "--out", out])
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit), result.exception  # no traceback
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert f"Cannot write the leaderboard to {out}" in result.output and "--out" in result.output
    assert {path: path.read_bytes() for path in finished.rglob("*") if path.is_file()} == before
    assert not list(board.rglob(".*.partial"))
    if where == "over a folder":
        assert (board / "leaderboard.json" / "keep").read_text() == "kept"
        assert (board / "README.md").is_file() and (board / "index.html").is_file()
