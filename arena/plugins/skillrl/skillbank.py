"""SkillRL's hierarchical SkillBank: general skills, task-type skills and common mistakes.

Records follow the authors' units (``methods.md`` section 2b): a skill is ``{skill_id, title,
principle, when_to_apply}``, a mistake ``{description, why_it_happens, how_to_avoid}``. Each
record also says where it came from (split, task ids, the stage that wrote it), and the bank
keeps a history of events (``add`` / ``revise``) numbered by bank version, so an evolved bank can
be read back as "which skills were added when, from which failures" (SkillRL#14 asks for exactly
that artefact).

The bank is plain data: the method keeps it in its state (one atomic write per change) and
mirrors it into the experience store with :func:`sync_store`, so the harness digests, freezes and
measures it like any other method's memory.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from arena import Experience, Provenance

GENERAL = "general"
SKILL = "skill"
MISTAKE = "mistake"
#: Prefix of skills added by recursive evolution (the authors' ``dyn_NNN`` ids).
DYNAMIC_PREFIX = "dyn_"


@dataclass
class Skill:
    """One skill. ``scope`` is ``general`` or a task type; ``version`` counts its revisions."""

    skill_id: str
    title: str
    principle: str
    when_to_apply: str
    scope: str
    source_split: str
    source_task_ids: list[str] = field(default_factory=list)
    added_at: str = ""  # the stage that wrote it: "distill", "evolve@step5", ...
    version: int = 1
    bank_version: int = 0  # the bank version in which this text appeared

    @property
    def dynamic(self) -> bool:
        return self.skill_id.startswith(DYNAMIC_PREFIX)

    def render(self) -> str:
        text = f"{self.title}: {self.principle}"
        if self.when_to_apply:
            text += f" (When: {self.when_to_apply})"
        return text


@dataclass
class Mistake:
    """One common mistake: what goes wrong, why, and how to avoid it."""

    mistake_id: str
    description: str
    why_it_happens: str
    how_to_avoid: str
    source_split: str
    source_task_ids: list[str] = field(default_factory=list)
    added_at: str = ""
    version: int = 1
    bank_version: int = 0

    def render(self) -> str:
        text = f"Don't: {self.description}"
        if self.why_it_happens:
            text += f" (why: {self.why_it_happens})"
        return text + f" Instead: {self.how_to_avoid}"


def _key(text: str) -> str:
    return " ".join(text.lower().split())


class SkillBank:
    """Skills and mistakes with version bookkeeping. Every change bumps ``version`` by one and
    appends an event to ``history``; :meth:`commit` groups several changes into one version."""

    def __init__(self) -> None:
        self.skills: dict[str, Skill] = {}
        self.mistakes: dict[str, Mistake] = {}
        self.version = 0
        self.history: list[dict[str, Any]] = []
        self._counters: dict[str, int] = {}
        self._batch: int | None = None

    # -- ids and versions ----------------------------------------------------------------------

    def _next_id(self, prefix: str) -> str:
        number = self._counters.get(prefix, 0) + 1
        self._counters[prefix] = number
        return f"{prefix}{number:03d}"

    def _change(self) -> int:
        """The bank version a change belongs to: the open batch's, or a new one."""
        if self._batch is not None:
            return self._batch
        self.version += 1
        return self.version

    def begin(self) -> None:
        """Start a batch: the changes until :meth:`commit` share one bank version."""
        if self._batch is None:
            self.version += 1
            self._batch = self.version

    def commit(self) -> None:
        """Close the batch; a batch without changes gives its version number back."""
        if self._batch is not None and not any(e["bank_version"] == self._batch for e in self.history):
            self.version -= 1
        self._batch = None

    def _log(self, event: str, record_id: str, kind: str, at: str, sources: Iterable[str],
             split: str, version: int, **extra: Any) -> None:
        self.history.append({"bank_version": version, "event": event, "id": record_id, "kind": kind,
                             "at": at, "source_split": split, "source_task_ids": sorted(set(sources)),
                             **extra})

    # -- changes ------------------------------------------------------------------------------

    def find_skill(self, title: str, scope: str | None = None) -> Skill | None:
        """A skill with this title (whitespace and case ignored), optionally in ``scope``."""
        wanted = _key(title)
        for skill in self.skills.values():
            if _key(skill.title) == wanted and (scope is None or skill.scope == scope):
                return skill
        return None

    def add_skill(self, *, title: str, principle: str, when_to_apply: str = "", scope: str = GENERAL,
                  source_split: str, source_task_ids: Iterable[str] = (), added_at: str = "",
                  dynamic: bool = False) -> Skill | None:
        """Add a skill; None if one with the same title already exists in that scope (the
        duplicate-id/title problem of SkillRL PR #28 is avoided by refusing it here)."""
        if not title.strip() or not principle.strip():
            raise ValueError("a skill needs a title and a principle")
        if self.find_skill(title, scope) is not None:
            return None
        if dynamic:
            prefix = DYNAMIC_PREFIX
        elif scope == GENERAL:
            prefix = "gen_"
        else:
            prefix = f"{scope}_"
        version = self._change()
        sources = list(source_task_ids)
        skill = Skill(self._next_id(prefix), title.strip(), principle.strip(), when_to_apply.strip(),
                      scope, source_split, sorted(set(sources)), added_at, 1, version)
        self.skills[skill.skill_id] = skill
        self._log("add", skill.skill_id, SKILL, added_at, sources, source_split, version)
        return skill

    def revise_skill(self, skill_id: str, *, principle: str | None = None, when_to_apply: str | None = None,
                     title: str | None = None, source_split: str, source_task_ids: Iterable[str] = (),
                     added_at: str = "") -> Skill:
        """Rewrite a skill in place: its id stays, its ``version`` goes up, the old text is kept
        in the history event."""
        if skill_id not in self.skills:
            raise KeyError(f"No skill '{skill_id}' to revise; known: {sorted(self.skills)}")
        skill = self.skills[skill_id]
        before = {"title": skill.title, "principle": skill.principle, "when_to_apply": skill.when_to_apply}
        version = self._change()
        skill.title = (title or skill.title).strip()
        skill.principle = (principle or skill.principle).strip()
        skill.when_to_apply = (skill.when_to_apply if when_to_apply is None else when_to_apply).strip()
        skill.version += 1
        skill.bank_version = version
        sources = list(source_task_ids)
        skill.source_task_ids = sorted(set(skill.source_task_ids) | set(sources))
        self._log("revise", skill_id, SKILL, added_at, sources, source_split, version,
                  previous=before, skill_version=skill.version)
        return skill

    def add_mistake(self, *, description: str, how_to_avoid: str, why_it_happens: str = "",
                    source_split: str, source_task_ids: Iterable[str] = (), added_at: str = "") -> Mistake | None:
        """Add a mistake; None if the same description is already in the bank."""
        if not description.strip() or not how_to_avoid.strip():
            raise ValueError("a mistake needs a description and how to avoid it")
        if any(_key(m.description) == _key(description) for m in self.mistakes.values()):
            return None
        version = self._change()
        sources = list(source_task_ids)
        mistake = Mistake(self._next_id("mis_"), description.strip(), why_it_happens.strip(),
                          how_to_avoid.strip(), source_split, sorted(set(sources)), added_at, 1, version)
        self.mistakes[mistake.mistake_id] = mistake
        self._log("add", mistake.mistake_id, MISTAKE, added_at, sources, source_split, version)
        return mistake

    # -- views --------------------------------------------------------------------------------

    def general(self) -> list[Skill]:
        """General skills, dynamic (evolved) first as in the authors' template, then by id."""
        found = [s for s in self.skills.values() if s.scope == GENERAL]
        return sorted(found, key=lambda s: (not s.dynamic, s.skill_id))

    def for_type(self, task_type: str) -> list[Skill]:
        return sorted((s for s in self.skills.values() if s.scope == task_type), key=lambda s: s.skill_id)

    def sizes(self) -> dict[str, int]:
        return {
            "general_skills": len(self.general()),
            "task_type_skills": sum(1 for s in self.skills.values() if s.scope != GENERAL),
            "mistakes": len(self.mistakes),
            "dynamic_skills": sum(1 for s in self.skills.values() if s.dynamic),
            "bank_version": self.version,
        }

    # -- persistence --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "skills": [asdict(s) for s in sorted(self.skills.values(), key=lambda s: s.skill_id)],
            "mistakes": [asdict(m) for m in sorted(self.mistakes.values(), key=lambda m: m.mistake_id)],
            "history": copy.deepcopy(self.history),
            "counters": dict(self._counters),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SkillBank:
        bank = cls()
        if not data:
            return bank
        bank.version = int(data["version"])
        bank.skills = {row["skill_id"]: Skill(**row) for row in data["skills"]}
        bank.mistakes = {row["mistake_id"]: Mistake(**row) for row in data["mistakes"]}
        bank.history = copy.deepcopy(data["history"])
        bank._counters = {key: int(value) for key, value in data["counters"].items()}
        return bank

    def experiences(self) -> list[Experience]:
        """The bank as store items: kind ``skill`` (scope in metadata) or ``mistake``."""
        items = []
        for skill in self.skills.values():
            items.append(Experience(
                kind=SKILL, text=skill.render(),
                provenance=Provenance(tuple(skill.source_task_ids), skill.source_split),
                metadata={"scope": skill.scope, "task_type": skill.scope, "title": skill.title,
                          "principle": skill.principle, "when_to_apply": skill.when_to_apply,
                          "dynamic": skill.dynamic, "version": skill.version,
                          "bank_version": skill.bank_version, "added_at": skill.added_at},
                experience_id=f"skillrl:{skill.skill_id}",
            ))
        for mistake in self.mistakes.values():
            items.append(Experience(
                kind=MISTAKE, text=mistake.render(),
                provenance=Provenance(tuple(mistake.source_task_ids), mistake.source_split),
                metadata={"scope": "mistake", "description": mistake.description,
                          "how_to_avoid": mistake.how_to_avoid, "version": mistake.version,
                          "bank_version": mistake.bank_version, "added_at": mistake.added_at},
                experience_id=f"skillrl:{mistake.mistake_id}",
            ))
        return sorted(items, key=lambda e: e.experience_id)


def sync_store(store: Any, bank: SkillBank) -> None:
    """Make the store's skills and mistakes exactly the bank's (idempotent: safe on resume)."""
    wanted = bank.experiences()
    present = {e.experience_id for kind in (SKILL, MISTAKE) for e in store.all(kind=kind)}
    stale = present - {e.experience_id for e in wanted}
    if stale:
        store.delete(sorted(stale))
    if wanted:
        store.add(wanted)
