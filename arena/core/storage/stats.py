"""Aggregate statistics of episode records: rates, confidence intervals, per-type breakdowns."""

from __future__ import annotations

import math
from collections import defaultdict

from arena.core.contract.results import PhaseCost, Summary
from arena.core.contract.types import EpisodeResult
from arena.core.storage.ledger import PhaseCost as LedgerCost

Z_95 = 1.959963984540054


def wilson_interval(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a proportion; honest at 0 % and 100 %, unlike the normal one."""
    if n <= 0:
        return (0.0, 0.0)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def success_ci(records: list[EpisodeResult]) -> tuple[float, float]:
    """95 % interval of the success rate with tasks as the unit of sampling.

    With several seeds each task's success is first averaged over seeds, so repeated seeds of
    the same task do not pass for independent evidence (n = number of tasks).
    """
    per_task: dict[str, list[float]] = defaultdict(list)
    for record in records:
        per_task[record.task_id].append(1.0 if record.success else 0.0)
    n = len(per_task)
    if n == 0:
        return (0.0, 0.0)
    total = sum(sum(values) / len(values) for values in per_task.values())
    low, high = wilson_interval(total, n)
    return (round(low, 4), round(high, 4))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarise(records: list[EpisodeResult]) -> Summary:
    """Metrics of one split (or one task type, or one variant)."""
    steps = sum(r.steps for r in records)
    return Summary(
        n_tasks=len({r.task_id for r in records}),
        n_episodes=len(records),
        success_rate=round(_mean([1.0 if r.success else 0.0 for r in records]), 4),
        ci95=success_ci(records),
        progress_rate=round(_mean([r.progress for r in records]), 4),
        valid_action_rate=round(sum(r.valid_actions for r in records) / steps, 4) if steps else 0.0,
        mean_steps=round(_mean([float(r.steps) for r in records]), 3),
        status=_count_by(records, "status"),
    )


def summarise_split(records: list[EpisodeResult]) -> Summary:
    """Split metrics plus the same metrics per task type."""
    by_type: dict[str, list[EpisodeResult]] = defaultdict(list)
    for record in records:
        by_type[record.task_type].append(record)
    summary = summarise(records)
    summary.by_task_type = {name: summarise(group) for name, group in sorted(by_type.items())}
    return summary


def _count_by(records: list[EpisodeResult], attribute: str) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for record in records:
        counts[str(getattr(record, attribute))] += 1
    return dict(sorted(counts.items()))


def phase_cost(records: list[EpisodeResult], spent: LedgerCost) -> PhaseCost:
    """A phase's cost in results.json: its episodes and steps from its records, its model calls,
    tokens and wall time from the ledger (which also counts calls made outside episodes).
    Copies of an episode (``copy_of``) were not played: they count under ``copied_episodes``."""
    played = [r for r in records if getattr(r, "copy_of", None) is None]
    return PhaseCost(episodes=len(played), copied_episodes=len(records) - len(played),
                     env_steps=sum(r.steps for r in played), **spent.counts(),
                     wall_s=round(spent.wall_s, 2))
