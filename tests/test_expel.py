"""ExpeL: operation parsing, weight bookkeeping, few-shot retrieval, Reflexion retries, and the
whole method on the household world (learn, frozen evaluation, resume)."""

from __future__ import annotations

import json
import re
import threading
import types

import pytest
from omegaconf import OmegaConf

import arena
from arena.core import protocol
from arena.core.contract.llm import Choice, Generation
from arena.core.contract.types import Experience, Provenance, Task
from arena.core.services.embedder import HashingEmbedder
from arena.core.services.store import ExperienceStore
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.plugins.expel.insights import Insight, InsightBook, Operation, parse_operations
from arena.plugins.expel.method import ExpeL, select_fewshots, trials_needed
from arena.plugins.expel.prompts import (
    CRITIC_SYSTEM,
    FEWSHOTS_HEADER,
    REFLECTION_REQUEST,
    insights_header,
)
from arena.testing import FakeLLM
from tests.helpers.overrides import FAST

INSIGHTS_HEADER = insights_header(HOUSEHOLD_INSTRUCTIONS)  # the runs here are on the household world

# -- operation parsing ------------------------------------------------------------------------


def test_parse_well_formed_operations():
    text = (
        "Let me compare the two trials first.\n"
        "ADD 3: Open a closed receptacle before looking for objects inside it.\n"
        "- AGREE 1: Go to the likeliest receptacle first.\n"
        "2. EDIT 2: Heat an object with the microwave, then put it down.\n"
        "REMOVE #1: Go to the likeliest receptacle first.\n"
        "ADD: Check the inventory after taking an object.\n"
    )
    parsed = parse_operations(text)
    assert parsed.malformed == 0
    assert parsed.operations == [
        Operation("ADD", 3, "Open a closed receptacle before looking for objects inside it."),
        Operation("AGREE", 1, "Go to the likeliest receptacle first."),
        Operation("EDIT", 2, "Heat an object with the microwave, then put it down."),
        Operation("REMOVE", 1, "Go to the likeliest receptacle first."),
        Operation("ADD", None, "Check the inventory after taking an object."),
    ]


def test_parse_malformed_operations_are_counted_not_raised():
    text = (
        "ADD 1 Open the fridge first.\n"          # no colon
        "EDIT: Edit without a rule number.\n"       # EDIT needs a number
        "ADD 2: A rule that was cut off by the token lim\n"  # no final period
        "AGREE 1: ADD 2: two operations on one line.\n"  # nested operation keyword
        "REMOVE 3:\n"                               # empty rule
        "ADDX 1: not an operation keyword, ignored.\n"
    )
    parsed = parse_operations(text)
    assert parsed.operations == []
    assert parsed.malformed == 5
    assert parse_operations("").malformed == 0 and parse_operations("no operations here").operations == []


def test_parse_mixed_output_keeps_the_good_operations():
    text = "ADD 1: Take the object before going to the target.\nEDIT 9 broken\nAGREE 1: Think.\nREMOVE 2 nope"
    parsed = parse_operations(text)
    assert [(o.kind, o.number) for o in parsed.operations] == [("ADD", 1), ("AGREE", 1)]
    assert parsed.malformed == 2


# -- weight bookkeeping -----------------------------------------------------------------------


def book_with(*weights: int, max_insights: int = 10) -> InsightBook:
    insights = [Insight(f"insight-{n:04d}", f"Rule number {n}.", w) for n, w in enumerate(weights, start=1)]
    return InsightBook(max_insights, insights=insights, next_number=len(weights) + 1)


def test_add_starts_at_two_agree_and_edit_add_one():
    book = book_with(3, 2)
    report = book.apply([
        Operation("ADD", None, "A brand new rule."),
        Operation("AGREE", 2, "Rule number 2."),
        Operation("EDIT", 1, "Rule number 1, made more general."),
    ], sources=["t1"])
    assert report.applied == {"ADD": 1, "AGREE": 1, "EDIT": 1, "REMOVE": 0}
    assert [(i.text, i.weight) for i in book.insights] == [
        ("Rule number 1, made more general.", 4), ("Rule number 2.", 3), ("A brand new rule.", 2)]
    assert book.insights[2].insight_id == "insight-0003" and book.insights[2].sources == ["t1"]
    assert book.next_number == 4


def test_remove_subtracts_one_and_drops_an_insight_at_zero():
    book = book_with(2, 5)
    book.apply([Operation("REMOVE", 1, "Rule number 1.")])
    assert [(i.text, i.weight) for i in book.insights] == [("Rule number 2.", 5), ("Rule number 1.", 1)]
    report = book.apply([Operation("REMOVE", 2, "Rule number 1.")])  # found by text, not number
    assert report.dropped == 1
    assert [i.text for i in book.insights] == ["Rule number 2."]


def test_remove_costs_three_when_the_list_is_full():
    full = book_with(5, 4, 4, max_insights=3)
    assert full.full
    report = full.apply([Operation("REMOVE", 1, "Rule number 1.")])
    assert report.full and full.insights[-1].weight == 2  # 5 - 3, now last
    not_full = book_with(5, 4, 4, max_insights=4)
    not_full.apply([Operation("REMOVE", 1, "Rule number 1.")])
    assert not_full.insights[0].weight == 4 and not_full.insights[0].text == "Rule number 1."


def test_full_list_stays_capped_and_a_new_rule_displaces_only_a_lighter_one():
    book = book_with(3, 2, 2, max_insights=3)
    report = book.apply([Operation("ADD", None, "A new rule.")])
    assert report.evicted == 1 and len(book.insights) == 3
    assert "A new rule." not in book.texts()  # ties keep the older rule
    book = book_with(3, 2, 1, max_insights=3)
    book.apply([Operation("ADD", None, "A new rule.")])
    assert book.texts() == ["Rule number 1.", "Rule number 2.", "A new rule."]


def test_invalid_operations_are_rejected_and_counted():
    book = book_with(2, 2, max_insights=10)
    report = book.apply([
        Operation("ADD", None, "Rule number 1."),             # duplicate of an existing rule
        Operation("EDIT", 7, "An edit of a rule that does not exist."),
        Operation("AGREE", 9, "A rule nobody wrote."),
        Operation("EDIT", 5, "rule  number 2."),              # restates rule 2: counts as AGREE
    ])
    assert report.rejected == {"add_duplicate": 1, "edit_unknown_rule": 1, "agree_unknown_rule": 1}
    assert report.applied["AGREE"] == 1 and book.insights[0].text == "Rule number 2." and book.insights[0].weight == 3
    report = book.apply([
        Operation("AGREE", 1, "Rule number 2."),
        Operation("REMOVE", 1, "Rule number 2."),  # a second operation on the same rule applies too
        Operation("ADD", None, "One."), Operation("ADD", None, "Two."), Operation("ADD", None, "Three."),
    ])
    assert report.rejected == {"over_operation_limit": 1}
    assert report.applied == {"ADD": 2, "AGREE": 1, "EDIT": 0, "REMOVE": 1}
    assert book.texts() == ["Rule number 2.", "Rule number 1.", "One.", "Two."]
    assert book.insights[0].weight == 3  # 3 + 1 - 1, as the authors' update_rules


def test_book_round_trips_through_state():
    book = book_with(4, 1)
    copy = InsightBook(10)
    copy.load(json.loads(json.dumps(book.to_dict())))
    def rows(b):
        return [(i.insight_id, i.text, i.weight, i.sources) for i in b.insights]

    assert rows(copy) == rows(book)
    assert copy.next_number == 3


# -- few-shot retrieval -------------------------------------------------------------------------


def stored_trial(task_id: str, task_type: str, goal: str, success: bool,
                 transcript: str = "> go to x\nok") -> Experience:
    return Experience(
        kind="trajectory", text=goal, provenance=Provenance((task_id,), "train"),
        metadata={"task_id": task_id, "task_type": task_type, "trial": 0, "success": success,
                  "transcript": f"Your task is to: {goal}\n{transcript}", "reflection": "", "steps": 1},
        experience_id=f"expel-trajectory:{task_id}:trial0",
    )


def test_fewshots_are_similar_successes_of_the_same_type_never_the_task_itself():
    store = ExperienceStore(None, HashingEmbedder())
    heat = "pick_heat_then_place_in_recep"
    store.add([
        stored_trial("me", heat, "put a hot apple in fridge.", True),                # the task itself
        stored_trial("twin", heat, "put a hot apple in fridge.", True),              # most similar
        stored_trial("near", heat, "put a hot apple in countertop.", True),
        stored_trial("far", heat, "put a hot mug in cabinet.", True),
        stored_trial("lost", heat, "put a hot apple in fridge.", False),             # a failure
        stored_trial("other", "pick_cool_then_place_in_recep", "put a hot apple in fridge.", True),
        stored_trial("long", heat, "put a hot apple in fridge.", True, transcript="> look\n" * 400),
        Experience("insight", "put a hot apple in fridge.", Provenance(("x",), "train"), {"weight": 2}),
    ])
    task = Task("me", "household", "train", heat, "put a hot apple in fridge.")
    chosen = select_fewshots(store, task, k=2, candidates=8, max_chars=1600)
    assert [e.metadata["task_id"] for e in chosen] == ["twin", "near"]
    three = select_fewshots(store, task, k=3, candidates=8, max_chars=1600)
    assert [e.metadata["task_id"] for e in three] == ["twin", "near", "far"]
    unseen = Task("u", "household", "test_unseen", "look_at_obj_in_light", "put a hot apple in fridge.")
    assert select_fewshots(store, unseen, k=2, candidates=8, max_chars=1600) == []


# -- Reflexion retries ------------------------------------------------------------------------


def test_reflexion_retry_rule():
    assert trials_needed([], 3)
    assert trials_needed([False, False, False], 3)
    assert not trials_needed([False, False, False, False], 3)  # 1 trial + 3 reflections
    assert not trials_needed([False, True], 3)
    assert not trials_needed([False], 0)


# -- the whole method on the household world ----------------------------------------------------

CRITIC_REPLY = (
    "I compared the trials.\n"
    "ADD 1: Open closed receptacles before searching them.\n"
    "ADD 2: Take the object before going to the target\n"  # cut off: malformed
    "AGREE 1: Open closed receptacles before searching them.\n"
)
REFLECTION_REPLY = "I will search the receptacles one by one and take the object first."


class Killed(BaseException):
    """A simulated kill: not an Exception, so nothing on the way catches it."""


class OracleLLM(FakeLLM):
    """Plays the household expert on planned train tasks from a given trial on (0: at once, 1:
    once a reflection is shown, None: never), answers reflection and critique prompts with fixed
    text, and otherwise behaves as the fake backend."""

    crash: tuple[str, int] | None = None  # ("critique" | "reflection", n): raise at the n-th one

    def __init__(self, plans: dict[str, tuple[list[str], int | None]]) -> None:
        super().__init__()
        self.plans = plans
        self.prompts: list[str] = []
        self.counts = {"critique": 0, "reflection": 0}
        self.lock = threading.Lock()

    def _maybe_crash(self, kind: str) -> None:
        with self.lock:
            self.counts[kind] += 1
            if OracleLLM.crash == (kind, self.counts[kind]):
                raise Killed(f"killed at {kind} {self.counts[kind]}")

    def generate(self, prompts, params):
        results = []
        for prompt in prompts:
            if REFLECTION_REQUEST in prompt[-1]["content"]:
                self._maybe_crash("reflection")
                text = REFLECTION_REPLY
            elif prompt[0]["content"] == CRITIC_SYSTEM:
                self._maybe_crash("critique")
                text = CRITIC_REPLY
            else:
                raise AssertionError(f"unexpected generate prompt: {prompt}")
            tokens_in, tokens_out = self.count_tokens(repr(prompt)), self.count_tokens(text)
            results.append(Generation(text, list(range(tokens_out)), [0.0] * tokens_out, tokens_in, tokens_out))
            self.usage.add(1, tokens_in, tokens_out)
        return results

    def choose(self, prompts, options, params):
        results = []
        params = params if isinstance(params, list) else [params] * len(prompts)
        for prompt, opts, param in zip(prompts, options, params):
            content = prompt[-1]["content"]
            with self.lock:
                self.prompts.append(content)
            expert = None
            if INSIGHTS_HEADER not in content and FEWSHOTS_HEADER not in content:
                for intro, (actions, from_trial) in self.plans.items():
                    if intro in content:
                        trial = len(re.findall(r"^Trial \d+: ", content, flags=re.M))
                        shown = re.findall(r"^Step (\d+): >", content, flags=re.M)
                        step = int(shown[-1]) if shown else 0
                        if from_trial is not None and trial >= from_trial and step < len(actions):
                            expert = actions[step]
                        break
            if expert is not None and expert in opts:
                index = opts.index(expert)
                results.append(Choice(index, expert, [index], [0.0], [0.0] * len(opts), 1, 1))
                self.usage.add(1, 1, 1)
            else:
                results.extend(super().choose([prompt], [opts], param))
        return results


GROUPS: dict[str, int] = {}  # train task id -> 0 solved at once, 1 after a reflection, 2 never


def group_of(task_id: str) -> int:
    return GROUPS[task_id]


def fast_household(plugins):
    """The world of the runs here: household's YAML defaults (its level), with the fast sizes."""
    entry = plugins.envs.get("household")
    return entry.factory(OmegaConf.merge(*[OmegaConf.load(path) for path in entry.configs],
                                         {"seed": 0, "n_train": 60, "n_valid": 12, "n_test": 12}))


@pytest.fixture
def oracle(plugins):
    """Registers backend ``oracle``: an :class:`OracleLLM` whose groups cycle 0, 1, 2 over the
    train tasks ExpeL gathers on (chosen exactly as the method chooses them)."""
    env = fast_household(plugins)
    stub_run = types.SimpleNamespace(tasks=env.tasks, learn_seed=0, learn_split="train", cfg=OmegaConf.create({"learn": {"split": "train", "seed": 0}}))
    stub_method = types.SimpleNamespace(cfg=OmegaConf.create({"train_tasks": 6}))
    chosen = ExpeL.train_tasks(stub_method, stub_run)  # type: ignore[arg-type]
    GROUPS.clear()
    GROUPS.update({task.task_id: index % 3 for index, task in enumerate(chosen)})
    plans: dict[str, tuple[list[str], int | None]] = {}
    for task in chosen:
        episode = env.open(task)
        observation, actions = episode.reset(), []
        intro = observation.text.strip()
        while not observation.won and len(actions) < 40:
            actions.append(episode.expert_action())
            observation = episode.step(actions[-1])
        plans[intro] = (actions, {0: 0, 1: 1, 2: None}[GROUPS[task.task_id]])
    made: list[OracleLLM] = []

    def factory(cfg):
        llm = OracleLLM(plans)
        made.append(llm)
        return llm

    module = types.SimpleNamespace(__name__="expel_test_backend")

    @arena.hookimpl
    def register_backends(register):
        register("oracle", factory)

    module.register_backends = register_backends
    plugins.register_plugin(module, name="expel_test_backend")
    OracleLLM.crash = None
    yield made
    OracleLLM.crash = None


ORACLE = [o if not o.startswith("llm.backend") else "llm.backend=oracle" for o in FAST] + [
    "method.train_tasks=6", "learn.budget.episodes=24", "learn.max_steps=25",
]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_expel_learns_on_train_and_evaluates_frozen(plugins, oracle, tmp_path):
    path, results = protocol.run("expel", overrides=ORACLE, out=tmp_path / "x", plugins=plugins)
    episodes = read_jsonl(path / "episodes.jsonl")
    learn = [e for e in episodes if e["phase"] == "learn"]
    assert {e["split"] for e in learn} == {"train"}

    # Reflexion: solved at trial 0 -> 1 trial; from trial 1 -> 2; never -> 1 + 3 reflections.
    trials: dict[str, list[tuple[str, bool]]] = {}
    for e in learn:
        trials.setdefault(e["task_id"], []).append((e["variant"], e["success"]))
    assert len(trials) == 6
    expected = {0: [("trial0", True)], 1: [("trial0", False), ("trial1", True)],
                2: [(f"trial{t}", False) for t in range(4)]}
    for task_id, got in trials.items():
        assert sorted(got) == expected[group_of(task_id)], task_id
    # each reflection is shown in the next trial's prompt (all three in the fourth)
    llm = oracle[0]
    assert any(f"Trial 3: {REFLECTION_REPLY}" in p and f"Trial 1: {REFLECTION_REPLY}" in p for p in llm.prompts)

    store = ExperienceStore(path / "store", HashingEmbedder())
    stored = store.all(kind="trajectory")
    assert len(stored) == len(learn)
    for experience in stored:
        meta = experience.metadata
        assert len(meta["reflections_shown"]) == meta["trial"]
        assert bool(meta["reflection"]) == (not meta["success"] and meta["trial"] < 3)

    # Insights: one compare job per task solved at its second trial, one success chunk.
    state = json.loads((path / "method" / "state.json").read_text())
    solved_late = sum(1 for t in trials if group_of(t) == 1)
    assert solved_late == 2
    critiques = solved_late + 1
    assert [job["kind"] for job in state["jobs"]] == ["compare"] * solved_late + ["success"]
    counts = state["critique"]
    assert counts["critiques"] == critiques and state["jobs_done"] == critiques
    assert counts["malformed_operations"] == critiques  # the cut-off ADD in every answer
    assert counts["applied"] == {"ADD": 1, "AGREE": critiques - 1, "EDIT": 0, "REMOVE": 0}
    assert counts["rejected"] == {"agree_unknown_rule": 1, "add_duplicate": critiques - 1}
    (insight,) = store.all(kind="insight")
    assert insight.text == "Open closed receptacles before searching them."
    assert insight.metadata["weight"] == 2 + critiques - 1
    assert results.state.method["insights"] == 1
    assert results.state.method["malformed_operations"] == critiques

    # Frozen evaluation: insights for every task, few-shots only of the same type.
    train_types = {t.task_id: t.task_type for t in fast_household(plugins).tasks("train")}
    evaluated = [e for e in episodes if e["phase"] == "evaluate"]
    assert len(evaluated) == 24
    for e in evaluated:
        assert e["experience_ids"][0] == insight.experience_id
        fewshots = [i.split(":")[1] for i in e["experience_ids"][1:]]
        assert len(fewshots) <= 2 and all(train_types[t] == e["task_type"] for t in fewshots)
        if e["split"] == "test_unseen":
            assert fewshots == []
    assert any(len(e["experience_ids"]) >= 2 for e in evaluated if e["split"] == "test_seen")
    assert any(FEWSHOTS_HEADER in p and INSIGHTS_HEADER in p for p in llm.prompts)

    assert results.valid is True, results.violations
    assert results.state.digest_before_eval == results.state.digest_after_eval
    assert store.digest() == ExperienceStore(path / "store", HashingEmbedder()).digest()
    for split in ("test_seen", "test_unseen"):
        assert results.splits[split].n_episodes == 12
    assert results.learn.used["episodes"] == len(learn) <= 24
    assert results.cost.learn.tokens_in > 0 and results.cost.evaluate.episodes == 24
    assert json.loads((path / "results.json").read_text())["method"] == "expel"


def outcome(path):
    """Learning as it happened: episodes, stored experiences, insights, and the learned digest."""
    episodes = sorted((e["task_id"], e["variant"], e["success"], e["steps"])
                      for e in read_jsonl(path / "episodes.jsonl") if e["phase"] == "learn")
    state = json.loads((path / "state.json").read_text())
    method = json.loads((path / "method" / "state.json").read_text())
    return episodes, method["book"], method["critique"], state["digest_before_eval"]


def test_a_killed_run_resumes_without_redoing_or_losing_anything(plugins, oracle, tmp_path):
    overrides = ORACLE + ["eval.limit=2"]
    full, _ = protocol.run("expel", overrides=overrides, out=tmp_path / "full", plugins=plugins)

    killed = tmp_path / "killed"
    OracleLLM.crash = ("reflection", 2)  # during gathering, after a round was recorded
    with pytest.raises(Killed):
        protocol.run("expel", overrides=overrides, out=killed, plugins=plugins)
    OracleLLM.crash = ("critique", 2)  # during extraction, after one critique was applied
    with pytest.raises(Killed):
        protocol.run(None, resume=killed, plugins=plugins)
    assert json.loads((killed / "method" / "state.json").read_text())["jobs_done"] == 1
    OracleLLM.crash = None
    _, results = protocol.run(None, resume=killed, plugins=plugins)

    assert outcome(killed) == outcome(full)  # RunDir refuses to record an episode twice
    assert results.valid is True, results.violations


def test_fewer_reflections_mean_fewer_trials(plugins, oracle, tmp_path):
    path, results = protocol.run("expel", overrides=ORACLE + ["method.max_reflections=1", "eval.limit=1"],
                                 out=tmp_path / "r", plugins=plugins)
    learn = [e for e in read_jsonl(path / "episodes.jsonl") if e["phase"] == "learn"]
    never = {e["task_id"] for e in learn if group_of(e["task_id"]) == 2}
    assert never and all(sum(e["task_id"] == t for e in learn) == 2 for t in never)
    assert results.valid is True


def test_defaults_follow_the_authors(plugins):
    from arena.core.config.compose import compose

    cfg = compose(plugins, "expel")
    method = cfg.method
    assert (method.max_reflections, method.max_insights, method.success_chunk, method.fewshots) == (3, 10, 8, 2)
    assert dict(method.weights) == {"add": 2, "agree": 1, "edit": 1, "remove": 1, "remove_when_full": 3}
    assert cfg.learn.budget.episodes == method.train_tasks * (1 + method.max_reflections)
    assert cfg.learn.sampling.temperature == 0.0


TINY = ["llm.model=tiny", "embedder.name=hashing", "env.n_train=30", "env.n_valid=4", "env.n_test=4",
        "eval.limit=1", "eval.max_steps=3", "learn.max_steps=3", "eval.concurrency=2",
        "method.train_tasks=2", "method.max_reflections=1", "learn.budget.episodes=4",
        "method.reflection_max_tokens=8", "method.critique_max_tokens=8"]


@pytest.mark.slow
def test_expel_with_the_tiny_model(plugins, tmp_path):
    path, results = protocol.run("expel", overrides=TINY, out=tmp_path / "t", plugins=plugins)
    learn = [e for e in read_jsonl(path / "episodes.jsonl") if e["phase"] == "learn"]
    assert 2 <= len(learn) <= 4
    assert results.valid is True, results.violations
    assert results.state.digest_before_eval == results.state.digest_after_eval
    assert results.splits["test_seen"].n_episodes == 1
