"""MemRL: Q-update arithmetic, two-phase ranking, merge threshold, and the protocol end to end."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from arena.core import protocol
from arena.core.config.compose import compose
from arena.core.contract.types import Experience, Provenance, Step, Task, Termination, Trajectory
from arena.core.execution.context import EVALUATE, LEARN
from arena.core.services.embedder import HashingEmbedder
from arena.core.services.store import ExperienceStore
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.plugins.memrl.method import (
    INTENT,
    MEMORY,
    SNAPSHOT_NAME,
    Candidate,
    MemRL,
    q_update,
    rank_candidates,
)
from arena.testing import FakeLLM

GOALS = {
    "cool": "put a cool apple in cabinet.",
    "cool2": "put a cool apple in fridge.",
    "clean": "clean some mug and put it in shelf.",
    "heat": "put a hot potato in countertop.",
}


def task(key: str, split: str = "train", number: int = 0) -> Task:
    return Task(f"household/{split}/{key}{number}", "household", split, f"type_{key}", GOALS[key])


def episode(of: Task, won: bool, used: list[str] = (), status: Termination | None = None) -> Trajectory:
    steps = [Step("go to fridge 1", "You arrive at fridge 1.", True),
             Step("take apple 1 from fridge 1", "You pick up the apple 1.", True)]
    return Trajectory(task=of, initial_observation="You are in the middle of a room.", steps=steps,
                      status=status or (Termination.SUCCESS if won else Termination.STEP_LIMIT),
                      experience_ids=list(used))


def memory(key: str, q: float, intent_id: str, number: int = 0) -> Experience:
    return Experience(MEMORY, f"memory {key}{number} q={q}", Provenance((f"src-{key}{number}",), "train"),
                      {"intent": GOALS[key], "intent_id": intent_id, "q_value": q, "visits": 0,
                       "last_reward": 0.0, "success": q > 0, "task_type": key})


@pytest.fixture
def run(plugins):
    """What MemRL's hooks use of a RunContext: config, store, phase, LLM (a fake one)."""
    cfg = compose(plugins, "memrl", overrides=["llm.backend=fake"])
    prompts: list[str] = []

    def reply(chat):
        prompts.append(chat[-1]["content"])
        return "1. go to the fridge 2. take the apple" if "solved like this" in chat[-1]["content"] \
            else "I never opened the fridge."

    llm = FakeLLM(reply=reply)
    logged: list[tuple[int, dict]] = []
    return types.SimpleNamespace(cfg=cfg, learn_seed=int(cfg.learn.seed), store=ExperienceStore(None, HashingEmbedder()), phase=LEARN,
                                 track="frozen", llm=llm, prompts=prompts, has_store=lambda: True,
                                 # the episode an update follows is charged as it was played
                                 budget=types.SimpleNamespace(used={"episodes": 1}), logged=logged,
                                 env=types.SimpleNamespace(instructions=HOUSEHOLD_INSTRUCTIONS),
                                 log_metrics=lambda step, metrics: logged.append((step, dict(metrics))))


def add_intent(store: ExperienceStore, key: str) -> str:
    intent = Experience(INTENT, GOALS[key], Provenance((f"src-{key}",), "train"),
                        {"task_type": key, "memory_ids": []})
    store.add([intent])
    return intent.experience_id


def add_memories(store: ExperienceStore, memories: list[Experience]) -> None:
    """Store constructed memories and list each under its intent, as MemRL files them."""
    store.add(memories)
    for memory_ in memories:
        [intent] = store.get([memory_.metadata["intent_id"]])
        listed = intent.metadata["memory_ids"] + [memory_.experience_id]
        store.update_metadata(intent.experience_id, {"memory_ids": listed})


# -- Q-values -----------------------------------------------------------------------------------


def test_q_update_arithmetic():
    assert q_update(0.0, 1.0, 0.3) == pytest.approx(0.3)
    assert q_update(0.3, -1.0, 0.3) == pytest.approx(0.7 * 0.3 - 0.3)  # -0.09
    assert q_update(0.5, 1.0, 0.0) == 0.5 and q_update(0.5, -1.0, 1.0) == -1.0
    q = 0.0
    for _ in range(50):
        q = q_update(q, 1.0, 0.3)
    assert 0.999 < q < 1.0  # converges to the reward from below


def test_update_moves_q_of_retrieved_memories_only(plugins, run):
    method = MemRL(run)
    intent = add_intent(run.store, "cool")
    used = [memory("cool", 0.5, intent, 1), memory("cool", -0.2, intent, 2)]
    untouched = memory("cool", 0.1, intent, 3)
    run.store.add(used + [untouched])
    ids = [m.experience_id for m in used]

    method.update(run, [episode(task("cool"), won=True, used=ids + [intent])], [])
    first, second, third = run.store.get(ids + [untouched.experience_id])
    assert first.metadata["q_value"] == pytest.approx(0.7 * 0.5 + 0.3)  # 0.65
    assert second.metadata["q_value"] == pytest.approx(0.7 * -0.2 + 0.3)  # 0.16
    assert (first.metadata["visits"], first.metadata["last_reward"]) == (1, 1.0)
    assert third.metadata == untouched.metadata  # not retrieved, not changed
    # The step's figures, logged for the learning curve (run.log_metrics).
    assert run.logged == [(1, {"success": 1.0, "reward": 1.0, "memories": 3, "intents": 1, "q_updated": 2,
                               "mean_q_updated": pytest.approx((0.65 + 0.16) / 2)})]

    method.update(run, [episode(task("cool"), won=False, used=ids[:1])], [])
    [again] = run.store.get(ids[:1])
    assert again.metadata["q_value"] == pytest.approx(0.7 * 0.65 - 0.3)  # 0.155
    assert (again.metadata["visits"], again.metadata["last_reward"]) == (2, -1.0)

    before = run.store.digest()  # a crashed episode teaches nothing
    method.update(run, [episode(task("cool"), won=False, used=ids, status=Termination.ERROR)], [])
    assert run.store.digest() == before


# -- phase A and phase B ---------------------------------------------------------------------


def test_phase_b_ranks_by_weighted_z_scores():
    def cand(name, sim, q):
        return Candidate(Experience(MEMORY, name, Provenance((name,), "train"), {"q_value": q},
                                    experience_id=name), sim)

    candidates = [cand("A", 0.9, 0.0), cand("B", 0.6, 1.0), cand("C", 0.7, -1.0), cand("D", 0.6, 0.0)]
    kwargs = dict(weight_sim=0.5, weight_q=0.5, sim_mean=0.5187, sim_std=0.1203, q_clip=3.0)
    ranked = rank_candidates(candidates, **kwargs)
    # Q: mean 0, std sqrt(1/2) -> z = 0, 1.414, -1.414, 0; sim z = (sim - 0.5187) / 0.1203.
    expected = {"A": 0.5 * (0.9 - 0.5187) / 0.1203,
                "B": 0.5 * (0.6 - 0.5187) / 0.1203 + 0.5 * np.sqrt(2),
                "C": 0.5 * (0.7 - 0.5187) / 0.1203 - 0.5 * np.sqrt(2),
                "D": 0.5 * (0.6 - 0.5187) / 0.1203}
    assert [c.memory.experience_id for c, _ in ranked] == ["A", "B", "D", "C"]
    assert {c.memory.experience_id: s for c, s in ranked} == pytest.approx(expected)
    # Q alone, similarity alone: the order follows the one term (ties: the candidates' order).
    q_only = rank_candidates(candidates, **{**kwargs, "weight_sim": 0.0})
    assert [c.memory.experience_id for c, _ in q_only] == ["B", "A", "D", "C"]
    sim_only = rank_candidates(candidates, **{**kwargs, "weight_q": 0.0})
    assert [c.memory.experience_id for c, _ in sim_only] == ["A", "C", "B", "D"]
    # Equal Q-values carry no information (z = 0); an outlier's z is clipped to q_clip.
    flat = rank_candidates([cand("X", 0.6, 0.4), cand("Y", 0.8, 0.4)], **kwargs)
    assert [s for _, s in flat] == pytest.approx([0.5 * (0.8 - 0.5187) / 0.1203,
                                                   0.5 * (0.6 - 0.5187) / 0.1203])
    crowd = [cand(f"m{i}", 0.5187, 0.0) for i in range(10)] + [cand("outlier", 0.5187, 100.0)]
    top, score = rank_candidates(crowd, **kwargs)[0]
    assert top.memory.experience_id == "outlier" and score == pytest.approx(0.5 * 3.0)
    assert rank_candidates([], **kwargs) == []


def test_two_phase_retrieval_on_a_constructed_memory(plugins, run):
    run.cfg.method.k1 = 2
    run.cfg.method.k2 = 3
    store = run.store
    similarity = {key: float(HashingEmbedder().similarity([GOALS["cool"]], [goal])[0, 0])
                  for key, goal in GOALS.items()}
    assert similarity["cool"] > similarity["cool2"] > max(similarity["clean"], similarity["heat"])
    run.cfg.method.sim_threshold = (similarity["cool2"] + max(similarity["clean"], similarity["heat"])) / 2
    intents = {key: add_intent(store, key) for key in GOALS}
    items = [memory("cool", -0.5, intents["cool"], 1), memory("cool", 0.9, intents["cool"], 2),
             memory("cool2", 0.8, intents["cool2"], 1), memory("cool2", -0.9, intents["cool2"], 2),
             memory("clean", 1.0, intents["clean"], 1), memory("heat", 1.0, intents["heat"], 1)]
    add_memories(store, items)

    method = MemRL(run)
    candidates = method.candidates(run, task("cool"))
    # Phase A: only the two intents above the threshold; their four memories are the candidates.
    assert {c.memory.experience_id for c in candidates} == {m.experience_id for m in items[:4]}
    assert sorted({round(c.similarity, 4) for c in candidates}) == pytest.approx(
        sorted([similarity["cool2"], similarity["cool"]]), abs=1e-4)
    expected = rank_candidates(candidates, weight_sim=0.5, weight_q=0.5, sim_mean=0.5187,
                               sim_std=0.1203, q_clip=3.0)
    retrieved = method.retrieve(run, task("cool"))
    assert [m.experience_id for m in retrieved] == [c.memory.experience_id for c, _ in expected[:3]]
    assert retrieved[0].experience_id == items[1].experience_id  # most similar intent, best Q
    assert items[3].experience_id not in {m.experience_id for m in retrieved}  # worst Q, dropped

    method.cfg.k1 = 1  # top k1 intents only
    assert {m.metadata["intent_id"] for m in method.retrieve(run, task("cool"))} == {intents["cool"]}
    method.cfg.sim_threshold = 1.01  # nothing similar enough: nothing retrieved
    assert method.retrieve(run, task("cool")) == []


def test_epsilon_explores_only_while_learning(plugins, run):
    intent = add_intent(run.store, "cool")
    items = [memory("cool", q, intent, i) for i, q in enumerate([0.9, 0.8, 0.7, -0.7, -0.8, -0.9])]
    add_memories(run.store, items)
    greedy = [m.experience_id for m in MemRL(run).retrieve(run, task("cool"))]
    assert greedy == [m.experience_id for m in items[:3]]
    run.cfg.method.epsilon = 1.0
    method = MemRL(run)
    explored = [m.experience_id for m in method.retrieve(run, task("cool"))]
    assert len(explored) == 3 and set(explored) <= {m.experience_id for m in items}
    assert explored == [m.experience_id for m in method.retrieve(run, task("cool"))]  # seeded
    draws = {tuple(m.experience_id for m in method.retrieve(run, task("cool", number=n)))
             for n in range(8)}
    assert len(draws) > 1 and draws != {tuple(greedy)}  # random picks, not the greedy top 3
    run.phase = EVALUATE
    assert [m.experience_id for m in method.retrieve(run, task("cool"))] == greedy


# -- new memories ----------------------------------------------------------------------------


def test_extract_writes_a_script_for_success_and_a_reflection_for_failure(plugins, run):
    method = MemRL(run)
    won, lost = episode(task("cool"), won=True), episode(task("heat"), won=False)
    crashed = episode(task("clean"), won=False, status=Termination.ERROR)
    memories = method.extract(run, [won, lost, crashed])
    assert [m.metadata["success"] for m in memories] == [True, False]  # the crash is skipped
    success, failure = memories
    assert success.text.startswith("SUCCESSFUL") and "1. go to the fridge" in success.text
    assert failure.text.startswith("FAILED") and "I never opened the fridge." in failure.text
    assert "take apple 1 from fridge 1" in success.text  # the actions are kept
    assert (success.metadata["q_value"], success.metadata["visits"]) == (0.0, 0)
    assert success.metadata["intent"] == GOALS["cool"]
    assert success.provenance == Provenance((won.task.task_id,), "train")
    assert sum("solved like this" in p for p in run.prompts) == 1 and len(run.prompts) == 2


def test_reflections_sample_at_the_authors_temperature_and_scripts_are_greedy(plugins, run):
    seen: list[float] = []
    generate = run.llm.generate

    def recording(prompts, params):
        seen.append(params.temperature)
        return generate(prompts, params)

    run.llm.generate = recording
    MemRL(run).extract(run, [episode(task("cool"), won=True), episode(task("heat"), won=False)])
    assert seen == [0.0, 0.3]  # script greedy, reflection at 0.3 (memrl/service/updater.py:264)


def test_merge_threshold_decides_between_joining_and_a_new_intent(plugins, run):
    similarity = float(HashingEmbedder().similarity([GOALS["cool"]], [GOALS["cool2"]])[0, 0])
    assert 0.5 < similarity < 0.99
    method = MemRL(run)
    method.update(run, [], method.extract(run, [episode(task("cool"), won=True)]))
    [cool_intent] = run.store.all(kind=INTENT)

    method.cfg.merge_threshold = similarity - 0.005  # just below: joins the existing intent
    method.update(run, [], method.extract(run, [episode(task("cool2", number=1), won=True)]))
    assert run.store.count(kind=INTENT) == 1
    [joined] = run.store.all(kind=MEMORY, where={"intent": GOALS["cool2"]})
    [first] = run.store.all(kind=MEMORY, where={"intent": GOALS["cool"]})
    assert joined.metadata["intent_id"] == cool_intent.experience_id
    [listing] = run.store.get([cool_intent.experience_id])
    assert listing.metadata["memory_ids"] == [first.experience_id, joined.experience_id]

    method.cfg.merge_threshold = similarity + 0.005  # just above: a new intent of its own
    method.update(run, [], method.extract(run, [episode(task("cool2", number=2), won=False)]))
    assert run.store.count(kind=INTENT) == 2 and run.store.count(kind=MEMORY) == 3
    [own] = run.store.all(kind=MEMORY, where={"success": False})
    [new_intent] = run.store.all(kind=INTENT, where={"task_type": "type_cool2"})
    assert own.metadata["intent_id"] == new_intent.experience_id != cool_intent.experience_id
    assert new_intent.text == GOALS["cool2"]

    method.cfg.merge_threshold = 0.9  # the authors' value: same-goal tasks share an intent
    method.update(run, [], method.extract(run, [episode(task("cool2", number=3), won=True)]))
    assert run.store.count(kind=INTENT) == 2
    assert len(run.store.all(kind=MEMORY, where={"intent_id": new_intent.experience_id})) == 2


def test_a_memory_filed_twice_keeps_its_q_value(plugins, run):
    method = MemRL(run)
    [new] = method.extract(run, [episode(task("cool"), won=True)])
    method.update(run, [], [new])
    method.update(run, [episode(task("cool"), won=True, used=[new.experience_id])], [])
    method.update(run, [], [new])  # the same episode written again (e.g. a replayed update)
    [stored] = run.store.all(kind=MEMORY)
    assert stored.metadata["q_value"] == pytest.approx(0.3) and stored.metadata["visits"] == 1


def test_invalid_settings_are_refused(plugins, run):
    run.cfg.method.k2 = 0
    with pytest.raises(ValueError, match="method.k2 must be >= 1"):
        MemRL(run)


# -- the protocol end to end (tiny model) ----------------------------------------------------

TINY = ["llm.model=tiny", "embedder.name=hashing", "env.n_train=30", "env.n_valid=4", "env.n_test=4",
        "eval.limit=2", "eval.max_steps=3", "learn.max_steps=3", "eval.concurrency=2",
        "learn.budget.episodes=4", "method.script_max_tokens=8", "method.reflection_max_tokens=8",
        # recall every stored intent, so evaluation certainly retrieves memories
        "method.sim_threshold=-1.0"]


def read_episodes(path):
    return [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_learns_on_train_and_evaluates_frozen(plugins, tmp_path):
    path, results = protocol.run("memrl", overrides=TINY, out=tmp_path / "m", plugins=plugins)
    assert results.valid is True, results.violations
    assert results.track == "frozen" and results.method == "memrl"
    assert results.state.digest_before_eval == results.state.digest_after_eval
    saved = json.loads((path / "results.json").read_text())
    for key in ("splits", "cost", "state", "provenance", "learn"):
        assert saved[key] == results.to_json()[key]
    for split in ("test_seen", "test_unseen"):
        assert saved["splits"][split]["n_episodes"] == 2
    episodes = read_episodes(path)
    learned = [e for e in episodes if e["phase"] == "learn"]
    assert len(learned) == 4 and {e["split"] for e in learned} == {"train"}
    sizes = results.state.method
    assert sizes["memories"] == 4 and 1 <= sizes["intents"] <= 4  # one memory per episode
    assert results.state.memory_items == sizes["memories"] + sizes["intents"]
    assert results.cost.learn.llm_calls > sum(e["llm_calls"] for e in learned)  # writing

    store = ExperienceStore(path / "store", HashingEmbedder())
    memories = {m.experience_id: m for m in store.all(kind=MEMORY)}
    assert all(m.provenance.source_split == "train" for m in memories.values())
    evaluated = [e for e in episodes if e["phase"] == "evaluate"]
    assert all(1 <= len(e["experience_ids"]) <= 3 for e in evaluated)
    assert all(i in memories for e in evaluated for i in e["experience_ids"])
    # frozen: nothing used at evaluation was visited again
    visits_from_learning = sum(m.metadata["visits"] for m in memories.values())
    assert visits_from_learning == sum(len(e["experience_ids"]) for e in learned)
    header = ExperienceStore.read_snapshot_header(path / "method" / SNAPSHOT_NAME)
    assert header["digest"] == store.digest() and header["count"] == store.count()


@pytest.mark.slow
def test_online_track_updates_q_on_test_episodes(plugins, tmp_path):
    path, results = protocol.run("memrl", overrides=TINY + ["run.track=online"], out=tmp_path / "o",
                                 plugins=plugins)
    assert results.track == "online" and results.valid is True, results.violations
    assert results.state.digest_before_eval != results.state.digest_after_eval
    after_learning = ExperienceStore(None, HashingEmbedder())
    after_learning.restore(path / "method" / SNAPSHOT_NAME)
    learned_q = {m.experience_id: m.metadata for m in after_learning.all(kind=MEMORY)}
    store = ExperienceStore(path / "store", HashingEmbedder())
    now = {m.experience_id: m for m in store.all(kind=MEMORY)}
    evaluated = [e for e in read_episodes(path) if e["phase"] == "evaluate"]
    used_at_test = {i for e in evaluated for i in e["experience_ids"]}
    assert used_at_test & set(learned_q)  # learned memories were used on test episodes
    for memory_id in used_at_test & set(learned_q):
        assert now[memory_id].metadata["visits"] > learned_q[memory_id]["visits"]
        assert now[memory_id].metadata["q_value"] != learned_q[memory_id]["q_value"]
    # every test episode left a memory, filed with its test provenance
    from_tests = [m for m in now.values() if m.provenance.source_split.startswith("test")]
    assert len(from_tests) == len(evaluated) == 4
    assert all(e["track"] == "online" for e in evaluated)


@pytest.mark.slow
def test_embedder_dependent_constants_are_measured_for_minilm(plugins):
    """sim_norm_mean/std and both thresholds are the authors' values carried over to MiniLM by
    scripts/memrl_similarity_stats.py; the config must hold what that procedure measures."""
    import importlib.util
    from pathlib import Path

    from arena.core.config.compose import compose

    path = Path(__file__).resolve().parents[1] / "scripts" / "memrl_similarity_stats.py"
    spec = importlib.util.spec_from_file_location("memrl_similarity_stats", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    measured = module.measure()
    method = compose(plugins, "memrl").method
    for name, value in measured.items():
        assert float(method[name]) == pytest.approx(value, abs=1e-3), name
    assert compose(plugins, "memrl").embedder.name == "minilm"
