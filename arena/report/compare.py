"""Paired comparison of two runs (or of two variants of one run) over the same (task, seed) pairs.

Why these statistics:

* **Test: exact McNemar, as a sign-flip test over tasks.** Outcomes are binary and paired, so only
  discordant pairs carry evidence; the exact test needs no large-sample approximation, which
  matters with 12 to 120 tasks per split. With several seeds the pairs of one task are not
  independent, so the unit is the task: each task's summed difference (A - B over its seeds) is
  sign-flipped under the null that A and B are exchangeable, and the null distribution of the sum
  is computed exactly by convolution. With one seed this is exactly the two-sided exact McNemar
  test (the number of A-only wins among the discordant pairs is Binomial(b + c, 1/2)).
* **Interval: paired bootstrap over tasks.** The difference of success rates is resampled by task
  (keeping each task's seeds together, as the leaderboard's intervals treat tasks as the unit),
  percentile interval, a fixed generator seed so a rerun prints the same numbers. With no
  discordant pair at all it collapses to a point, which the output says.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from arena.report.aggregate import DTYPE_ADVICE, SPLITS_FIELD, check_compatible, dtypes_of
from arena.report.runs import PRIMARY_VARIANT, ReportError, Run

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


@dataclass
class SplitComparison:
    split: str
    pairs: int
    tasks: int
    success_a: float
    success_b: float
    difference: float  # success_a - success_b
    ci95: tuple[float, float]
    a_only: int  # pairs A solved and B did not (McNemar's b)
    b_only: int  # pairs B solved and A did not (McNemar's c)
    p_value: float
    note: str = ""


def sign_flip_p_value(task_differences: list[int]) -> float:
    """Exact two-sided p of the sum of integer per-task differences under random sign flips.

    P(|sum of s_t * d_t| >= |observed sum|), s_t = +-1 independently with probability 1/2.
    """
    observed = abs(sum(task_differences))
    nonzero = [abs(d) for d in task_differences if d != 0]
    if not nonzero:
        return 1.0
    offset = sum(nonzero)
    distribution = np.zeros(2 * offset + 1)
    distribution[offset] = 1.0
    for d in nonzero:  # convolve with the two-point distribution {-d, +d}, each 1/2
        shifted = np.zeros_like(distribution)
        shifted[: len(distribution) - d] += 0.5 * distribution[d:]
        shifted[d:] += 0.5 * distribution[: len(distribution) - d]
        distribution = shifted
    sums = np.arange(-offset, offset + 1)
    return float(min(1.0, distribution[np.abs(sums) >= observed].sum()))


def bootstrap_ci(task_differences: np.ndarray, task_weights: np.ndarray,
                 resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile 95 % interval of sum(d)/sum(w) resampling tasks (d: summed differences over a
    task's seeds, w: its number of seeds)."""
    n = len(task_differences)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, size=(resamples, n))
    estimates = task_differences[picks].sum(axis=1) / task_weights[picks].sum(axis=1)
    low, high = np.percentile(estimates, [2.5, 97.5])
    return (round(float(low), 4), round(float(high), 4))


def paired_outcomes(run_a: Run, run_b: Run, variant_a: str, variant_b: str,
                    splits: Sequence[str] | None = None) -> dict[str, list[tuple[str, int, bool, bool]]]:
    """split -> [(task, seed, A's success, B's success)]; refuses unmatched pairs, counting them.
    ``splits``: pair only these (each must have been played by both runs); None: every split."""
    outcomes_a = _outcomes(run_a, variant_a)
    outcomes_b = _outcomes(run_b, variant_b)
    label_a, label_b = _label(run_a, variant_a), _label(run_b, variant_b)
    if splits is not None:
        for label, outcomes in ((label_a, outcomes_a), (label_b, outcomes_b)):
            absent = [split for split in splits if split not in outcomes]
            if absent:
                raise ReportError(
                    f"{label} has no test episodes of split {', '.join(absent)} (it played "
                    f"{', '.join(sorted(outcomes)) or 'none'}): pass --split with splits both runs played."
                )
        outcomes_a = {split: outcomes_a[split] for split in splits}
        outcomes_b = {split: outcomes_b[split] for split in splits}
    problems = []
    for split in sorted(set(outcomes_a) | set(outcomes_b)):
        keys_a, keys_b = set(outcomes_a.get(split, {})), set(outcomes_b.get(split, {}))
        for keys_have, keys_lack, have, lack in ((keys_a, keys_b, label_a, label_b),
                                                 (keys_b, keys_a, label_b, label_a)):
            missing = sorted(keys_have - keys_lack)
            if missing:
                task, seed = missing[0]
                problems.append(f"{split}: {lack} lacks {len(missing)} of the {len(keys_have)} "
                                f"(task, seed) pairs of {have} (e.g. {task} seed {seed})")
    if problems:
        raise ReportError(
            "The runs were not played on the same (task, seed) pairs, so they cannot be paired:\n"
            + "\n".join(problems)
            + "\nEvaluate both on the same splits, eval.limit and run.seeds."
        )
    return {split: [(task, seed, outcomes_a[split][(task, seed)], outcomes_b[split][(task, seed)])
                    for task, seed in sorted(outcomes_a[split])]
            for split in sorted(outcomes_a)}


def _label(run: Run, variant: str) -> str:
    return run.label if variant == PRIMARY_VARIANT else f"{run.label}[{variant}]"


def _outcomes(run: Run, variant: str) -> dict[str, dict[tuple[str, int], bool]]:
    records = run.evaluated(variant)
    if not records and variant != PRIMARY_VARIANT:
        available = ", ".join(run.variants()) or "none"
        raise ReportError(f"{run.label} has no test episodes of variant '{variant}' (its variants: {available}).")
    out: dict[str, dict[tuple[str, int], bool]] = defaultdict(dict)
    for record in records:
        out[record.split][(record.task_id, record.seed)] = bool(record.success)
    return dict(out)


def compare_split(split: str, pairs: list[tuple[str, int, bool, bool]]) -> SplitComparison:
    per_task: dict[str, list[int]] = defaultdict(list)
    for task, _seed, a, b in pairs:
        per_task[task].append(int(a) - int(b))
    differences = np.array([sum(v) for v in per_task.values()], dtype=np.int64)
    weights = np.array([len(v) for v in per_task.values()], dtype=np.int64)
    a_only = sum(1 for *_, a, b in pairs if a and not b)
    b_only = sum(1 for *_, a, b in pairs if b and not a)
    n = len(pairs)
    difference = (a_only - b_only) / n
    note = "" if a_only + b_only else "no discordant pairs: the runs agree on every pair"
    return SplitComparison(
        split=split, pairs=n, tasks=len(per_task),
        success_a=round(sum(a for *_, a, _b in pairs) / n, 4),
        success_b=round(sum(b for *_, b in pairs) / n, 4),
        difference=round(difference, 4), ci95=bootstrap_ci(differences, weights),
        a_only=a_only, b_only=b_only,
        p_value=float(f"{sign_flip_p_value([int(d) for d in differences]):.4g}"), note=note,
    )


def compare_runs(run_a: Run, run_b: Run | None = None, variant_b: str = PRIMARY_VARIANT,
                 variant_a: str = PRIMARY_VARIANT, allow_mixed: bool = False,
                 splits: Sequence[str] | None = None) -> dict[str, Any]:
    """Compare A (primary variant) with B (another run, or a variant of A when B is None).

    ``splits`` restricts the comparison to splits both runs played, so that a run evaluated on
    test_seen alone pairs with one that played both test splits; the other protocol fields must
    still agree (which splits a run played is then no longer one of them)."""
    run_b = run_b or run_a
    if run_b is run_a and variant_a == variant_b:
        raise ReportError("That compares a run with itself: give a second run, or --variant NAME "
                          f"(variants of {run_a.label}: {', '.join(run_a.variants()) or 'none'}).")
    if splits is not None and not splits:
        raise ReportError("No split to compare: name at least one (--split test_seen).")
    ignored = (SPLITS_FIELD,) if splits else ()
    mixed = [] if run_b is run_a else check_compatible(
        [run_a, run_b], allow_mixed, what="a paired comparison", ignore=ignored)
    pairs = paired_outcomes(run_a, run_b, variant_a, variant_b, splits)
    by_dtype = dtypes_of([run_a, run_b])  # a run against its own variant: one dtype
    return {
        "a": _label(run_a, variant_a), "b": _label(run_b, variant_b),
        "test": "exact McNemar / sign-flip over tasks (two-sided)",
        "interval": f"paired bootstrap over tasks, percentile, {BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}",
        "mixed_fields": mixed,
        # A pairing of two dtypes is allowed (two configurations), but part of its difference
        # is then numeric, not the methods': said beside the result.
        "dtype_note": (f"the model ran in {' and '.join(sorted(by_dtype))}: {DTYPE_ADVICE}"
                       if len(by_dtype) > 1 else None),
        "splits": [asdict(compare_split(split, split_pairs)) for split, split_pairs in pairs.items()],
    }
