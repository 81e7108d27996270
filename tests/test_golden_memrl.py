"""MemRL against its authors' own outputs (tests/golden/memrl.yaml): the Q-value update on a
fixed sequence of rewards and the two-phase retrieval on a fixed memory."""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from arena.core.config.compose import compose
from arena.core.contract.types import Experience, Provenance, Step, Task, Termination, Trajectory
from arena.core.execution.context import EVALUATE
from arena.core.services.embedder import Embedder
from arena.core.services.store import ExperienceStore
from arena.plugins.memrl.method import INTENT, MEMORY, MemRL, q_update, reward_of

CASES = {case["name"]: case for case in
         yaml.safe_load((Path(__file__).parent / "golden" / "memrl.yaml").read_text())["cases"]}
QUERY = "the task of the golden case"


def case(prefix: str) -> dict[str, Any]:
    (found,) = [value for name, value in CASES.items() if name.startswith(prefix)]
    return found


class FixedEmbedder(Embedder):
    """Each intent's text at its given cosine to the task's; any other text orthogonal to both."""

    name = "golden-fixed"
    dim = 3

    def __init__(self, similarity: dict[str, float]) -> None:
        self.vectors = {QUERY: [1.0, 0.0, 0.0]}
        self.vectors.update({text: [s, math.sqrt(1.0 - s * s), 0.0] for text, s in similarity.items()})

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.array([self.vectors.get(text, [0.0, 0.0, 1.0]) for text in texts], dtype=np.float32)


def test_q_update_follows_the_authors_on_a_sequence_of_rewards(plugins) -> None:
    golden = case("q-value update")
    cfg = compose(plugins, "memrl", preset="paper").method
    settings = types.SimpleNamespace(success_reward=float(cfg.success_reward),
                                     failure_reward=float(cfg.failure_reward))
    assert (float(cfg.q_init), float(cfg.alpha)) == (golden["input"]["q_init"], golden["input"]["alpha"])
    task = Task("household/train/t0", "household", "train", "t", QUERY)
    q, seen = float(cfg.q_init), []
    for won in golden["input"]["won"]:
        episode = Trajectory(task=task, initial_observation="", steps=[Step("look", "ok", True)],
                             status=Termination.SUCCESS if won else Termination.STEP_LIMIT)
        q = q_update(q, reward_of(episode, settings), float(cfg.alpha))  # type: ignore[arg-type]
        seen.append(q)
    assert seen == pytest.approx(golden["expected"]["q"], abs=1e-9)


def test_two_phase_retrieval_ranks_as_the_authors(plugins) -> None:
    golden = case("two-phase retrieval")
    intents = golden["input"]["intents"]
    overrides = [f"method.{key}={value}" for key, value in golden["input"]["settings"].items()]
    cfg = compose(plugins, "memrl", overrides=["llm.backend=fake", *overrides])
    store = ExperienceStore(None, FixedEmbedder({name: spec["similarity"] for name, spec in intents.items()}))
    # Ids in the reverse of filing order, so a tie broken by id (not by filing order) shows.
    names = [name for spec in intents.values() for name, _ in spec["memories"]]
    ids = {name: f"memory-{len(names) - number:02d}" for number, name in enumerate(names)}
    for intent_name, spec in intents.items():
        intent = Experience(INTENT, intent_name, Provenance((f"src-{intent_name}",), "train"),
                            {"task_type": "t", "memory_ids": [ids[name] for name, _ in spec["memories"]]})
        store.add([intent])
        store.add([Experience(MEMORY, f"memory {name}", Provenance((f"src-{name}",), "train"),
                              {"intent": intent_name, "intent_id": intent.experience_id, "q_value": q,
                               "success": q > 0, "visits": 0, "last_reward": 0.0, "task_type": "t"},
                              experience_id=ids[name])
                   for name, q in spec["memories"]])
    run = types.SimpleNamespace(cfg=cfg, store=store, phase=EVALUATE, learn_seed=0)
    method = MemRL(run)  # type: ignore[arg-type]
    task = Task("household/test_seen/x", "household", "test_seen", "t", QUERY)
    by_id = {value: key for key, value in ids.items()}

    candidates = method.candidates(run, task)  # type: ignore[arg-type]
    recalled = list(dict.fromkeys(c.memory.metadata["intent"] for c in candidates))
    assert recalled == golden["expected"]["intents_recalled"]
    from arena.plugins.memrl.method import rank_candidates

    ranked = rank_candidates(candidates, weight_sim=method.cfg.weight_sim, weight_q=method.cfg.weight_q,
                             sim_mean=method.cfg.sim_norm_mean, sim_std=method.cfg.sim_norm_std,
                             q_clip=method.cfg.q_clip)
    assert [[by_id[c.memory.experience_id], round(score, 6)] for c, score in ranked] == [
        [name, pytest.approx(score, abs=2e-6)] for name, score in golden["expected"]["ranked"]]
    retrieved = method.retrieve(run, task)  # type: ignore[arg-type]
    assert [by_id[m.experience_id] for m in retrieved] == golden["expected"]["selected"]
