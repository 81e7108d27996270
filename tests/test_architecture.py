"""The layout's rules, checked on the source: plugins reach the run only through its context."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_FILES = sorted((ROOT / "arena" / "plugins").rglob("*.py"))
#: What no built-in plugin may do: (pattern, why).
FORBIDDEN = [
    (r"\brun_dir\b|state\.json", "the run directory and state.json are the harness's: use run.method_state"),
    (r"getattr\(\s*run\.llm\s*,\s*[\"']inner", "unwrapping the run's backend: use run.trainable_backend()"),
    (r"threading\.local\(", "a thread-local to steer solve: pass a policy to run.play"),
]


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) of every import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def test_there_are_plugin_files_to_check() -> None:
    assert len(PLUGIN_FILES) > 20


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_plugin_imports_no_harness_internals_and_no_other_plugin(path: Path) -> None:
    own = path.relative_to(ROOT / "arena" / "plugins").parts[0]
    for module, names in _imports(path):
        assert module != "arena.core.protocol", f"{path.name} imports the protocol's internals"
        if module == "arena.core.rundir":  # its atomic JSON writer only
            assert names == ["write_json_atomic"], f"{path.name} imports {names} from {module}"
        if module.startswith("arena.plugins."):
            assert module.split(".")[2] == own, f"{path.name} imports another plugin: {module}"


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_plugin_keeps_to_the_run_context(path: Path) -> None:
    code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    for pattern, why in FORBIDDEN:
        found = re.search(pattern, code)
        assert found is None, f"{path.relative_to(ROOT)}: {found.group(0)!r}: {why}"


def test_nothing_unwraps_the_run_s_backend_anywhere() -> None:
    for path in sorted((ROOT / "arena").rglob("*.py")):
        assert 'getattr(run.llm, "inner"' not in path.read_text(), path
