"""The docs stay true: every hook of the plugin manager is in docs/plugin_hooks.md with its exact
signature, and the tutorial docs/writing_a_method.md runs as written."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

import pytest

from arena import Run
from arena.core.config.plugins import new_plugin_manager
from tests.helpers.packaging import make_venv, sh

DOCS = Path(__file__).resolve().parents[1] / "docs"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)


def spec_signature(name: str, function: object) -> str:
    """``def name(arg: Annotation, ...) -> Return`` as written in hookspecs.py."""
    signature = inspect.signature(function)  # annotations stay strings (postponed evaluation)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in signature.parameters.values())
    return f"def {name}({params}) -> {signature.return_annotation}"


def hook_sections(text: str) -> dict[str, str]:
    """``### `name` `` heading -> the text up to the next heading."""
    parts = re.split(r"^(#{2,3} .*)$", text, flags=re.M)
    sections = {}
    for heading, body in zip(parts[1::2], parts[2::2]):
        found = re.fullmatch(r"### `(\w+)`", heading.strip())
        if found:
            sections[found.group(1)] = body
    return sections


def hook_specs() -> dict[str, object]:
    pm = new_plugin_manager()
    return {name: getattr(pm.hook, name).spec for name in vars(pm.hook)
            if getattr(getattr(pm.hook, name), "spec", None) is not None}


def test_every_hook_is_documented_with_its_exact_signature() -> None:
    specs = hook_specs()
    sections = hook_sections((DOCS / "plugin_hooks.md").read_text())
    assert len(specs) >= 11
    assert set(sections) == set(specs), (
        f"undocumented hooks: {sorted(set(specs) - set(sections))}; "
        f"documented hooks that do not exist: {sorted(set(sections) - set(specs))}"
    )
    for name, spec in specs.items():
        body = sections[name]
        signature = spec_signature(name, spec.function)
        assert f"```python\n{signature}\n```" in body, f"{name}: doc lacks `{signature}`"
        for label in ("**Result:**", "**Called:**", "**Frozen protocol:**"):
            assert label in body, f"{name}: no {label} line"
        result_line = body.split("**Result:**", 1)[1].split("\n- ", 1)[0]
        first = bool(spec.opts.get("firstresult"))
        assert ("firstresult" in result_line) == first, (
            f"{name}: the doc must say 'firstresult' exactly when the hook is one ({first})"
        )
        examples = [code for info, code in FENCE.findall(body) if info.strip() == "python"]
        assert len(examples) >= 2, f"{name}: needs its signature and an example"


def test_hook_doc_examples_compile() -> None:
    """Signatures (given a body) and examples (methods, dedented) are valid Python."""
    blocks = [code for info, code in FENCE.findall((DOCS / "plugin_hooks.md").read_text())
              if info.strip() == "python"]
    assert len(blocks) >= 2 * len(hook_specs())
    for code in blocks:
        if code.startswith("def ") and code.count("\n") == 1:
            code = code.rstrip("\n") + ":\n    ...\n"
        compile(textwrap.dedent(code), "plugin_hooks.md", "exec")


def protocol_members(protocol: type) -> dict[str, str]:
    """name -> ``run.name(arg: Annotation = default, ...) -> Return`` (``run.name: Type`` for a
    property) of every public member of a protocol, as written in its source."""
    members = {}
    for name, value in vars(protocol).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            members[name] = f"run.{name}: {inspect.signature(value.fget).return_annotation}"
            continue
        parts, starred = [], False
        for param in list(inspect.signature(value).parameters.values())[1:]:
            if param.kind is param.VAR_KEYWORD:
                parts.append(f"**{param.name}: {param.annotation}")
                continue
            if param.kind is param.KEYWORD_ONLY and not starred:
                parts.append("*")
                starred = True
            default = "" if param.default is param.empty else f" = {param.default!r}"
            parts.append(f"{param.name}: {param.annotation}{default}")
        members[name] = f"run.{name}({', '.join(parts)}) -> {inspect.signature(value).return_annotation}"
    return members


def documented_members(text: str) -> dict[str, str]:
    """name -> the signature of each ``- `run.name...` `` entry of the ``## The `Run` protocol``
    section."""
    section = text.split("## The `Run` protocol", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"^- `(run\.(\w+)[^`]*)`", section, flags=re.M)
    return {name: signature for signature, name in entries}


def test_the_run_protocol_is_documented_member_by_member() -> None:
    """docs/plugin_hooks.md lists exactly the members of ``arena.Run``, each with its signature."""
    members = protocol_members(Run)
    documented = documented_members((DOCS / "plugin_hooks.md").read_text())
    assert len(members) >= 30 and "play" in members and "cfg" in members
    assert set(documented) == set(members), (
        f"members not documented: {sorted(set(members) - set(documented))}; documented but "
        f"not in arena.Run: {sorted(set(documented) - set(members))}")
    for name, signature in members.items():
        assert documented[name] == signature, f"docs say `{documented[name]}`, arena.Run `{signature}`"


def test_the_member_check_sees_a_difference() -> None:
    class Smaller(Run):  # the check compares both ways: a member more or less is seen
        def extra(self, n: int = 2) -> int: ...

    assert protocol_members(Smaller) == {"extra": "run.extra(n: int = 2) -> int"}
    text = "## The `Run` protocol\n\n- `run.extra(n: int = 2) -> int`: more.\n\n## Next\n- `run.no`\n"
    assert documented_members(text) == protocol_members(Smaller)


def tutorial_blocks() -> list[tuple[str, str, str]]:
    """(kind, target, code) per fenced block: ("file", path, text) or ("bash", "", commands)."""
    blocks = []
    for info, code in FENCE.findall((DOCS / "writing_a_method.md").read_text()):
        words = info.split()
        target = next((w.split("=", 1)[1] for w in words if w.startswith("file=")), None)
        if target is not None:
            blocks.append(("file", target, code))
        elif words == ["bash"]:
            blocks.append(("bash", "", code))
        else:
            raise AssertionError(f"tutorial block ```{info} is neither a file= block nor bash")
    return blocks


def test_tutorial_blocks_are_all_runnable_kinds() -> None:
    blocks = tutorial_blocks()
    assert {kind for kind, _, _ in blocks} == {"file", "bash"}
    assert any(target.endswith("plugin.py") for _, target, _ in blocks)


@pytest.mark.slow
def test_tutorial_runs_from_an_empty_folder(tmp_path: Path) -> None:
    """Write the files, run the commands in one shell (cd carries over), as a reader would."""
    work = tmp_path / "tutorial"
    work.mkdir()
    env = make_venv(tmp_path / "venv")
    cwd_file = tmp_path / "cwd"
    cwd_file.write_text(str(work))
    outputs = []
    for kind, target, code in tutorial_blocks():
        if kind == "file":
            path = work / target
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(code)
        else:
            script = f'cd "$(cat {cwd_file})"\n{code}\npwd > {cwd_file}\n'
            outputs.append(sh(script, work, env))
    package = work / "arena-recent-wins"
    assert Path(cwd_file.read_text().strip()) == package
    installed, tested, ran, board = outputs
    assert installed.strip().splitlines()[-1] == "['0.1.0']"
    assert "3 passed" in tested
    valid, _, state = ran.strip().splitlines()[-1].split(" ", 2)
    assert valid == "True" and "'wins'" in state
    assert (package / "runs" / "first" / "results.json").exists()
    assert board.strip(), "arena leaderboard wrote nothing"


FIDELITY_SETTING = re.compile(
    r"`(?:(\w+): )?((?:method|solver|learn|llm|eval|embedder)\.[\w.]+) = ([^`]+)`")


def fidelity_settings() -> list[tuple[str, str | None, str, str]]:
    """(method, preset, key, value) of every `` `[preset: ]key = value` `` on docs/fidelity.md."""
    text = (DOCS / "fidelity.md").read_text()
    found = []
    for heading, body in zip(*[iter(re.split(r"^## (.+?)\s*$", text, flags=re.M)[1:])] * 2):
        # A method's section is read against that method's config; the harness's section (every
        # method's settings) against the harness defaults, which the `base` method composes alone.
        method = heading if re.fullmatch(r"\w+", heading) else "base"
        for preset, key, value in FIDELITY_SETTING.findall(body):
            found.append((method, preset or None, key, value))
    return found


def test_fidelity_defaults_match_the_configs() -> None:
    import ast

    from omegaconf import OmegaConf

    from arena.core.config.compose import compose
    from arena.core.config.plugins import Plugins

    plugins = Plugins()
    plugins.load_defaults()
    settings = fidelity_settings()
    assert len(settings) >= 30 and {m for m, *_ in settings} >= {"evolving_rl", "grpo"}
    wrong = []
    for method, preset, key, written in settings:
        try:
            stated = ast.literal_eval(written)
        except (ValueError, SyntaxError):
            stated = written
        actual = OmegaConf.select(compose(plugins, method, preset=preset), key,
                                  default="<missing>")
        same = (actual == pytest.approx(stated) if isinstance(stated, float)
                and not isinstance(stated, bool) else actual == stated)
        if not same:
            wrong.append(f"{method} {preset or '(default)'}: {key} is {actual!r}, the page says {stated!r}")
    assert not wrong, "docs/fidelity.md is out of step with the configs:\n" + "\n".join(wrong)


AUTHORS_TABLE = DOCS / "fidelity_authors.yaml"
#: ``owner/repo@commit path:line`` (or the paper, named as such): where an authors' value is read.
SOURCE = re.compile(r"^([\w.-]+/[\w.-]+@[0-9a-f]{7,40} \S+:\d+|the [\w-]+ paper's )")


def authors_table() -> dict[str, dict[str, dict[str, object]]]:
    from omegaconf import OmegaConf

    table = OmegaConf.to_container(OmegaConf.load(AUTHORS_TABLE))
    assert isinstance(table, dict)
    return table  # type: ignore[return-value]


def same_value(actual: object, expected: object) -> bool:
    if isinstance(expected, float) and not isinstance(expected, bool):
        return isinstance(actual, (int, float)) and actual == pytest.approx(expected)
    return actual == expected


def paper_preset_problems(table: dict[str, dict[str, dict[str, object]]],
                          page: list[tuple[str, str | None, str, str]]) -> list[str]:
    """Every way the composed ``--preset paper`` configs, the authors' table and
    docs/fidelity.md disagree (empty when they agree)."""
    import ast

    from omegaconf import OmegaConf

    from arena.core.config.compose import compose
    from arena.core.config.plugins import Plugins

    plugins = Plugins()
    plugins.load_defaults()
    stated: dict[tuple[str, str], dict[str | None, object]] = {}
    for method, preset, key, written in page:
        try:
            value = ast.literal_eval(written)
        except (ValueError, SyntaxError):
            value = written
        stated.setdefault((method, key), {})[preset] = value
    problems = []
    for method, rows in table.items():
        paper = compose(plugins, method, preset="paper")
        for key, row in rows.items():
            if not SOURCE.match(str(row.get("source", ""))):
                problems.append(f"{method} {key}: no source (repository@commit path:line)")
            if "paper" in row and not row.get("why"):
                problems.append(f"{method} {key}: a deviation from the authors needs its `why`")
            expected = row["paper"] if "paper" in row else row["authors"]
            actual = OmegaConf.select(paper, key, default="<missing>")
            if not same_value(actual, expected):
                problems.append(
                    f"{method} --preset paper: {key} is {actual!r}, the authors' is "
                    f"{row['authors']!r} ({row['source']})"
                    + (f", declared {expected!r}" if "paper" in row else "")
                    + "; restore it, or declare the deviation (paper:, why:) in "
                    "docs/fidelity_authors.yaml and on docs/fidelity.md")
            # The page states the same value: as a paper-preset setting, or as the default when
            # the preset keeps it (a GRPO row may be Evolving-RL's, whose solver rows apply).
            found = None
            for section in (method, "evolving_rl") if method == "grpo" else (method,):
                written = stated.get((section, key), {})
                if "paper" in written or None in written:
                    found = written.get("paper", written.get(None))
                    break
            else:
                problems.append(f"docs/fidelity.md's {method} section states no value of {key} "
                                f"(`paper: {key} = ...` or `{key} = ...`)")
                continue
            if not same_value(found, expected):
                problems.append(f"docs/fidelity.md's {method} section says {key} = {found!r} for the "
                                f"paper preset; docs/fidelity_authors.yaml says {expected!r}")
    return problems


def test_paper_presets_carry_the_authors_values() -> None:
    """Each method's composed ``--preset paper`` config holds the authors' value of every key of
    docs/fidelity_authors.yaml (or its declared deviation), each with its source, and
    docs/fidelity.md states the same values; a changed preset, table or page fails here."""
    table = authors_table()
    assert set(table) >= {"evolving_rl", "grpo", "skillrl"}
    assert sum(len(rows) for rows in table.values()) >= 60
    problems = paper_preset_problems(table, fidelity_settings())
    assert not problems, "\n".join(problems)


def test_the_paper_check_catches_a_changed_value() -> None:
    """The check above fails on a paper value changed away from the authors' (here in the table,
    the same comparison a changed preset meets) and on a page that says something else."""
    table = authors_table()
    page = fidelity_settings()
    changed = {method: {key: dict(row) for key, row in rows.items()} for method, rows in table.items()}
    changed["evolving_rl"]["llm.max_context"]["authors"] = 8192
    assert any("llm.max_context is 16384" in p for p in paper_preset_problems(changed, page))
    wrong_page = [(m, p, k, "8192" if (m, p, k) == ("evolving_rl", "paper", "llm.max_context") else v)
                  for m, p, k, v in page]
    assert any("says llm.max_context = 8192" in p for p in paper_preset_problems(table, wrong_page))


ROOT = DOCS.parent
README = ROOT / "README.md"
#: The pages a newcomer is sent to from the README.
README_LINKS = ("docs/index.md", "docs/architecture.md", "CONTRIBUTING.md", "CHANGELOG.md")
MARKDOWN_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def relative_links(page: Path) -> list[str]:
    """The targets of the page's relative Markdown links (code blocks and inline code left out,
    web addresses and in-page anchors skipped), without their #anchor."""
    text = FENCE.sub("", page.read_text())
    text = INLINE_CODE.sub("", text)
    targets = []
    for target in MARKDOWN_LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_the_readme_is_short_and_sends_readers_on() -> None:
    text = README.read_text()
    assert len(text) < 10_000, f"README.md has {len(text):,} characters; move detail to docs/"
    linked = set(relative_links(README))
    for name in README_LINKS:
        assert (ROOT / name).is_file(), f"{name} is missing"
        assert name in linked, f"README.md does not link {name}"


def test_the_readme_keeps_its_two_commands_verbatim() -> None:
    text = README.read_text()
    assert "bash scripts/install.sh && arena run --method evolving_rl\n" in text
    second = "bash scripts/install.sh --dev && ruff check . && mypy && python -m pytest -q -n auto --dist loadfile\n"
    assert second in text
    assert second.strip() in (ROOT / ".ci" / "run").read_text(), ".ci/run must run the README's second command"


def test_every_relative_link_points_to_a_file() -> None:
    pages = [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
    assert len(pages) >= 10
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in pages if page.exists()
              for target in relative_links(page) if not (page.parent / target).exists()]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_link_checker_sees_links_and_skips_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[a](there.md#part) [b](https://x.org) [c](#here) `[d](not.md)`\n"
                    "```\n[e](also_not.md)\n```\n[f](<sub/g.md>)\n")
    assert relative_links(page) == ["there.md", "sub/g.md"]


def test_the_architecture_page_names_every_module_of_the_harness_and_the_reports() -> None:
    """docs/architecture.md is the map of arena/core and arena/report: a module it does not name
    (by its file name, e.g. `ledger.py`) is a module a newcomer cannot place."""
    page = (DOCS / "architecture.md").read_text()
    modules = sorted({path.name for part in ("core", "report")
                      for path in (ROOT / "arena" / part).rglob("*.py") if path.name != "__init__.py"})
    assert len(modules) > 60
    groups = sorted(path.parent.name for path in (ROOT / "arena" / "core").glob("*/__init__.py"))
    assert "contract" in groups
    missing = [name for name in modules if f"`{name}`" not in page] + \
        [f"{group}/" for group in groups if f"`{group}/`" not in page]
    assert not missing, f"docs/architecture.md names no {', '.join(missing)}: say what each is for"
