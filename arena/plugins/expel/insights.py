"""ExpeL's insight list: parsing the critic's operations and the authors' weight bookkeeping.

The critic (an LLM) answers with lines ``AGREE <n>: <rule>``, ``REMOVE <n>: <rule>``,
``EDIT <n>: <new rule>`` and ``ADD <n>: <new rule>``. Weights follow the authors
(``methods.md`` section 4): ADD starts at 2, AGREE and EDIT add 1, REMOVE subtracts 1 (3 when the
list is full), an insight at <= 0 is dropped, and the list is kept sorted by weight.

Everything here is pure (no LLM, no store), so the bookkeeping is tested on its own. A small model
writes broken operations all the time: they are skipped and counted, never raised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

OPERATION_KINDS = ("ADD", "AGREE", "EDIT", "REMOVE")
#: The authors apply operations kind by kind in this order (EDIT after AGREE/REMOVE, ADD last).
APPLY_ORDER = ("REMOVE", "AGREE", "EDIT", "ADD")

# "- ", "* ", "1. ", "2) " in front of an operation are list markers, not part of it.
_LIST_MARKER = re.compile(r"^\s*(?:[-*\u2022]+|\d+[.)])\s*")
_STARTS_WITH_KIND = re.compile(r"^(ADD|AGREE|EDIT|REMOVE)\b")
_OPERATION = re.compile(r"^(ADD|AGREE|EDIT|REMOVE)(?:\s+#?(\d+))?\s*:\s*(.*)$")
_KIND_WORD = re.compile(r"\b(ADD|AGREE|EDIT|REMOVE)\b")


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


def parse_operations(text: str) -> ParsedOperations:
    """Operations in a critic's answer, in the order written.

    A line that starts with an operation keyword (after a list marker) must be well formed:
    ``KIND [n]: text``, with EDIT carrying a number, the text non-empty, free of other operation
    keywords and ending with a period (the authors' guard against cut-off generations). Such a
    line that fails is counted as malformed. Any other line (reasoning, prose) is ignored.
    """
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


class InsightBook:
    """The ranked insight list (highest weight first) and its update rule.

    ``max_insights`` bounds the list: when it holds that many the list is *full*, so a REMOVE
    costs ``remove_when_full`` and the critic is told to prefer REMOVE over ADD (as the authors
    do); after each update only the ``max_insights`` heaviest are kept (older first on ties).
    """

    def __init__(
        self,
        max_insights: int,
        *,
        max_operations: int | None = 4,
        weights: Weights | None = None,
        insights: list[Insight] | None = None,
        next_number: int = 1,
    ) -> None:
        if max_insights < 1:
            raise ValueError(f"max_insights must be at least 1, got {max_insights}")
        self.max_insights = max_insights
        self.max_operations = max_operations
        self.weights = weights or Weights()
        self.insights: list[Insight] = list(insights or [])
        self.next_number = next_number

    @property
    def full(self) -> bool:
        return len(self.insights) >= self.max_insights

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

    def apply(self, operations: list[Operation], sources: list[str] | None = None) -> UpdateReport:
        """Apply one critic answer's operations; invalid ones are skipped and counted."""
        report = UpdateReport(full=self.full)
        sources = list(sources or [])
        if self.max_operations is not None and len(operations) > self.max_operations:
            for _ in operations[self.max_operations:]:
                report.reject("over_operation_limit")
            operations = operations[: self.max_operations]

        # Resolve every operation against the list as it was before this update.
        resolved: list[tuple[str, int | None, str]] = []  # (kind, target index, text)
        touched: set[int] = set()
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
            if target is not None:
                if target in touched:  # each existing rule gets at most one operation
                    report.reject("second_operation_on_rule")
                    continue
                touched.add(target)
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
                    insight = self.insights[target]  # type: ignore[index]
                    insight.text = text
                    insight.weight += self.weights.edit
                    insight.sources = sorted(set(insight.sources) | set(sources))
                else:
                    self.insights.append(
                        Insight(f"insight-{self.next_number:04d}", text, self.weights.add, sorted(set(sources)))
                    )
                    self.next_number += 1
                report.applied[kind] += 1

        kept = [insight for insight in self.insights if insight.weight > 0]
        report.dropped = len(self.insights) - len(kept)
        kept.sort(key=lambda insight: -insight.weight)  # stable: older first on equal weight
        report.evicted = max(0, len(kept) - self.max_insights)
        self.insights = kept[: self.max_insights]
        return report

    def to_dict(self) -> dict[str, Any]:
        return {"insights": [i.to_dict() for i in self.insights], "next_number": self.next_number}

    def load(self, data: dict[str, Any]) -> None:
        self.insights = [Insight.from_dict(item) for item in data.get("insights", [])]
        self.next_number = int(data.get("next_number", 1))
