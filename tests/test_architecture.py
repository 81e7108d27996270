"""The layout's rules, checked on the source: plugins reach Arena only through its public API
(``arena``, ``arena.api``), the core's modules import each other without a cycle, and no test
module imports another (what tests share is in ``tests/helpers/``)."""

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
CORE_FILES = sorted((ROOT / "arena" / "core").rglob("*.py"))
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
    for module in ("arena.core.execution.context", "arena.core", "arena.core.rl", "arena.plugins.ragged",
                   "arena.plugins.expel.insights", "arena.cli"):
        assert not allowed(module, own, False), module


def test_there_are_third_party_files_to_check() -> None:
    names = {p.name for p in THIRD_PARTY_FILES}
    assert {"plugin.py", "plugin.py.tmpl", "test_plugin.py.tmpl"} <= names
    assert all(arena_imports(p) for p in THIRD_PARTY_FILES if p.name.startswith("plugin"))


#: What a built-in environment or backend may import of the core beyond the public API: the
#: contracts it implements and the harness services it runs on, each named. A plugin outside
#: Arena gets the contracts from ``arena``; these modules give a built-in the rest.
BUILT_IN_CORE = {
    "envs": {"arena.core.contract.env": "the Environment contract and the split names",
             "arena.core.contract.types": "Task and Observation",
             "arena.core.execution.env_workers": "a world served from worker processes (ALFWorld)"},
    "backends": {"arena.core.contract.llm": "the LLMBackend contract",
                 "arena.core.config.compose": "to_plain, for a backend's description",
                 "arena.core.host.allocator": "returning freed memory to the system",
                 "arena.core.host.torch_utils": "eval mode and transformers' imports",
                 "arena.core.host.cache": "what is built once per machine (converted models)",
                 "arena.core.contract.method_config": "typed_config, the backend's llm keys typed"},
}


def built_in_allowed(module: str, area: str) -> bool:
    """A built-in environment or backend's whitelist: the public API, its own area, the named
    core modules (and for a backend, the warm start it serves)."""
    own = f"arena.{area}"
    return (module in PUBLIC or module == own or module.startswith(own + ".")
            or module in BUILT_IN_CORE[area] or (area == "backends" and module.startswith("arena.warmstart")))


@pytest.mark.parametrize("area", sorted(BUILT_IN_CORE))
def test_a_built_in_environment_or_backend_imports_only_its_whitelist(area: str) -> None:
    files = sorted((ROOT / "arena" / area).rglob("*.py"))
    assert len(files) > 4
    for path in files:
        for module in arena_imports(path):
            assert built_in_allowed(module, area), (
                f"{path.relative_to(ROOT)} imports {module}: use `arena`, or name the module in "
                "BUILT_IN_CORE with why a built-in needs it")


def test_the_built_in_whitelist_refuses_the_harness() -> None:
    assert built_in_allowed("arena.core.contract.env", "envs") and built_in_allowed("arena.envs.household.world", "envs")
    for module in ("arena.core.protocol", "arena.core.storage.rundir", "arena.core.execution.context", "arena.plugins.rag",
                   "arena.backends.embedded", "arena.report.runs"):
        assert not built_in_allowed(module, "envs"), module
    assert not built_in_allowed("arena.core.contract.env", "backends")


def core_module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_import_graph() -> dict[str, set[str]]:
    return import_graph(CORE_FILES)


def import_graph(files: list[Path], type_only: bool = True) -> dict[str, set[str]]:
    """module -> the modules of ``files`` it imports, counting every import in the file: at the
    top, under ``TYPE_CHECKING`` (a cycle there is still two modules that must change together;
    ``type_only=False`` leaves them out) and inside functions. ``from arena.core import rl`` is
    the module ``arena.core.rl``."""
    modules = {core_module(path): path for path in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        tree = ast.parse(path.read_text())
        if not type_only:
            _drop_type_checking_blocks(tree)
        for module, names in _imports_of(tree):
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


#: The package's face (``arena``, ``arena.api``) imports every part to re-export it; the parts
#: import it only for the version. Left out of the graph of parts.
FACE = {"arena", "arena.api"}


def package_graph() -> dict[str, set[str]]:
    """arena's parts (``arena.core``, ``arena.backends``, ``arena.cli``, ...) -> the parts they import."""
    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph(sorted((ROOT / "arena").rglob("*.py"))).items():
        if part(module) not in FACE:
            graph.setdefault(part(module), set()).update(part(t) for t in targets)
    return {name: targets - FACE - {name} for name, targets in graph.items()}


def test_no_module_of_arena_and_no_part_of_it_is_in_an_import_cycle() -> None:
    modules = import_graph(sorted((ROOT / "arena").rglob("*.py")))
    assert "arena.report.verify" in modules["arena.report.evaluate_state"]  # the edges are read
    cycle = find_cycle(modules)
    assert cycle is None, "import cycle in arena/: " + " -> ".join(cycle or [])
    parts = package_graph()
    assert {"arena.core", "arena.backends", "arena.warmstart", "arena.report"} <= set(parts)
    cycle = find_cycle(parts)
    assert cycle is None, "import cycle between arena's parts: " + " -> ".join(cycle or [])


def _drop_type_checking_blocks(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []


#: arena/core's groups, lowest first (docs/architecture.md says what each holds). A module imports
#: only its own group and the groups below it; imports under ``TYPE_CHECKING`` are left out (the
#: contract names in its annotations what the harness hands a method, e.g. the store).
CORE_GROUPS = ("contract", "host", "storage", "rl", "services", "config", "execution", "isolation", "protocol")


def group_of(module: str) -> str:
    """``arena.core.storage.ledger`` -> ``storage``; ``arena.core`` itself is its own."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else ""


def upward_imports(graph: dict[str, set[str]], groups: tuple[str, ...] = CORE_GROUPS) -> list[str]:
    """Every edge of ``graph`` from a group to a higher one, as ``module -> module``."""
    rank = {group: number for number, group in enumerate(groups)}
    return sorted(f"{source} -> {target}" for source, targets in graph.items() for target in targets
                  if group_of(source) in rank and rank.get(group_of(target), -1) > rank[group_of(source)])


def test_every_core_module_is_in_a_group() -> None:
    loose = [core_module(path) for path in CORE_FILES if group_of(core_module(path)) not in CORE_GROUPS
             and core_module(path) != "arena.core"]
    assert not loose, f"{loose}: put each in one of the groups {CORE_GROUPS} (docs/architecture.md)"


def test_the_core_groups_import_only_downward() -> None:
    graph = import_graph(CORE_FILES, type_only=False)
    assert "arena.core.storage.ledger" in graph["arena.core.storage.rundir"]  # the edges are read
    assert not upward_imports(graph), upward_imports(graph)


def test_the_direction_check_finds_an_upward_import() -> None:
    graph = {"arena.core.contract.types": {"arena.core.storage.ledger"},
             "arena.core.protocol.session": {"arena.core.contract.types"}}
    assert upward_imports(graph) == ["arena.core.contract.types -> arena.core.storage.ledger"]


def test_the_run_protocols_module_imports_no_implementation() -> None:
    """The contract is the ground floor: what ``run_api`` imports when it runs (not under
    ``TYPE_CHECKING``) is the plain types only."""
    tree = ast.parse((ROOT / "arena" / "core" / "contract" / "run_api.py").read_text())
    _drop_type_checking_blocks(tree)
    imported = {module for module, _ in _imports_of(tree) if module.startswith("arena")}
    assert imported == {"arena.core.contract.types"}, imported


def test_the_core_import_graph_has_no_cycle() -> None:
    graph = core_import_graph()
    assert {"arena.core.execution.context", "arena.core.execution.episodes", "arena.core.rl.trainer"} <= set(graph)
    assert "arena.core.contract.run_api" in graph["arena.core.execution.episodes"]  # the edges are read
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


#: The test code: every test module, conftest.py and the shared helpers.
TEST_FILES = sorted([*(ROOT / "tests").glob("test_*.py"), ROOT / "tests" / "conftest.py",
                     *(ROOT / "tests" / "helpers").glob("*.py")])
#: Where what several test modules share lives: a test module never imports another, nor
#: conftest.py (whose fixtures pytest hands out by name).
TEST_HELPERS = "tests.helpers"


def imported_test_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) of every ``tests`` module ``source`` imports, in a file of ``package``
    (``tests``, ``tests.helpers``: for relative imports): as code, and in a string that is code
    (``python -c``), which is where a subprocess imports."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: the file's package, one level up for each dot past the first
                parts = package.split(".")
                base = ".".join([*parts[:len(parts) - node.level + 1], *([base] if base else [])])
            # `from tests import test_x` imports the module tests.test_x
            found.extend((node.lineno, f"{base}.{alias.name}" if base == "tests" else base)
                         for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                inner = imported_test_modules(node.value, package)
            except SyntaxError:  # prose, not code
                continue
            found.extend((node.lineno + line - 1, module) for line, module in inner)
    return sorted({(line, module) for line, module in found if module == "tests" or module.startswith("tests.")})


def imports_another_test_module(module: str) -> bool:
    return module != TEST_HELPERS and not module.startswith(TEST_HELPERS + ".")


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_test_module_imports_shared_code_only_from_the_helpers(path: Path) -> None:
    package = ".".join(path.parent.relative_to(ROOT).parts)
    refused = [f"{path.relative_to(ROOT)}:{line} imports {module}"
               for line, module in imported_test_modules(path.read_text(), package)
               if imports_another_test_module(module)]
    assert not refused, "; ".join(refused) + f": move what is shared into {TEST_HELPERS.replace('.', '/')}/"


#: What the rule refuses, one import a line; ``{tests}`` is filled in at test time, so that this
#: file does not hold the imports it refuses.
REFUSED = """\
from {tests}.test_protocol import register
import {tests}.conftest
from {tests} import test_leaderboard
from . import test_salt
code = "import sys; from {tests}.test_exactly_once import HelperCopier"
from {tests}.helpers.runs import register
from .helpers import runs
"""


def test_the_test_import_check_finds_them() -> None:
    """The rule itself can fail: each import of a test module or conftest.py is named, with its
    line (a subprocess's code too); the helpers are allowed, relative imports are resolved."""
    found = imported_test_modules(REFUSED.format(tests="tests"), "tests")
    assert found == [(1, "tests.test_protocol"), (2, "tests.conftest"), (3, "tests.test_leaderboard"),
                     (4, "tests.test_salt"), (5, "tests.test_exactly_once"), (6, "tests.helpers.runs"),
                     (7, "tests.helpers")]
    assert [imports_another_test_module(module) for _, module in found] == [True] * 5 + [False] * 2
    assert imported_test_modules("from ..runs import register", "tests.helpers") == [(1, "tests.runs")]
    assert {"tests/conftest.py", "tests/helpers/runs.py"} <= {str(p.relative_to(ROOT)) for p in TEST_FILES}


# -- a run's results are the Results model, never a dict ----------------------------------------

#: Where a run's results are read and written: the harness, the reports, the CLI and the kit.
RESULTS_READERS = sorted([*(ROOT / "arena" / "core").rglob("*.py"), *(ROOT / "arena" / "report").rglob("*.py"),
                          ROOT / "arena" / "cli.py", ROOT / "arena" / "testing.py"])
A_MAPPING = re.compile(r"\b(dict|Dict|Mapping|MutableMapping)\b")


def _names_results(name: str) -> bool:
    return name == "results" or name.endswith("_results")


def results_dicts(source: str) -> list[str]:
    """Each place ``source`` types a run's results as a mapping: a parameter, variable or field
    named ``results`` (or ``*_results``), the return of a function named for results, or a
    function returning a ``results`` name under a mapping annotation (``-> tuple[Path, dict]``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, (ast.Name, ast.Attribute)):
            name = node.target.id if isinstance(node.target, ast.Name) else node.target.attr
            if _names_results(name) and A_MAPPING.search(ast.unparse(node.annotation)):
                found.append(f"{node.lineno}: {name}: {ast.unparse(node.annotation)}")
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        found.extend(f"{node.lineno}: {node.name}({arg.arg}: {ast.unparse(arg.annotation)})"
                     for arg in arguments if arg.annotation is not None and _names_results(arg.arg)
                     and A_MAPPING.search(ast.unparse(arg.annotation)))
        returns = "" if node.returns is None else ast.unparse(node.returns)
        if not A_MAPPING.search(returns):
            continue
        returned = {name.id for ret in ast.walk(node) if isinstance(ret, ast.Return) and ret.value is not None
                    for name in (ret.value.elts if isinstance(ret.value, ast.Tuple) else [ret.value])
                    if isinstance(name, ast.Name)}
        if "results" in node.name or any(_names_results(name) for name in returned):
            found.append(f"{node.lineno}: {node.name}() -> {returns}")
    return found


@pytest.mark.parametrize("path", RESULTS_READERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_runs_results_are_never_a_dict(path: Path) -> None:
    """Results are built by arena.core.protocol.results_builder and read as arena.core.contract.results.Results
    (attributes, not keys): a results dict would let a misspelt key read as absent."""
    found = results_dicts(path.read_text())
    assert not found, (f"{path.relative_to(ROOT)} types a run's results as a mapping ({'; '.join(found)}): "
                       "use arena.core.contract.results.Results (read_results, Results.to_json for the file's JSON)")


def test_the_results_dict_check_finds_them() -> None:
    found = results_dicts(
        "def read_results(path) -> dict[str, Any]: ...\n"
        "def show(results: dict, other_results: Mapping[str, Any]) -> None: ...\n"
        "def run() -> tuple[Path, dict[str, Any]]:\n    path, results = go()\n    return path, results\n"
        "class Run:\n    results: dict[str, Any]\n"
        "def fine(results: Results) -> Results: ...\n"
        "def counts() -> dict[str, int]:\n    return {}\n"
        "def source(results: Results) -> dict[str, Any]:\n    return {'env': results.env}\n")
    assert [line.split(":")[0] for line in found] == ["1", "2", "2", "3", "7"]


def test_the_session_only_sequences_and_the_protocol_s_modules_stay_small() -> None:
    """The protocol's successor is a package of small parts: ``Session`` builds the run and calls
    its phases (under 250 lines); no module of the package reaches 400."""
    folder = ROOT / "arena" / "core" / "protocol"
    sizes = {path.name: len(path.read_text().splitlines()) for path in folder.glob("*.py")}
    assert {"session.py", "evaluation.py", "factors.py", "digests.py", "prepare.py"} <= set(sizes)
    assert max(sizes.values()) < 400, sizes
    session = next(node for node in ast.parse((folder / "session.py").read_text()).body
                   if isinstance(node, ast.ClassDef) and node.name == "Session")
    assert session.end_lineno is not None and session.end_lineno - session.lineno + 1 < 250
