"""A Mem0-style memory: facts extracted from episodes, reconciled with the store by the LLM.

mem0's ``Memory.add`` (``config.yaml`` names the values read in mem0ai/mem0), per finished episode:

1. **extract**: the LLM reads the episode and answers a JSON list of facts;
2. **update**: for each fact the ``similar_per_fact`` most similar stored memories are found;
   together (duplicates once) they are shown to the LLM under small integer ids (mem0 maps its
   UUIDs to "0", "1", ... so the model cannot invent one), with the new facts; the LLM answers one
   event per memory: ADD (a new memory), UPDATE (the memory of that id gets the new text, same
   id), DELETE (removed), NONE. An id that names no shown memory is ignored and counted.

Retrieval (mem0's ``search``): the ``search_limit`` memories most similar to the task's goal,
shown by the standard solver. The LLM is never trained; learning is the harness's experience
loop on train; frozen evaluation only reads; on the online track the harness calls ``extract``
and ``update`` after each test episode, so the memory keeps changing there.
"""

from __future__ import annotations

from typing import Any

import arena
from arena import (
    LEARN,
    Experience,
    Provenance,
    Run,
    SamplingParams,
    Task,
    Termination,
    Trajectory,
    episode_seed,
    typed_config,
)
from arena.plugins.mem0.prompts import (
    EVENTS_PREFIX,
    FACTS_PREFIX,
    facts_prompt,
    parse_events,
    parse_facts,
    update_prompt,
)
from arena.plugins.mem0.settings import Mem0Settings

MEMORY = "memory"
FACT = "fact"  # what ``extract`` hands ``update``; never stored as such


def provenance_of(trajectories: list[Trajectory]) -> Provenance:
    tasks = list(dict.fromkeys(t.task.task_id for t in trajectories))
    return Provenance(tuple(tasks), trajectories[0].task.split)


def apply_events(run: Run, events: list[dict[str, str]], shown: dict[str, Experience],
                 provenance: Provenance, task_type: str) -> dict[str, int]:
    """Apply the LLM's events to the store; returns how many of each kind were applied and how
    many named no shown memory (``unknown_id``) or came without text (``empty``)."""
    counts = dict.fromkeys(("ADD", "UPDATE", "DELETE", "NONE", "unknown_id", "empty"), 0)
    added: list[Experience] = []
    for event in events:
        kind, text = event["event"], event["text"]
        if not text:  # mem0 skips an event without text, whatever its kind
            counts["empty"] += 1
            continue
        if kind == "ADD":
            added.append(Experience(MEMORY, text, provenance, {"task_type": task_type, "updates": 0}))
            counts["ADD"] += 1
            continue
        old = shown.get(event["id"])
        if old is None:
            counts["unknown_id"] += 1
            continue
        if kind == "UPDATE":
            if text != old.text:  # mem0 keeps the id and records the change in its history
                run.store.delete([old.experience_id])
                sources = tuple(dict.fromkeys(old.provenance.source_task_ids + provenance.source_task_ids))
                updated = Experience(MEMORY, text, Provenance(sources, provenance.source_split),
                                     {**old.metadata, "updates": int(old.metadata.get("updates", 0)) + 1,
                                      "previous": old.text}, old.experience_id)
                run.store.add([updated])
                shown[event["id"]] = updated  # a second event on the id applies to the new text
            counts["UPDATE"] += 1
        elif kind == "DELETE":
            run.store.delete([old.experience_id])
            shown.pop(event["id"])
            counts["DELETE"] += 1
        else:
            counts["NONE"] += 1
    new = [e for e in added if not run.store.get([e.experience_id])]
    if new:
        run.store.add(list({e.experience_id: e for e in new}.values()))
    return counts


class Mem0:
    """Extract facts, reconcile them with the store, retrieve by similarity; no training."""

    def __init__(self, run: Run) -> None:
        self.cfg: Mem0Settings = typed_config(run.cfg.method, Mem0Settings)

    def _params(self, max_new_tokens: int, seed: int) -> SamplingParams:
        return SamplingParams(temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                              max_new_tokens=max_new_tokens, seed=seed)

    @staticmethod
    def _seed(run: Run, trajectory: Trajectory) -> int:
        """A seed of the episode's own, whatever order episodes end in."""
        return episode_seed(run.learn_seed, trajectory.task.task_id, "mem0")

    @arena.hookimpl
    def learn(self, run: Run) -> bool:
        run.store.count()  # the store exists (and is digested) even if no fact is ever added
        run.experience_loop()
        return True

    @arena.hookimpl
    def extract(self, run: Run, trajectories: list[Trajectory]) -> list[Experience]:
        """The facts of each finished episode (one batched call); none from an errored one."""
        episodes = [t for t in trajectories if t.status is not Termination.ERROR and t.steps]
        if not episodes:
            return []
        prefix = FACTS_PREFIX if self.cfg.reply_prefix else ""
        prompts = [facts_prompt(t, self.cfg.transcript_steps, run.env.instructions, prefix) for t in episodes]
        replies = run.llm.generate(prompts, self._params(self.cfg.facts_max_tokens, self._seed(run, episodes[0])))
        facts = []
        for trajectory, reply in zip(episodes, replies):
            for fact in parse_facts(prefix + reply.text, self.cfg.max_facts, self.cfg.parser):
                facts.append(Experience(FACT, fact, provenance_of([trajectory]),
                                        {"task_type": trajectory.task.task_type}))
        return facts

    @arena.hookimpl
    def update(self, run: Run, trajectories: list[Trajectory], experiences: list[Experience]) -> None:
        """Reconcile the new facts with the memories most similar to each (one LLM call)."""
        facts = [e for e in experiences if e.kind == FACT]
        counts = dict.fromkeys(("ADD", "UPDATE", "DELETE", "NONE", "unknown_id", "empty"), 0)
        if facts:
            shown: dict[str, Experience] = {}
            seen: set[str] = set()
            for fact in facts:
                for memory, _ in run.store.query(fact.text, k=self.cfg.similar_per_fact, kind=MEMORY):
                    if memory.experience_id not in seen:
                        seen.add(memory.experience_id)
                        shown[str(len(shown))] = memory
            prefix = EVENTS_PREFIX if self.cfg.reply_prefix else ""
            prompt = update_prompt([(key, m.text) for key, m in shown.items()], [f.text for f in facts], prefix)
            params = self._params(self.cfg.update_max_tokens, self._seed(run, trajectories[0]) + 1)
            (reply,) = run.llm.generate([prompt], params)
            events = parse_events(prefix + reply.text, self.cfg.parser)
            provenance = Provenance(tuple(dict.fromkeys(t for f in facts for t in f.provenance.source_task_ids)),
                                    facts[0].provenance.source_split)
            counts = apply_events(run, events, shown, provenance, str(facts[0].metadata.get("task_type", "")))
        if run.phase == LEARN and trajectories:
            run.log_metrics(run.budget.used["episodes"], {
                "success": sum(t.success for t in trajectories) / len(trajectories),
                "facts": len(facts), "memories": run.store.count(kind=MEMORY),
                **{f"events/{key.lower()}": value for key, value in counts.items()}})

    @arena.hookimpl
    def retrieve(self, run: Run, task: Task) -> list[Experience]:
        """The memories most similar to the task's goal (mem0's search). Read-only."""
        if not run.store_exists():
            return []
        found = run.store.query(task.goal, k=self.cfg.search_limit, kind=MEMORY,
                                min_similarity=self.cfg.search_threshold)
        return [memory for memory, _ in found]

    #: Exported: the memories (facts) as stored after the last ADD/UPDATE/DELETE.
    export = arena.export_stored(MEMORY)

    @arena.hookimpl
    def state_size(self, run: Run) -> dict[str, Any]:
        if not run.store_exists():
            return {"memories": 0}
        memories = run.store.all(kind=MEMORY)
        return {"memories": len(memories),
                "memories_updated": sum(1 for m in memories if int(m.metadata.get("updates", 0)) > 0)}
