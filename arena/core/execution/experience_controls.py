"""What an evaluation gives a method of its learned experience (``eval.experience``).

The protocol gives a method what it retrieves for the task it plays. ``arena experiment`` changes
exactly one thing about that, and the harness, not the method, applies the change:

* ``source: other_type``: the method retrieves for a test task of *another type* of the same split
  (a decoy drawn per task and seed): experience of the same kind, format and length, irrelevant
  to the task played (the relevance control of Evolving-RL's paper);
* ``source: none``: the method is given nothing;
* ``poison: f``: before evaluation the harness adds poison items to the learned store until they
  are a share ``f`` of it: each is the text of an item learned on another task type, stored under
  a victim item's key (its embedding and metadata), so the method's retrieval finds it where it
  would have found the victim (memory poisoning, as the critics of RL-memory methods ask).

Methods that retrieve inside ``solve`` (Evolving-RL's source game) ask
``run.experience_task(task)`` for the task whose experience to bring.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from arena.core.contract.settings import NONE, OTHER_TYPE, OWN, SOURCES, ExperienceSettings
from arena.core.contract.types import Experience, Provenance, Task

__all__ = ["NONE", "OTHER_TYPE", "OWN", "SOURCES", "ExperienceControl", "ExperienceSettings", "poison_count"]


class ExperienceControl:
    """Which task a method's experience for ``task`` comes from, under ``settings``."""

    def __init__(self, settings: ExperienceSettings, tasks_of: Callable[[str], list[Task]]) -> None:
        self.settings = settings
        self._tasks_of = tasks_of

    def check(self, splits: list[str], tasks_of: Callable[[str], list[Task]]) -> None:
        """Refuse, before any episode, a control the evaluated ``splits`` (their tasks from
        ``tasks_of``, asked only when needed) cannot give (``other_type`` on a split of one task
        type would end every episode in an error, scored as a failure)."""
        if self.settings.source != OTHER_TYPE:
            return
        for split in splits:
            types = {t.task_type for t in tasks_of(split)}
            if len(types) < 2:
                raise ValueError(f"eval.experience.source=other_type: split {split} has the task types "
                                 f"{sorted(types)} only; it needs at least two (evaluate splits of "
                                 "several types, or leave relevance out for this environment).")

    def task_for(self, task: Task, seed: int) -> Task | None:
        if self.settings.source == NONE:
            return None
        if self.settings.source == OTHER_TYPE:
            return decoy_task(task, self._tasks_of(task.split), seed)
        return task


def decoy_task(task: Task, split_tasks: list[Task], seed: int) -> Task:
    """A task of another type than ``task`` from its split, drawn by the task's id and ``seed``
    (so every arm, resume and replay draws the same one)."""
    others = sorted({t.task_type for t in split_tasks} - {task.task_type})
    if not others:
        raise ValueError(f"Split {task.split} has no task type other than {task.task_type!r}: "
                         "eval.experience.source=other_type needs a split of at least two types.")
    rng = random.Random(hashlib.sha256(f"decoy|{task.task_id}|{seed}".encode()).hexdigest())
    kind = rng.choice(others)
    return rng.choice([t for t in split_tasks if t.task_type == kind])


@dataclass(frozen=True)
class PoisonItem:
    """One poison item: what it says (``donor``'s text) and where it is stored (``victim``'s key)."""

    experience: Experience
    embedding: list[float]
    victim: str
    donor: str
    other_type: bool  # the donor was learned on another task type (else: types unknown)


def poison_count(clean: int, fraction: float) -> int:
    """Items to add so that they are ``fraction`` of the poisoned store."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"{fraction} is not a share in [0, 1).")
    return round(clean * fraction / (1.0 - fraction))


def poison_items(items: list[Experience], embeddings: Mapping[str, list[float]],
                 task_type_of: Callable[[Experience], str | None], fraction: float,
                 seed: int) -> list[PoisonItem]:
    """Poison for a store of ``items``: victims drawn at random (with replacement once every
    item was drawn), each paired with a donor of the same kind learned on another task type (any
    other item of that kind where types are unknown). Deterministic in ``seed``."""
    rng = random.Random(f"poison|{seed}")
    wanted = poison_count(len(items), fraction)
    types = {item.experience_id: task_type_of(item) for item in items}
    by_kind: dict[str, list[Experience]] = {}
    for item in items:
        by_kind.setdefault(item.kind, []).append(item)
    victims = [item for item in items if len(by_kind[item.kind]) > 1]
    if wanted and not victims:
        raise ValueError("The store has no two items of one kind: there is nothing to build poison "
                         "from (poison is an item's text under another item's key).")
    poison: list[PoisonItem] = []
    order: list[Experience] = []
    while len(poison) < wanted:
        if not order:
            order = rng.sample(victims, len(victims))
        victim = order.pop()
        same_kind = [e for e in by_kind[victim.kind] if e.experience_id != victim.experience_id]
        other_type = [e for e in same_kind
                      if types[e.experience_id] not in (None, types[victim.experience_id])]
        donor = rng.choice(other_type or same_kind)
        copy = Experience(kind=victim.kind, text=donor.text, metadata=dict(victim.metadata),
                          provenance=Provenance(source_task_ids=victim.provenance.source_task_ids,
                                                source_split=victim.provenance.source_split),
                          # An id like any other: nothing tells a method it is poison.
                          experience_id=f"{victim.kind}-" + hashlib.sha256(
                              f"{victim.experience_id}|{donor.experience_id}|{len(poison)}|{seed}"
                              .encode()).hexdigest()[:16])
        poison.append(PoisonItem(copy, list(embeddings[victim.experience_id]),
                                 victim.experience_id, donor.experience_id, bool(other_type)))
    return poison
