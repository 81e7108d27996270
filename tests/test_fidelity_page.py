"""docs/fidelity.md, read as tables: one per method, every row matched or declared with its option.

The page's `key = value` pairs are checked against the configs by tests/test_docs.py; this reads the
rows themselves: the count of deviations that are neither a match nor declared is kept at zero. A
declared row names the setting that selects the other behaviour, or is harness-wide, or says
"no option" (a gap, stated with its reason: counted and printed, never silent).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"
HEADER = ["Mechanism", "Authors", "Arena", "Status", "Source"]
STATUSES = ("match", "declared")
HARNESS = "The harness, for every method"
#: A setting named in a row: `key = value` or `PRESET: key = value` (what tests/test_docs.py resolves).
SETTING = re.compile(r"`(?:[a-z0-9_]+: )?[a-z_][a-z0-9_.]*\s*=\s*[^`]+`")


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def sections(text: str) -> dict[str, list[str]]:
    """Each ``## `` section's lines, the page's introduction left out."""
    found: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return found


def tables(lines: list[str]) -> list[list[list[str]]]:
    """The section's tables, each a list of rows (the header first), split where a line is no row."""
    found: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in lines:
        if line.startswith("|"):
            row = cells(line)
            if current is None:
                current = []
                found.append(current)
            if not all(set(cell) <= set("-: ") for cell in row):
                current.append(row)
        else:
            current = None
    return found


def undeclared(rows: list[list[str]]) -> list[str]:
    """Rows that are neither a match nor a deviation declared with the setting that selects it."""
    problems = []
    for row in rows[1:]:
        mechanism, _, arena, status, source = row
        kind = re.split(r"[:;( ]", status.strip(), maxsplit=1)[0]
        if kind not in STATUSES:
            problems.append(f"{mechanism!r}: status {status!r} is neither match nor declared")
        elif kind == "declared" and not (SETTING.search(arena) or "harness-wide" in status
                                         or "no option" in status):
            problems.append(f"{mechanism!r}: declared without the setting that selects it in the Arena "
                            "column (`key = value`); or say harness-wide, or no option and why")
        if not source.strip() or source.strip() == "-":
            problems.append(f"{mechanism!r}: no source")
    return problems


PAGE_SECTIONS = sections(PAGE.read_text())
METHODS = [name for name in PAGE_SECTIONS if name != HARNESS]


def test_the_page_has_a_section_for_every_method_with_authors_and_the_harness() -> None:
    assert {"evolving_rl", "grpo", "gigpo", "skillrl", "memrl", "expel", "reflexion", "mem0", "rag"} <= set(METHODS)
    assert HARNESS in PAGE_SECTIONS


@pytest.mark.parametrize("section", [*METHODS, HARNESS])
def test_each_section_is_one_table_of_the_five_columns(section: str) -> None:
    found = tables(PAGE_SECTIONS[section])
    assert len(found) == 1, f"## {section}: {len(found)} tables; one table a section, so no section is read into another"
    assert found[0][0] == HEADER, f"## {section}: header {found[0][0]}, not {HEADER}"
    assert len(found[0]) > 1, f"## {section}: no rows"
    assert all(len(row) == len(HEADER) for row in found[0]), f"## {section}: a row without five cells"


def test_no_deviation_is_undeclared() -> None:
    problems = [f"## {section}: {problem}" for section in [*METHODS, HARNESS]
                for table in tables(PAGE_SECTIONS[section])[:1] for problem in undeclared(table)]
    assert not problems, "\n".join(problems)
    gaps = [f"## {section}: {row[0]}" for section in METHODS for row in tables(PAGE_SECTIONS[section])[0][1:]
            if "no option" in row[3]]
    print(f"declared gaps without an option: {len(gaps)}", *gaps, sep="\n  ")


def test_the_reader_catches_an_undeclared_row_and_a_second_table() -> None:
    text = "## m\n\n| " + " | ".join(HEADER) + " |\n|---|---|---|---|---|\n" \
        "| a | x | y | match | f.py:1 |\n| b | x | y | differs | f.py:2 |\n| c | x | plain words | declared: why | f.py:3 |\n" \
        "\nprose\n\n| " + " | ".join(HEADER) + " |\n|---|---|---|---|---|\n| d | x | `k = 1` | declared | f.py:4 |\n"
    parsed = sections(text)
    assert len(tables(parsed["m"])) == 2
    problems = undeclared(tables(parsed["m"])[0])
    assert [p.split(":")[0] for p in problems] == ["'b'", "'c'"]
