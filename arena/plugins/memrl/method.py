"""MemRL: an episodic memory whose items earn Q-values from the environment's reward.

The LLM stays frozen; what learns is the memory (``methods.md`` section 3, defaults in
``config.yaml``). Two kinds of item live in the run's experience store:

* an **intent** (kind ``intent``): a task text, the key memories are filed under, with the
  ids of its memories (``memory_ids``);
* a **memory** (kind ``memory``): a success script or a failure reflection with its metadata
  ``intent_id``, ``q_value``, ``visits``, ``last_reward``, ``success``, ``task_type``.

Per episode: phase A recalls the ``k1`` intents most similar to the task (cosine >=
``sim_threshold``); phase B ranks all their memories by ``weight_sim * z(sim) + weight_q * z(Q)``
and gives the top ``k2`` to the standard solver; after the episode every retrieved memory gets
``Q <- (1 - alpha) Q + alpha r`` and a new memory (script or reflection) joins the nearest intent
at similarity >= ``merge_threshold`` or starts a new one.

Learning runs through the harness's loop (retrieve -> solve -> extract -> update) on train only;
frozen evaluation only reads (retrieval never writes); on the ``online`` track the harness calls
``extract`` and ``update`` after each test episode, so Q-values and memories keep changing there.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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
    typed_config,
)
from arena.plugins.memrl.prompts import (
    action_line,
    failure_memory,
    reflection_prompt,
    script_prompt,
    success_memory,
)
from arena.plugins.memrl.settings import MemRLSettings

INTENT = "intent"
MEMORY = "memory"
SNAPSHOT_NAME = "memory-after-learning.jsonl.gz"


def q_update(q_value: float, reward: float, alpha: float) -> float:
    """One Monte-Carlo step toward the episode's reward (the authors use gamma = 0)."""
    return (1.0 - alpha) * q_value + alpha * reward


@dataclass(frozen=True)
class Candidate:
    """A memory recalled in phase A, with the similarity of its intent to the new task."""

    memory: Experience
    similarity: float

    @property
    def q_value(self) -> float:
        return float(self.memory.metadata.get("q_value", 0.0))


def rank_candidates(
    candidates: Sequence[Candidate],
    *,
    weight_sim: float,
    weight_q: float,
    sim_mean: float,
    sim_std: float,
    q_clip: float,
) -> list[tuple[Candidate, float]]:
    """Phase B: candidates with their scores, best first.

    Similarity is z-scored with fixed corpus statistics, Q with the candidates' own mean and
    (population) standard deviation, clipped to ``+-q_clip``; equal Q-values all score z = 0.
    Equal scores keep the candidates' order (the authors' stable sort,
    ``memory_service.py:1465``): intents most similar first, each intent's memories in the order
    they were filed, so of two memories with the same Q the older is shown.
    """
    if not candidates:
        return []
    if sim_std <= 0:
        raise ValueError(f"method.sim_norm_std must be > 0, got {sim_std}")
    q_values = np.array([c.q_value for c in candidates], dtype=np.float64)
    spread = float(q_values.std())
    z_q = (np.zeros_like(q_values) if spread < 1e-12
           else np.clip((q_values - q_values.mean()) / spread, -q_clip, q_clip))
    scored = [
        (candidate, weight_sim * (candidate.similarity - sim_mean) / sim_std + weight_q * float(z))
        for candidate, z in zip(candidates, z_q)
    ]
    return sorted(scored, key=lambda item: -item[1])


def reward_of(trajectory: Trajectory, cfg: MemRLSettings) -> float:
    return cfg.success_reward if trajectory.success else cfg.failure_reward


class MemRL:
    """Two-phase retrieval over a Q-valued episodic memory; the LLM is never trained."""

    def __init__(self, run: Run) -> None:
        self.cfg: MemRLSettings = typed_config(run.cfg.method, MemRLSettings)

    # -- learning --------------------------------------------------------------------------

    @arena.hookimpl
    def learn(self, run: Run) -> bool:
        """The harness's experience loop, then (optionally) a snapshot of the learned memory."""
        run.experience_loop()
        if self.cfg.snapshot:
            run.store.snapshot(run.method_state.folder / SNAPSHOT_NAME)
        return True

    @arena.hookimpl
    def extract(self, run: Run, trajectories: list[Trajectory]) -> list[Experience]:
        """A new memory per finished episode: a script of a success, a reflection on a failure.

        Episodes that ended in an error (a crash, not the environment's verdict) teach nothing.
        """
        learnable = [t for t in trajectories if t.status is not Termination.ERROR and t.steps]
        if not learnable:
            return []
        won = [t for t in learnable if t.success]
        lost = [t for t in learnable if not t.success]
        steps = self.cfg.prompt_steps
        texts: dict[int, str] = {}
        for group, make_prompt, tokens, temperature in (
            (won, script_prompt, self.cfg.script_max_tokens, 0.0),
            (lost, reflection_prompt, self.cfg.reflection_max_tokens,
             self.cfg.reflection_temperature),
        ):
            if group:
                params = SamplingParams(temperature=temperature, max_new_tokens=tokens, seed=0)
                generations = run.llm.generate([make_prompt(t, steps, run.env.instructions) for t in group], params)
                texts.update({id(t): g.text.strip() for t, g in zip(group, generations)})
        memories = []
        for trajectory in learnable:
            task = trajectory.task
            actions = action_line(trajectory, self.cfg.max_action_chars)
            written = texts[id(trajectory)] or "(the model wrote nothing)"
            content = (success_memory(task.goal, written, actions) if trajectory.success
                       else failure_memory(task.goal, written, actions))
            memories.append(Experience(
                kind=MEMORY,
                text=content,
                provenance=Provenance((task.task_id,), task.split),
                metadata={
                    "intent": task.goal,
                    "task_type": task.task_type,
                    "success": trajectory.success,
                    "q_value": self.cfg.q_init,
                    "visits": 0,
                    "last_reward": 0.0,
                },
            ))
        return memories

    @arena.hookimpl
    def update(self, run: Run, trajectories: list[Trajectory],
               experiences: list[Experience]) -> None:
        """Q-update every memory the episodes retrieved, then file the new memories."""
        alpha = self.cfg.alpha
        changes: dict[str, dict[str, Any]] = {}
        for trajectory in trajectories:
            if trajectory.status is Termination.ERROR:
                continue
            reward = reward_of(trajectory, self.cfg)
            for memory in run.store.get(trajectory.experience_ids):
                if memory.kind != MEMORY:
                    continue
                current = changes.get(memory.experience_id, memory.metadata)
                changes[memory.experience_id] = {
                    "q_value": q_update(float(current.get("q_value", 0.0)), reward, alpha),
                    "visits": int(current.get("visits", 0)) + 1,
                    "last_reward": reward,
                }
        run.store.update_metadata_many(changes)
        for memory in experiences:
            if memory.kind == MEMORY:
                self._file(run, memory)
        if run.phase == LEARN and trajectories:  # step: the episode just played (charged)
            updated = [float(c["q_value"]) for c in changes.values()]
            run.log_metrics(run.budget.used["episodes"], {
                "success": sum(t.success for t in trajectories) / len(trajectories),
                "reward": sum(reward_of(t, self.cfg) for t in trajectories) / len(trajectories),
                "memories": run.store.count(kind=MEMORY), "intents": run.store.count(kind=INTENT),
                "q_updated": len(updated), "mean_q_updated": sum(updated) / len(updated) if updated else 0.0})

    def _file(self, run: Run, memory: Experience) -> None:
        """Add a memory under the nearest intent at >= merge_threshold, or under a new intent.

        A memory identical to a stored one (same text, same source task) is the same memory:
        it is not added again, so its Q-value is kept.
        """
        if run.store.get([memory.experience_id]):
            return
        goal = str(memory.metadata["intent"])
        nearest = run.store.query(goal, k=1, kind=INTENT,
                                  min_similarity=self.cfg.merge_threshold)
        # The intent lists its memories first (the authors' {intent: [memory ids]}): a run killed
        # in between leaves an id that resolves to nothing and is filed again on the replay.
        if nearest:
            intent = nearest[0][0]
            listed = list(intent.metadata.get("memory_ids", []))
            if memory.experience_id not in listed:
                run.store.update_metadata(intent.experience_id,
                                          {"memory_ids": [*listed, memory.experience_id]})
        else:
            intent = Experience(kind=INTENT, text=goal, provenance=memory.provenance,
                                metadata={"task_type": memory.metadata.get("task_type", ""),
                                          "memory_ids": [memory.experience_id]})
            run.store.add([intent])
        filed = Experience(memory.kind, memory.text, memory.provenance,
                           {**memory.metadata, "intent_id": intent.experience_id},
                           memory.experience_id)
        # Indexed by its own text: phase A searches intents only, so memories need not crowd
        # around their intent's vector.
        run.store.add([filed])

    # -- retrieval ------------------------------------------------------------------------

    def candidates(self, run: Run, task: Task) -> list[Candidate]:
        """Phase A: every memory of the ``k1`` intents at similarity >= ``sim_threshold``."""
        recalled = run.store.query(task.goal, k=self.cfg.k1, kind=INTENT,
                                   min_similarity=self.cfg.sim_threshold)
        if not recalled:
            return []
        similarity = {intent.experience_id: score for intent, score in recalled}
        listed = [memory_id for intent, _ in recalled
                  for memory_id in intent.metadata.get("memory_ids", [])]
        memories = run.store.get(dict.fromkeys(listed))
        return [Candidate(m, similarity[m.metadata["intent_id"]]) for m in memories
                if m.kind == MEMORY and m.metadata.get("intent_id") in similarity]

    @arena.hookimpl
    def retrieve(self, run: Run, task: Task) -> list[Experience]:
        """Phase A then phase B (or, while learning, epsilon-greedy random picks). Read-only."""
        candidates = self.candidates(run, task)
        k2 = self.cfg.k2
        epsilon = self.cfg.epsilon
        if candidates and epsilon > 0 and run.phase == LEARN:
            rng = random.Random(f"{run.learn_seed}|{task.task_id}|{run.store.count()}")
            if rng.random() < epsilon:
                return [c.memory for c in rng.sample(candidates, min(k2, len(candidates)))]
        ranked = rank_candidates(
            candidates,
            weight_sim=self.cfg.weight_sim,
            weight_q=self.cfg.weight_q,
            sim_mean=self.cfg.sim_norm_mean,
            sim_std=self.cfg.sim_norm_std,
            q_clip=self.cfg.q_clip,
        )
        return [candidate.memory for candidate, _ in ranked[:k2]]

    # -- reporting --------------------------------------------------------------------------

    #: Exported: the memories with their Q-values (intents are only their keys).
    export = arena.export_stored(MEMORY)

    @arena.hookimpl
    def state_size(self, run: Run) -> dict[str, Any]:
        if not run.store_exists():
            return {"intents": 0, "memories": 0}
        memories = run.store.all(kind=MEMORY)
        q_values = [float(m.metadata.get("q_value", 0.0)) for m in memories]
        return {
            "intents": run.store.count(kind=INTENT),
            "memories": len(memories),
            "memories_from_success": sum(1 for m in memories if m.metadata.get("success")),
            "mean_q_value": round(float(np.mean(q_values)), 4) if q_values else 0.0,
            "snapshot": str(Path("method") / SNAPSHOT_NAME) if self.cfg.snapshot else None,
        }
