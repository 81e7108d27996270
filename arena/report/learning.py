"""Each row against its controls: the learning a board claims, paired by task.

Learning is measured as the papers measure it: a memory method against itself with its memory
reset (its learned state evaluated again with no experience shown, a row of its own), an RL method
against the base model, every method against the random policy. ``arena leaderboard --control
NAME`` names the control rows; every other row (memory resets aside) is compared with each, with
its memory reset where the board has one, and with each variant it played of every test episode
(Evolving-RL's episode without its card: the with-card / without-card pairs).

Each compared row then gets a verdict, one sentence a README can quote: where it stands against
each control and its reset per split, a difference at p < 0.05 being a claim, and how many more
learning seeds a claim waits for (a board claims nothing on fewer than three).

Rows pool different numbers of seeds (three learning seeds against one greedy base), and every
seed plays the same test tasks, so the unit is the task: with A's ``n_a`` episodes and B's ``n_b``
on task t, ``d_t = n_b * wins_A(t) - n_a * wins_B(t)`` is an integer whose sign says which row won
the task more often. The difference is the mean over tasks of A's rate minus B's, the p-value the
exact sign-flip test of the d_t (:func:`arena.report.compare.sign_flip_p_value`; exact McNemar with
one seed each), the interval the paired bootstrap over tasks with weights ``n_a * n_b``
(:func:`arena.report.compare.bootstrap_ci`). With one seed on each side every figure is
:func:`arena.report.compare.compare_split`'s.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from arena.core.config.registry import did_you_mean
from arena.report.aggregate import Row, Table, reset_source, task_wins
from arena.report.compare import bootstrap_ci, sign_flip_p_value
from arena.report.runs import PRIMARY_VARIANT, ReportError

#: What a comparison's ``task_type`` is over every task type of its split.
ALL_TYPES = "all"
CONTROL, MEMORY_RESET, VARIANT = "control", "memory reset", "variant"
#: A difference is a claim below this p (per comparison, two-sided, not corrected for the board's
#: number of comparisons: the seeds a claim waits for are its replication).
CLAIM_P_VALUE = 0.05
#: Learning seeds a row needs before the board claims it is above or below a control.
SEEDS_FOR_A_CLAIM = 3

#: task id -> the successes of a row's primary test episodes of it (one per seed).
TaskWins = dict[str, list[bool]]


@dataclass(frozen=True)
class TaskComparison:
    """Row A against row B on the same tasks, their seeds pooled per task."""

    tasks: int
    episodes_a: int
    episodes_b: int
    success_a: float  # mean over tasks of A's success rate on the task
    success_b: float
    difference: float  # success_a - success_b
    ci95: tuple[float, float]
    a_better: int  # tasks on which A's rate is above B's
    b_better: int
    p_value: float
    note: str = ""


def compare_tasks(a: TaskWins, b: TaskWins) -> TaskComparison:
    """A against B on the same tasks (:mod:`arena.report.learning`'s statistics)."""
    tasks = sorted(a)  # compare_split's order: the bootstrap draws the same resamples
    differences = [len(b[t]) * sum(a[t]) - len(a[t]) * sum(b[t]) for t in tasks]
    weights = [len(a[t]) * len(b[t]) for t in tasks]
    rate_a = sum(Fraction(sum(a[t]), len(a[t])) for t in tasks) / len(tasks)
    rate_b = sum(Fraction(sum(b[t]), len(b[t])) for t in tasks) / len(tasks)
    a_better = sum(1 for d in differences if d > 0)
    b_better = sum(1 for d in differences if d < 0)
    return TaskComparison(
        tasks=len(tasks), episodes_a=sum(len(a[t]) for t in tasks), episodes_b=sum(len(b[t]) for t in tasks),
        success_a=round(float(rate_a), 4), success_b=round(float(rate_b), 4),
        difference=round(float(rate_a - rate_b), 4),
        ci95=bootstrap_ci(np.array(differences, dtype=np.int64), np.array(weights, dtype=np.int64)),
        a_better=a_better, b_better=b_better,
        p_value=float(f"{sign_flip_p_value(differences):.4g}"),
        note="" if a_better + b_better else "the rows win every task equally often")


@dataclass(frozen=True)
class RowComparison:
    """One line of the board's learning section: ``row`` against ``against`` on one split (and
    task type)."""

    env: str
    row: str
    model: str
    against: str
    kind: str  # CONTROL, MEMORY_RESET or VARIANT
    split: str
    task_type: str
    seeds_a: int
    seeds_b: int
    result: TaskComparison
    #: Rows of the pair that are invalid (shown, never ranked): their difference is no claim.
    invalid: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        fields = asdict(self)
        return {**{k: v for k, v in fields.items() if k not in ("result", "invalid")}, **fields["result"],
                "ci95": list(self.result.ci95), "invalid": list(self.invalid)}


@dataclass(frozen=True)
class Standing:
    """Where a row stands against one control (or its memory reset) on one split: one cell of the
    verdict table, the figures of one clause of the verdict's sentence."""

    split: str
    against: str  # the control's name, or MEMORY_RESET
    success: float  # the row's success on the split
    difference: float  # in success rate, the row's minus the other's
    p_value: float
    claimed: bool  # p < CLAIM_P_VALUE and neither row invalid
    invalid: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """What the board says of one row: ``text`` is the sentence a README quotes; ``claims`` the
    differences at p < CLAIM_P_VALUE; ``seeds_needed`` the learning seeds still to run before
    they are claimed (0: none, or the row already has SEEDS_FOR_A_CLAIM); ``standings`` the same
    figures as data, for the verdict table."""

    env: str
    row: str
    model: str
    seeds: int
    text: str
    claims: list[str]
    seeds_needed: int
    standings: tuple[Standing, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        """A verdict as leaderboard.json holds it (lists where the dataclass has tuples)."""
        standings = tuple(Standing(**{**s, "invalid": tuple(s.get("invalid", ()))})
                          for s in data.get("standings", ()))
        return cls(**{**data, "standings": standings})


@dataclass
class Learning:
    """The board's learning section: the controls named, every comparison, each row's verdict."""

    controls: list[str]
    comparisons: list[RowComparison]
    verdicts: list[Verdict] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"controls": self.controls, "comparisons": [c.to_json() for c in self.comparisons],
                "verdicts": [asdict(v) for v in self.verdicts]}


def row_outcomes(row: Row, variant: str = PRIMARY_VARIANT) -> dict[str, tuple[TaskWins, dict[str, str]]]:
    """split -> (task -> successes over the row's seeds, task -> its task type), for the row's
    episodes of ``variant``."""
    types: dict[str, dict[str, str]] = defaultdict(dict)
    for run in row.runs:
        for record in run.evaluated(variant):
            types[record.split][record.task_id] = record.task_type
    return {split: (tasks, types[split]) for split, tasks in task_wins(row.runs, variant).items()}


def _check_same_tasks(a: str, b: str, outcomes_a: dict[str, tuple[TaskWins, dict[str, str]]],
                      outcomes_b: dict[str, tuple[TaskWins, dict[str, str]]]) -> None:
    problems = []
    for split in sorted(set(outcomes_a) | set(outcomes_b)):
        tasks_a = set(outcomes_a.get(split, ({}, {}))[0])
        tasks_b = set(outcomes_b.get(split, ({}, {}))[0])
        for have, lack, tasks in ((a, b, tasks_a - tasks_b), (b, a, tasks_b - tasks_a)):
            if tasks:
                problems.append(f"{split}: {lack} did not play {len(tasks)} task(s) {have} "
                                f"played (e.g. {sorted(tasks)[0]})")
    if problems:
        raise ReportError(f"Rows '{a}' and '{b}' did not play the same test tasks, so they cannot be "
                          "paired by task:\n" + "\n".join(problems)
                          + "\nEvaluate both on the same splits and eval.limit (any seeds).")


def variant_label(row: Row, variant: str) -> str:
    """How the board names a row's episodes of one variant: ``evolving_rl [without_skill]``."""
    return row.name if variant == PRIMARY_VARIANT else f"{row.name} [{variant}]"


def compare_rows(env: str, a: Row, b: Row, kind: str, variant_b: str = PRIMARY_VARIANT) -> list[RowComparison]:
    """Row A against row B (or against A's own episodes of ``variant_b``) per split, over all task
    types and then each; refuses rows that did not play the same tasks."""
    against = variant_label(b, variant_b)
    outcomes_a, outcomes_b = row_outcomes(a), row_outcomes(b, variant_b)
    _check_same_tasks(a.name, against, outcomes_a, outcomes_b)
    invalid = tuple(dict.fromkeys(row.name for row in (a, b) if not row.valid))
    lines = []
    order = [split for split in a.splits if split in outcomes_a] + sorted(set(outcomes_a) - set(a.splits))
    for split in order:
        wins_a, types = outcomes_a[split]
        wins_b, _ = outcomes_b[split]
        groups = [(ALL_TYPES, sorted(wins_a))] + [
            (name, sorted(t for t in wins_a if types[t] == name)) for name in sorted(set(types.values()))]
        for task_type, tasks in groups:
            result = compare_tasks({t: wins_a[t] for t in tasks}, {t: wins_b[t] for t in tasks})
            lines.append(RowComparison(env=env, row=a.name, model=a.model, against=against, kind=kind, split=split,
                                       task_type=task_type, seeds_a=len(a.seeds), seeds_b=len(b.seeds),
                                       result=result, invalid=invalid))
    return lines


def find_control(table: Table, name: str) -> Row:
    """The row the board prints as ``name`` (or ``name / model`` where two models share a name)."""
    matches = [row for row in table.rows if name in (row.name, f"{row.name} / {row.model}")]
    if len(matches) == 1:
        return matches[0]
    names = sorted({row.name for row in table.rows})
    if not matches:
        raise ReportError(did_you_mean(f"control row of the {table.env} table", name, names)
                          + ". --control names a row as the board prints it (e.g. base, random, grpo (cpu)).")
    raise ReportError(f"--control {name} names {len(matches)} rows of the {table.env} table ("
                      + "; ".join(f"{row.name} / {row.model}" for row in matches)
                      + "): name one as 'METHOD / MODEL'.")


def learning_report(tables: list[Table], controls: list[str] | tuple[str, ...]) -> Learning | None:
    """Every row (not a control, not a memory reset) against each control, its own memory reset
    and each variant it played, and its verdict; None without controls (a board without the
    section)."""
    if not controls:
        return None
    controls = list(dict.fromkeys(controls))  # a control named twice is compared with once
    comparisons = []
    for table in tables:
        control_rows = [find_control(table, name) for name in controls]
        resets = {id(reset): source for reset in table.rows if reset.reset_of is not None
                  and (source := reset_source(table.rows, reset)) is not None}
        for row in table.rows:
            if row.reset_of is not None or any(row is control for control in control_rows):
                continue
            for control in control_rows:
                comparisons += compare_rows(table.env, row, control, CONTROL)
            for reset in table.rows:
                if resets.get(id(reset)) is row:
                    comparisons += compare_rows(table.env, row, reset, MEMORY_RESET)
            for variant in sorted({name for run in row.runs for name in run.variants()}):
                comparisons += compare_rows(table.env, row, row, VARIANT, variant_b=variant)
    return Learning(controls=list(controls), comparisons=comparisons, verdicts=verdicts(comparisons))


# -- verdicts: what the board claims of each row, in one sentence -----------------------------------


def _p(value: float) -> str:
    return f"{value:.2g}"


def _standing(line: RowComparison) -> Standing:
    result = line.result
    return Standing(split=line.split, against=MEMORY_RESET if line.kind == MEMORY_RESET else line.against,
                    success=result.success_a, difference=result.difference, p_value=result.p_value,
                    claimed=not line.invalid and result.p_value < CLAIM_P_VALUE, invalid=line.invalid)


def _clause(standing: Standing) -> str:
    """How the row stands against one control or its reset, as the verdict's sentence says it."""
    against = "its memory reset" if standing.against == MEMORY_RESET else standing.against
    if standing.invalid:
        return f"no claim against {against} (invalid: {', '.join(standing.invalid)})"
    if standing.claimed:
        side = "above" if standing.difference > 0 else "below"
        return f"{side} {against} ({standing.difference * 100:+.1f} points, p = {_p(standing.p_value)})"
    return f"not separated from {against} (p = {_p(standing.p_value)})"


def verdicts(comparisons: list[RowComparison]) -> list[Verdict]:
    """One verdict per compared row, from its comparisons over all task types with the controls
    and its memory reset (its variants are diagnostics, not claims), splits in the board's order."""
    by_row: dict[tuple[str, str, str], list[RowComparison]] = defaultdict(list)
    for line in comparisons:
        if line.task_type == ALL_TYPES and line.kind in (CONTROL, MEMORY_RESET):
            by_row[(line.env, line.row, line.model)].append(line)
    out = []
    for (env, row, model), lines in by_row.items():
        seeds = lines[0].seeds_a
        parts, claims, standings = [], [], []
        for split in dict.fromkeys(line.split for line in lines):
            of_split = [_standing(line) for line in lines if line.split == split]
            standings += of_split
            claims += [f"{split}: {_clause(s)}" for s in of_split if s.claimed]
            parts.append(f"{split} {of_split[0].success * 100:.1f} %, " + ", ".join(_clause(s) for s in of_split))
        needed = max(0, SEEDS_FOR_A_CLAIM - seeds) if claims else 0
        text = f"{row} ({seeds} seed{'s' if seeds != 1 else ''}): " + "; ".join(parts) + "."
        if needed:
            text += (f" Not yet a claim: {SEEDS_FOR_A_CLAIM} learning seeds are needed, "
                     f"{seeds} {'has' if seeds == 1 else 'have'} run.")
        out.append(Verdict(env=env, row=row, model=model, seeds=seeds, text=text, claims=claims,
                           seeds_needed=needed, standings=tuple(standings)))
    return out
