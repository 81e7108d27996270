"""`arena new-method`: the package it writes installs with `pip install -e`, passes its own tests
at once, and runs by name."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from arena.cli import cli
from arena.templates import TemplateError, create_method_package, package_names
from tests.helpers.overrides import FAST
from tests.helpers.packaging import make_venv, sh

#: A run of a few seconds: the fast overrides, 2 tasks per test split, a short learning phase.
QUICK_RUN = [*FAST, "eval.limit=2", "learn.budget.episodes=3"]


def test_names_are_derived_and_checked() -> None:
    assert package_names("my-method") == {"name": "my_method", "dist": "arena-my-method",
                                           "package": "arena_my_method", "class_name": "MyMethod"}
    for bad in ("My Method", "1st", "with.dot", ""):
        with pytest.raises(TemplateError, match="lowercase"):
            package_names(bad)


def test_refuses_a_folder_with_files(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    result = CliRunner().invoke(cli, ["new-method", "demo", "--path", str(tmp_path)])
    assert result.exit_code != 0 and "already holds files" in result.output
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    assert not (tmp_path / "pyproject.toml").exists()


def test_plugin_module_stubs_every_method_hook(tmp_path: Path) -> None:
    from arena.core.config.plugins import hook_names, implemented_hooks
    from arena.core.contract.hookspecs import PLUGIN_HOOKS

    files = create_method_package("demo", tmp_path / "pkg")
    plugin_file = next(f for f in files if f.name == "plugin.py")
    spec = importlib.util.spec_from_file_location("demo_plugin", plugin_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["demo_plugin"] = module  # dataclasses look their module up while being made
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["demo_plugin"]
    method_hooks = set(hook_names()) - set(PLUGIN_HOOKS)
    assert set(implemented_hooks(module.Demo)) == method_hooks
    for hook in method_hooks:  # each stub says what it is for
        assert (getattr(module.Demo, hook).__doc__ or "").strip(), hook


@pytest.mark.slow
def test_generated_package_installs_passes_its_tests_and_runs(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["new-method", "demo_memory", "--path", str(tmp_path / "pkg")])
    assert result.exit_code == 0, result.output
    package = tmp_path / "pkg"
    env = make_venv(tmp_path / "venv")
    sh("pip install -q --no-build-isolation --no-deps -e .", package, env)
    tests = sh("python -m pytest -q -p no:cacheprovider", package, env)
    assert "test_plugin_is_installed" not in tests  # -q: no failure listing
    assert "2 passed" in tests, tests
    listing = json.loads(sh("arena plugins --json", package, env))
    entry = next(m for m in listing["methods"] if m["name"] == "demo_memory")
    assert (entry["package"], entry["version"]) == ("arena-demo-memory", "0.1.0")
    out = tmp_path / "run"
    sh(f"arena run --method demo_memory --out {out} " + " ".join(QUICK_RUN), package, env)
    results = json.loads((out / "results.json").read_text())
    assert results["method"] == "demo_memory" and results["valid"]
    assert results["splits"]["test_seen"]["n_episodes"] == 2
    # The package went into the virtualenv only.
    outside = subprocess.run([sys.executable, "-m", "pip", "show", "arena-demo-memory"],
                             capture_output=True, text=True)
    assert outside.returncode != 0
