"""The command line: plugins listing, unknown names, a run and its summary."""

from __future__ import annotations

import json

from click.testing import CliRunner

from arena.cli import cli
from tests.conftest import FAST


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
