"""Choosing tasks from a split: the harness's evaluation subsets and methods' own samples use
the same rule, so a method's "8 train tasks" are balanced over task types as an evaluation is."""

from __future__ import annotations

from collections import defaultdict

from arena.core.contract.types import Task


def select_tasks(tasks: list[Task], limit: int | None) -> list[Task]:
    """All tasks, or the first ``limit`` taken round-robin over task types (stable order)."""
    if limit is None or limit >= len(tasks):
        return list(tasks)
    by_type: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_type[task.task_type].append(task)
    queues = [by_type[name] for name in sorted(by_type)]
    chosen: list[Task] = []
    position = 0
    while len(chosen) < limit:
        for queue in queues:
            if position < len(queue) and len(chosen) < limit:
                chosen.append(queue[position])
        position += 1
    order = {task.task_id: i for i, task in enumerate(tasks)}
    return sorted(chosen, key=lambda task: order[task.task_id])
