"""ExpeL's insight list: parsing the critic's operations and the authors' weight bookkeeping.

The critic (an LLM) answers with lines ``AGREE <n>: <rule>``, ``REMOVE <n>: <rule>``,
``EDIT <n>: <new rule>`` and ``ADD <n>: <new rule>``. Weights follow the authors
(``methods.md`` section 4): ADD starts at 2, AGREE and EDIT add 1, REMOVE subtracts 1 (3 when the
list is full), an insight at <= 0 is dropped, and the list is kept sorted by weight.

Everything here is pure (no LLM, no store), so the bookkeeping is tested on its own. A small model
writes broken operations all the time: they are skipped and counted, never raised.

Two readings of an answer (``method.operation_parser``): ``authors`` is the authors' own
(``parse_rules`` and ``update_rules`` in ExpeL's ``agent/expel.py``): an operation anywhere in a
line, a rule found only where its exact text is contained in the operation's text, two identical
ADDs both added; ``lenient`` reads list markers and ``#n``, matches rules without case or extra
spacing and falls back on the rule's number (a small model rarely copies a rule verbatim), and
drops an ADD the same answer already made. Both apply every operation, several on one rule
included, with the authors' arithmetic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

OPERATION_KINDS = ("ADD", "AGREE", "EDIT", "REMOVE")
#: How a critic's answer is read and its rules matched (``method.operation_parser``).
PARSERS = ("lenient", "authors")
#: The authors apply operations kind by kind in this order (EDIT after AGREE/REMOVE, ADD last).
APPLY_ORDER = ("REMOVE", "AGREE", "EDIT", "ADD")

# "- ", "* ", "1. ", "2) " in front of an operation are list markers, not part of it.
_LIST_MARKER = re.compile(r"^\s*(?:[-*\u2022]+|\d+[.)])\s*")
_STARTS_WITH_KIND = re.compile(r"^(ADD|AGREE|EDIT|REMOVE)\b")
_OPERATION = re.compile(r"^(ADD|AGREE|EDIT|REMOVE)(?:\s+#?(\d+))?\s*:\s*(.*)$")
_KIND_WORD = re.compile(r"\b(ADD|AGREE|EDIT|REMOVE)\b")
# The authors' reading: ``KIND[ n]: [Label: ]text`` anywhere in a line (a short label such as
# "Rule 3: " before the text is dropped); a text holding ADD, AGREE or EDIT is refused.
_AUTHORS_OPERATION = re.compile(r"((?:REMOVE|EDIT|ADD|AGREE)(?: \d+|)): (?:[a-zA-Z\s\d]+: |)(.*)")
_AUTHORS_BANNED = ("ADD", "AGREE", "EDIT")


@dataclass(frozen=True)
class Operation:
    """One parsed operation; ``number`` is the 1-based rule number the critic wrote, if any."""

    kind: str
    number: int | None
    text: str


@dataclass
class ParsedOperations:
    """What one critic answer held: well-formed operations and a count of broken ones."""

    operations: list[Operation]
    malformed: int
    malformed_lines: list[str] = field(default_factory=list)


def check_parser(parser: str) -> str:
    if parser not in PARSERS:
        raise ValueError(f"Unknown method.operation_parser {parser!r}. Choices: {', '.join(PARSERS)}")
    return parser


def parse_operations_as_authors(text: str) -> ParsedOperations:
    """Operations as the authors read them: every ``KIND[ n]: text`` match in the answer, kept
    when the text is non-empty, holds none of ADD/AGREE/EDIT and ends with a period (the
    authors' guards against formatting slips and cut-off generations); an ADD's number is
    dropped. A match that fails a guard is counted as malformed."""
    operations: list[Operation] = []
    malformed: list[str] = []
    for head, body in _AUTHORS_OPERATION.findall(text):
        body = body.strip()
        if not body or any(word in body for word in _AUTHORS_BANNED) or not body.endswith("."):
            malformed.append(f"{head}: {body}")
            continue
        kind, _, number = head.strip().partition(" ")
        operations.append(Operation(kind, int(number) if number and kind != "ADD" else None, body))
    return ParsedOperations(operations, len(malformed), malformed)


def parse_operations(text: str, parser: str = "lenient") -> ParsedOperations:
    """Operations in a critic's answer, in the order written (``parser="authors"``: the authors'
    reading, :func:`parse_operations_as_authors`).

    A line that starts with an operation keyword (after a list marker) must be well formed:
    ``KIND [n]: text``, with EDIT carrying a number, the text non-empty, free of other operation
    keywords and ending with a period (the authors' guard against cut-off generations). Such a
    line that fails is counted as malformed. Any other line (reasoning, prose) is ignored.
    """
    if check_parser(parser) == "authors":
        return parse_operations_as_authors(text)
    operations: list[Operation] = []
    malformed: list[str] = []
    for raw in text.splitlines():
        line = _LIST_MARKER.sub("", raw.strip(), count=1).strip().strip("*").strip()
        if not _STARTS_WITH_KIND.match(line):
            continue
        match = _OPERATION.match(line)
        if match is None:
            malformed.append(raw)
            continue
        kind, number, body = match.group(1), match.group(2), match.group(3).strip().strip('"').strip()
        if (
            not body
            or not body.endswith(".")
            or _KIND_WORD.search(body)
            or (kind == "EDIT" and number is None)
        ):
            malformed.append(raw)
            continue
        operations.append(Operation(kind, int(number) if number is not None else None, body))
    return ParsedOperations(operations, len(malformed), malformed)


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


@dataclass
class Insight:
    """One rule of the list: its text, weight and the train tasks it was distilled from."""

    insight_id: str
    text: str
    weight: int
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.insight_id, "text": self.text, "weight": self.weight, "sources": list(self.sources)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Insight:
        return cls(str(data["id"]), str(data["text"]), int(data["weight"]), list(data.get("sources", [])))


@dataclass(frozen=True)
class Weights:
    """The authors' weight changes per operation."""

    add: int = 2
    agree: int = 1
    edit: int = 1
    remove: int = 1
    remove_when_full: int = 3


@dataclass
class UpdateReport:
    """What one update did: operations applied per kind, and those skipped and why."""

    applied: dict[str, int] = field(default_factory=lambda: {kind: 0 for kind in OPERATION_KINDS})
    rejected: dict[str, int] = field(default_factory=dict)
    dropped: int = 0  # insights whose weight fell to <= 0
    evicted: int = 0  # insights cut because the list was over max_insights
    full: bool = False

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


#: The authors' list counts as full for a REMOVE's cost only this many rules past max_num_rules
#: (``list_full = max_num_rules + 5 <= len(rules)``).
AUTHORS_FULL_MARGIN = 5


class InsightBook:
    """The ranked insight list (highest weight first) and its update rule.

    When the list holds ``max_insights`` it is *full*: the critic is told to prefer REMOVE over
    ADD (as the authors do). With ``cap`` (Arena's default) a REMOVE then costs
    ``remove_when_full`` and after each update only the ``max_insights`` heaviest are kept
    (older first on ties); without it (the authors') the list is never cut and a REMOVE costs
    ``remove_when_full`` from ``max_insights + 5`` rules on. ``parser`` picks the rule matching
    (module docstring).
    """

    def __init__(
        self,
        max_insights: int,
        *,
        max_operations: int | None = 4,
        weights: Weights | None = None,
        insights: list[Insight] | None = None,
        next_number: int = 1,
        parser: str = "lenient",
        cap: bool = True,
    ) -> None:
        if max_insights < 1:
            raise ValueError(f"max_insights must be at least 1, got {max_insights}")
        self.max_insights = max_insights
        self.max_operations = max_operations
        self.weights = weights or Weights()
        self.insights: list[Insight] = list(insights or [])
        self.next_number = next_number
        self.parser = check_parser(parser)
        self.cap = cap

    @property
    def full(self) -> bool:
        """The list holds ``max_insights``: the critic is asked to prefer REMOVE."""
        return len(self.insights) >= self.max_insights

    @property
    def remove_full(self) -> bool:
        """A REMOVE costs ``remove_when_full``."""
        return self.full if self.cap else len(self.insights) >= self.max_insights + AUTHORS_FULL_MARGIN

    def texts(self) -> list[str]:
        return [insight.text for insight in self.insights]

    def _find(self, text: str) -> int | None:
        """Index of the existing insight whose text the operation's text contains (the authors'
        matching rule), compared without case or extra spacing."""
        wanted = _normalise(text)
        for index, insight in enumerate(self.insights):
            if _normalise(insight.text) and _normalise(insight.text) in wanted:
                return index
        return None

    def _target(self, operation: Operation) -> int | None:
        """The insight an AGREE/REMOVE/EDIT refers to: by text first (the authors' rule), then by
        its number when that is in range (a small model rarely copies a rule verbatim)."""
        index = self._find(operation.text)
        if index is not None:
            return index
        if operation.number is not None and 1 <= operation.number <= len(self.insights):
            return operation.number - 1
        return None

    def _contains(self, text: str) -> int | None:
        """The authors' match: the first rule whose exact text the operation's text contains."""
        for index, insight in enumerate(self.insights):
            if insight.text in text:
                return index
        return None

    def apply(self, operations: list[Operation], sources: list[str] | None = None) -> UpdateReport:
        """Apply one critic answer's operations; invalid ones are skipped and counted."""
        report = UpdateReport(full=self.remove_full)
        sources = list(sources or [])
        if self.max_operations is not None and len(operations) > self.max_operations:
            for _ in operations[self.max_operations:]:
                report.reject("over_operation_limit")
            operations = operations[: self.max_operations]
        if self.parser == "authors":
            self._apply_as_authors(operations, sources, report)
        else:
            self._apply_lenient(operations, sources, report)
        kept = [insight for insight in self.insights if insight.weight > 0]
        report.dropped = len(self.insights) - len(kept)
        kept.sort(key=lambda insight: -insight.weight)  # stable: older first on equal weight
        if self.cap:
            report.evicted = max(0, len(kept) - self.max_insights)
            kept = kept[: self.max_insights]
        self.insights = kept
        return report

    def _add(self, text: str, sources: list[str]) -> None:
        self.insights.append(Insight(f"insight-{self.next_number:04d}", text, self.weights.add, sorted(set(sources))))
        self.next_number += 1

    def _edit(self, index: int, text: str, sources: list[str]) -> None:
        insight = self.insights[index]
        insight.text = text
        insight.weight += self.weights.edit
        insight.sources = sorted(set(insight.sources) | set(sources))

    def _apply_as_authors(self, operations: list[Operation], sources: list[str], report: UpdateReport) -> None:
        """The authors' ``update_rules``: every operation checked against the list as it was,
        then applied kind by kind (REMOVE, AGREE, EDIT, ADD); REMOVE and AGREE find their rule by
        contained text when applied, EDIT by its number; an EDIT whose text contains a rule
        agrees with that rule; several operations on one rule all apply."""
        kept: list[tuple[str, int | None, str]] = []  # (kind, number, text)
        for operation in operations:
            kind, number, text = operation.kind, operation.number, operation.text
            if kind == "ADD":
                if self._contains(text) is not None:
                    report.reject("add_duplicate")
                    continue
            elif kind == "EDIT":
                same = self._contains(text)
                if same is not None:
                    kind, number, text = "AGREE", same + 1, self.insights[same].text
                elif number is None or number > len(self.insights) or not self.insights:
                    report.reject("edit_unknown_rule")
                    continue
            elif self._contains(text) is None:
                report.reject(f"{kind.lower()}_unknown_rule")
                continue
            kept.append((kind, number, text))
        remove_cost = self.weights.remove_when_full if report.full else self.weights.remove
        for kind_now in APPLY_ORDER:
            for kind, number, text in kept:
                if kind != kind_now:
                    continue
                if kind in ("REMOVE", "AGREE"):
                    index = self._contains(text)
                    if index is None:  # cannot happen before the EDIT phase; kept for safety
                        report.reject(f"{kind.lower()}_unknown_rule")
                        continue
                    change = -remove_cost if kind == "REMOVE" else self.weights.agree
                    self.insights[index].weight += change
                elif kind == "EDIT":
                    self._edit(int(number or 0) - 1, text, sources)  # number 0: the last rule, as theirs
                else:
                    self._add(text, sources)
                report.applied[kind] += 1

    def _apply_lenient(self, operations: list[Operation], sources: list[str], report: UpdateReport) -> None:
        """Arena's reading for small models: rules matched without case or extra spacing, by
        number when the text names none; the answer's repeated ADDs dropped; otherwise the
        authors' order and arithmetic, several operations on one rule included."""
        # Resolve every operation against the list as it was before this update.
        resolved: list[tuple[str, int | None, str]] = []  # (kind, target index, text)
        added: set[str] = set()
        for operation in operations:
            kind, target = operation.kind, None
            if kind == "ADD":
                if self._find(operation.text) is not None or _normalise(operation.text) in added:
                    report.reject("add_duplicate")
                    continue
                added.add(_normalise(operation.text))
            elif kind == "EDIT":
                same = self._find(operation.text)
                if same is not None:  # an "edit" that restates a rule agrees with it (authors)
                    kind, target = "AGREE", same
                elif operation.number is not None and 1 <= operation.number <= len(self.insights):
                    target = operation.number - 1
                else:
                    report.reject("edit_unknown_rule")
                    continue
            else:
                target = self._target(operation)
                if target is None:
                    report.reject(f"{kind.lower()}_unknown_rule")
                    continue
            resolved.append((kind, target, operation.text))

        remove_cost = self.weights.remove_when_full if report.full else self.weights.remove
        for kind_now in APPLY_ORDER:
            for kind, target, text in resolved:
                if kind != kind_now:
                    continue
                if kind == "REMOVE":
                    self.insights[target].weight -= remove_cost  # type: ignore[index]
                elif kind == "AGREE":
                    self.insights[target].weight += self.weights.agree  # type: ignore[index]
                elif kind == "EDIT":
                    self._edit(target, text, sources)  # type: ignore[arg-type]
                else:
                    self._add(text, sources)
                report.applied[kind] += 1

    def to_dict(self) -> dict[str, Any]:
        return {"insights": [i.to_dict() for i in self.insights], "next_number": self.next_number}

    def load(self, data: dict[str, Any]) -> None:
        self.insights = [Insight.from_dict(item) for item in data.get("insights", [])]
        self.next_number = int(data.get("next_number", 1))
