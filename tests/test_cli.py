"""The command line: plugins listing, unknown names, a run and its summary."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from arena.cli import cli
from arena.core.storage.rundir import RunDirError
from tests.helpers.overrides import FAST


def test_plugins_json_lists_builtins():
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.output)
    assert set(listing) >= {"methods", "envs", "backends"}
    assert "base" in [m["name"] for m in listing["methods"]]
    assert "household" in [e["name"] for e in listing["envs"]]
    assert {"transformers", "fake"} <= {b["name"] for b in listing["backends"]}
    base = next(m for m in listing["methods"] if m["name"] == "base")
    assert base["package"] == "arena" and base["version"]


def test_unknown_method_is_a_clear_error():
    result = CliRunner().invoke(cli, ["run", "--method", "bsae"])
    assert result.exit_code != 0
    assert "Unknown method 'bsae'. Did you mean 'base'? Available:" in result.output


def test_unknown_env_and_bad_override():
    result = CliRunner().invoke(cli, ["run", "--method", "base", "--env", "househld"])
    assert result.exit_code != 0 and "Did you mean 'household'?" in result.output
    result = CliRunner().invoke(cli, ["run", "--method", "base", "eval.max_steps"])
    assert result.exit_code != 0 and "key=value" in result.output


def test_run_then_show(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["run", "--method", "base", "--out", str(out), *FAST, "eval.limit=2"])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert results["splits"]["test_seen"]["n_episodes"] == 2
    assert (out / "config.yaml").exists() and (out / "episodes.jsonl").exists()
    shown = CliRunner().invoke(cli, ["show", str(out), "--json"])
    assert shown.exit_code == 0 and json.loads(shown.output)["method"] == "base"
    again = CliRunner().invoke(cli, ["run", "--method", "base", "--out", str(out), *FAST])
    assert again.exit_code != 0 and "already holds a run" in again.output


def test_show_of_unfinished_run_says_how_to_finish(tmp_path):
    (tmp_path / "config.yaml").write_text("method: {name: base}\n")
    result = CliRunner().invoke(cli, ["show", str(tmp_path)])
    assert result.exit_code != 0 and "--resume" in result.output


def test_show_tells_a_running_run_from_an_interrupted_one(tmp_path):
    """While a process holds the run's lock, `show` and `leaderboard` say it is running (with its
    PID), not that it needs --resume; once the process is gone, they say how to resume."""
    import os
    import subprocess
    import sys

    (tmp_path / "config.yaml").write_text("method: {name: base}\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from arena.core.storage.rundir import RunDir; "
         "lock = RunDir(sys.argv[1]).lock().acquire(); print('held', flush=True); time.sleep(60)",
         str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        shown = CliRunner().invoke(cli, ["show", str(tmp_path)])
        assert shown.exit_code != 0 and f"still running (arena run, PID {holder.pid})" in shown.output
        assert "--resume" not in shown.output
        board = CliRunner().invoke(cli, ["leaderboard", str(tmp_path), "--out", str(tmp_path / "b")])
        assert board.exit_code != 0 and "still running" in board.output
        from arena.core import protocol

        with pytest.raises(RunDirError, match=f"in use by another arena run \\(PID {holder.pid}\\)"):
            protocol.prepare(None, resume=tmp_path)
    finally:
        holder.kill()
        holder.wait()
    shown = CliRunner().invoke(cli, ["show", str(tmp_path)])
    assert "was interrupted" in shown.output and f"arena run --resume {tmp_path}" in shown.output
    assert os.path.exists(tmp_path / "run.lock")


def test_a_finished_run_names_the_next_commands(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["run", "--method", "base", "--out", str(out), *FAST, "eval.limit=1"])
    assert result.exit_code == 0, result.output
    for command in (f"arena show {out}", f"arena leaderboard {out}", f"arena compare {out}"):
        assert command in result.output.replace("\n", " ")


def test_listing_plugins_and_checking_names_import_no_heavy_library():
    """`arena plugins`, `--help` and a name check answer in well under 2 s because listing the
    built-ins imports neither torch, transformers, chromadb nor minigrid (measured: benchmarks/bench_cli.py)."""
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from arena.cli import cli; "
            "r = CliRunner().invoke(cli, ['plugins']); assert r.exit_code == 0, r.output; "
            "r = CliRunner().invoke(cli, ['run', '--method', 'evolvng_rl']); "
            "assert \"Did you mean 'evolving_rl'?\" in r.output, r.output; "
            "print(sorted(m for m in ('torch', 'transformers', 'chromadb', 'trl', 'peft', "
            "'sentence_transformers', 'matplotlib', 'minigrid', 'gymnasium') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
