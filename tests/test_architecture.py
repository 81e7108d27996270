"""The layout's rules, checked on the source: plugins reach Arena only through its public API
(``arena``, ``arena.api``), and the core's modules import each other without a cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_FILES = sorted((ROOT / "arena" / "plugins").rglob("*.py"))
#: Code written as a third party writes it: the example plugin and `arena new-method`'s template.
THIRD_PARTY_FILES = sorted([*(ROOT / "examples").rglob("*.py"), *(ROOT / "arena" / "templates").glob("*.py.tmpl")])
#: What a plugin may import of Arena (besides its own package): the public API, and in tests the
#: pytest helpers.
PUBLIC = {"arena", "arena.api"}
TESTING = {"arena.testing"}
CORE_FILES = sorted([*(ROOT / "arena" / "core").glob("*.py"), *(ROOT / "arena" / "core" / "rl").glob("*.py")])
#: What no built-in plugin may do: (pattern, why).
FORBIDDEN = [
    (r"\brun_dir\b|state\.json", "the run directory and state.json are the harness's: use run.method_state"),
    (r"getattr\(\s*run\.llm\s*,\s*[\"']inner", "unwrapping the run's backend: use run.trainable_backend()"),
    (r"threading\.local\(", "a thread-local to steer solve: pass a policy to run.play"),
]


def test_there_are_plugin_files_to_check() -> None:
    assert len(PLUGIN_FILES) > 20


def arena_imports(path: Path) -> list[str]:
    """The Arena modules ``path`` imports, anywhere in it (a function's own imports too); a
    template is parsed with its ``${placeholders}`` made names."""
    source = re.sub(r"\$\{(\w+)\}", r"\1", path.read_text())
    modules = [module for module, _ in _imports_of(ast.parse(source))]
    return [m for m in modules if m == "arena" or m.startswith("arena.")]


def _imports_of(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) of every import in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
    return found


def allowed(module: str, own: str | None, test: bool) -> bool:
    """The whitelist: the public API, the plugin's own package, and in a test arena.testing."""
    if module in PUBLIC or (test and module in TESTING):
        return True
    return own is not None and (module == own or module.startswith(own + "."))


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_plugin_imports_only_the_public_api_and_its_own_package(path: Path) -> None:
    own = "arena.plugins." + path.relative_to(ROOT / "arena" / "plugins").parts[0]
    test = path.name.startswith("test_") or "tests" in path.parts
    for module in arena_imports(path):
        assert allowed(module, own, test), f"{path.relative_to(ROOT)} imports {module}: use `arena`"


@pytest.mark.parametrize("path", THIRD_PARTY_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_example_and_the_template_import_only_the_public_api(path: Path) -> None:
    test = path.name.startswith("test_") or "tests" in path.parts
    for module in arena_imports(path):
        assert allowed(module, None, test), f"{path.relative_to(ROOT)} imports {module}: use `arena`"


def test_the_whitelist_refuses_the_core_and_another_plugin() -> None:
    """The rule itself can fail: what the plugins used to import is refused."""
    own = "arena.plugins.rag"
    assert allowed("arena", own, False) and allowed("arena.plugins.rag.settings", own, False)
    assert allowed("arena.testing", own, True) and not allowed("arena.testing", own, False)
    for module in ("arena.core.context", "arena.core", "arena.core.rl", "arena.plugins.ragged",
                   "arena.plugins.expel.insights", "arena.cli"):
        assert not allowed(module, own, False), module


def test_there_are_third_party_files_to_check() -> None:
    names = {p.name for p in THIRD_PARTY_FILES}
    assert {"plugin.py", "plugin.py.tmpl", "test_plugin.py.tmpl"} <= names
    assert all(arena_imports(p) for p in THIRD_PARTY_FILES if p.name.startswith("plugin"))


def core_module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_import_graph() -> dict[str, set[str]]:
    """module -> the core modules it imports, counting every import in the file: at the top,
    under ``TYPE_CHECKING`` (a cycle there is still two modules that must change together) and
    inside functions. ``from arena.core import rl`` is the module ``arena.core.rl``."""
    modules = {core_module(path): path for path in CORE_FILES}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names in _imports_of(ast.parse(path.read_text())):
            submodules = {f"{module}.{n}" for n in names} & set(modules)
            targets |= submodules or ({module} & set(modules))
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_core_import_graph_has_no_cycle() -> None:
    graph = core_import_graph()
    assert {"arena.core.context", "arena.core.episodes", "arena.core.rl.trainer"} <= set(graph)
    assert "arena.core.run_api" in graph["arena.core.episodes"]  # the edges are read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in arena/core: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("path", PLUGIN_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_plugin_keeps_to_the_run_context(path: Path) -> None:
    code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    for pattern, why in FORBIDDEN:
        found = re.search(pattern, code)
        assert found is None, f"{path.relative_to(ROOT)}: {found.group(0)!r}: {why}"


def test_nothing_unwraps_the_run_s_backend_anywhere() -> None:
    for path in sorted((ROOT / "arena").rglob("*.py")):
        assert 'getattr(run.llm, "inner"' not in path.read_text(), path


#: A hand cast of config (``int(run.cfg.learn.seed)``, ``float(self.cfg.k)``): settings come typed
#: (``arena.typed_config``) and harness values as typed ``run`` members (``run.learn_seed``).
CONFIG_CAST = re.compile(r"\b(?:int|float|str|bool)\(\s*[\w.]*\bcfg\b[\w.\[\]\"']*\s*\)")


@pytest.mark.parametrize("path", [*PLUGIN_FILES, *THIRD_PARTY_FILES], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_plugin_casts_no_config(path: Path) -> None:
    found = CONFIG_CAST.findall(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} casts config by hand: {found}"


def test_the_config_cast_check_finds_one() -> None:
    assert CONFIG_CAST.findall("seed = int(run.cfg.learn.seed)") == ["int(run.cfg.learn.seed)"]
    assert CONFIG_CAST.findall("k=float(self.cfg.min_similarity)") == ["float(self.cfg.min_similarity)"]
    assert not CONFIG_CAST.findall("k = run.learn_seed")
