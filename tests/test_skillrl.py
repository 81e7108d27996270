"""SkillRL: SkillBank bookkeeping, retrieval, injection from step 2, the evolution trigger, one
SFT and one GRPO step on the tiny model, the valid-split flag, and end-to-end runs."""

from __future__ import annotations

import json
import types

import pytest
import torch
from omegaconf import OmegaConf

from arena.core import protocol
from arena.core.config.compose import compose
from arena.core.contract.llm import Chat, Choice, SamplingParams
from arena.core.contract.types import RolloutTokens, Step, Task, Termination, Trajectory
from arena.core.execution.solver import StandardSolver, play
from arena.core.rl import PolicyTrainer, group_advantages
from arena.core.rl import sft as sft_stage
from arena.core.services.embedder import make_embedder
from arena.core.services.store import ExperienceStore
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.plugins.skillrl import distill
from arena.plugins.skillrl import method as skillrl
from arena.plugins.skillrl.distill import parse_mistakes, parse_skills
from arena.plugins.skillrl.retrieval import HEADER, embedding_retrieve, make_prompt_builder, template_retrieve
from arena.plugins.skillrl.skillbank import GENERAL, SkillBank, sync_store
from arena.testing import FakeLLM
from tests.helpers.overrides import SKILLRL_TINY
from tests.helpers.runs import learned_metrics

PICK, HEAT = "pick_and_place_simple", "pick_heat_then_place_in_recep"


def constructed_bank() -> SkillBank:
    bank = SkillBank()
    bank.begin()
    for number in range(8):
        bank.add_skill(title=f"General {number}", principle=f"Principle number {number}.", scope=GENERAL,
                       source_split="train", source_task_ids=[f"t{number}"], added_at="distill")
    bank.add_skill(title="Heat in microwave", principle="Heat the object with microwave 1.", scope=HEAT,
                   source_split="train", source_task_ids=["h1"], added_at="distill")
    bank.add_skill(title="Search countertops", principle="Look on countertops first.", scope=PICK,
                   source_split="train", source_task_ids=["p1"], added_at="distill")
    for number in range(7):
        bank.add_mistake(description=f"Mistake {number}", how_to_avoid=f"Avoid {number}.",
                         source_split="train", source_task_ids=[f"m{number}"], added_at="distill")
    bank.commit()
    bank.add_skill(title="Evolved", principle="Open closed receptacles.", scope=GENERAL, source_split="valid",
                   source_task_ids=["v1"], added_at="evolve@step1", dynamic=True)
    return bank


def store_with(bank: SkillBank) -> ExperienceStore:
    store = ExperienceStore(None, make_embedder(OmegaConf.create({"name": "hashing"})))
    sync_store(store, bank)
    return store


def task(task_type: str, goal: str = "put a hot apple in fridge.", split: str = "test_seen") -> Task:
    return Task(f"{split}/{task_type}/1", "household", split, task_type, goal)


# -- SkillBank -----------------------------------------------------------------------------------


def test_skillbank_add_revise_and_version_bookkeeping():
    bank = SkillBank()
    bank.begin()
    first = bank.add_skill(title="Open first", principle="Open closed receptacles.", scope=GENERAL,
                           source_split="train", source_task_ids=["a"], added_at="distill")
    typed = bank.add_skill(title="Heat", principle="Use the microwave.", scope=HEAT, source_split="train",
                           source_task_ids=["b"], added_at="distill")
    mistake = bank.add_mistake(description="Looping", how_to_avoid="Try another place.", source_split="train",
                               source_task_ids=["c"], added_at="distill")
    bank.commit()
    assert (first.skill_id, typed.skill_id, mistake.mistake_id) == ("gen_001", f"{HEAT}_001", "mis_001")
    assert bank.version == 1 and all(e["bank_version"] == 1 for e in bank.history)
    # a duplicate title in the same scope is refused (SkillRL PR #28's duplicate ids)
    assert bank.add_skill(title=" open  FIRST", principle="x", scope=GENERAL, source_split="train") is None
    assert bank.version == 1
    bank.begin()
    bank.commit()  # an empty batch gives its version back
    assert bank.version == 1
    dyn = bank.add_skill(title="Evolved", principle="Check every cabinet.", scope=GENERAL, source_split="valid",
                         source_task_ids=["v1", "v2"], added_at="evolve@step5", dynamic=True)
    assert dyn.skill_id == "dyn_001" and dyn.dynamic and bank.version == 2
    revised = bank.revise_skill("gen_001", principle="Open every closed receptacle you pass.",
                                source_split="valid", source_task_ids=["v3"], added_at="evolve@step10")
    assert revised.version == 2 and revised.bank_version == 3 and bank.version == 3
    assert revised.source_task_ids == ["a", "v3"]
    event = bank.history[-1]
    assert event["event"] == "revise" and event["previous"]["principle"] == "Open closed receptacles."
    assert event["source_split"] == "valid" and event["source_task_ids"] == ["v3"]
    assert [e["id"] for e in bank.history if e["at"].startswith("evolve")] == ["dyn_001", "gen_001"]
    assert [s.skill_id for s in bank.general()] == ["dyn_001", "gen_001"]  # evolved first
    with pytest.raises(KeyError, match="No skill 'gen_999'"):
        bank.revise_skill("gen_999", principle="x", source_split="valid")
    restored = SkillBank.from_dict(json.loads(json.dumps(bank.to_dict())))
    assert restored.to_dict() == bank.to_dict()
    assert restored.add_skill(title="Next", principle="p", scope=GENERAL, source_split="train").skill_id == "gen_002"


def test_store_mirrors_the_bank_and_keeps_provenance():
    bank = constructed_bank()
    store = store_with(bank)
    assert store.count("skill") == 11 and store.count("mistake") == 7
    evolved = store.get(["skillrl:dyn_001"])[0]
    assert evolved.provenance.source_split == "valid" and evolved.metadata["dynamic"] is True
    digest = store.digest()
    sync_store(store, bank)  # idempotent
    assert store.digest() == digest
    smaller = SkillBank.from_dict(bank.to_dict())
    del smaller.skills["gen_001"]
    sync_store(store, smaller)
    assert store.count("skill") == 10 and not store.get(["skillrl:gen_001"])


# -- retrieval and injection ---------------------------------------------------------------------


def test_template_retrieval_takes_type_skills_top_general_and_mistakes():
    store = store_with(constructed_bank())
    found = template_retrieve(store, task(HEAT), top_general=6, max_mistakes=5)
    ids = [e.experience_id.removeprefix("skillrl:") for e in found]
    assert ids[:6] == ["dyn_001", "gen_001", "gen_002", "gen_003", "gen_004", "gen_005"]
    assert ids[6:7] == [f"{HEAT}_001"]  # its own type only
    assert ids[7:] == [f"mis_00{n}" for n in range(1, 6)]
    unseen = template_retrieve(store, task("look_at_obj_in_light"), top_general=2, max_mistakes=0)
    assert [e.experience_id for e in unseen] == ["skillrl:dyn_001", "skillrl:gen_001"]
    # every evolved skill is shown, however many (the authors keep them all)
    only_evolved = template_retrieve(store, task(HEAT), top_general=0, max_mistakes=0)
    assert [e.experience_id for e in only_evolved][:1] == ["skillrl:dyn_001"]


def test_embedding_retrieval_top_k_and_threshold():
    bank = constructed_bank()
    store = store_with(bank)
    query = task(HEAT, goal=bank.skills[f"{HEAT}_001"].render())
    found = embedding_retrieve(store, query, top_k=3, threshold=None)
    assert len(found) == 3 and found[0].experience_id == f"skillrl:{HEAT}_001"
    assert embedding_retrieve(store, query, top_k=3, threshold=0.999)[0].experience_id == f"skillrl:{HEAT}_001"
    assert len(embedding_retrieve(store, query, top_k=3, threshold=0.999)) == 1


class RecordingLLM(FakeLLM):
    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[Chat] = []

    def choose(self, prompts: list[Chat], options: list[list[str]], params: SamplingParams | list[SamplingParams]
               ) -> list[Choice]:
        self.prompts.extend(prompts)
        return super().choose(prompts, options, params)


@pytest.mark.parametrize("inject_from", [1, 2, 3])
def test_skills_are_injected_from_the_configured_step(plugins, inject_from):
    env = plugins.envs.get("household").factory(OmegaConf.create({"n_train": 4, "n_valid": 4, "n_test": 4}))
    store = store_with(constructed_bank())
    target = env.tasks("test_seen")[0]
    skills = template_retrieve(store, target, top_general=6, max_mistakes=5)
    llm = RecordingLLM()
    solver = StandardSolver(llm, history=2, max_experiences=1000,
                            prompt_builder=make_prompt_builder(inject_from, max_chars=3000))
    trajectory = play(env.open(target), solver.policy(target, skills, seed=0), max_steps=4, max_invalid_actions=5)
    assert len(trajectory.steps) == 4
    shown = [HEADER in prompt[-1]["content"] for prompt in llm.prompts]
    assert shown == [number >= inject_from for number in range(1, 5)]
    assert "General Principles:\n- Evolved: Open closed receptacles." in llm.prompts[-1][-1]["content"]
    assert "Mistakes to avoid:\n- Don't: Mistake 0" in llm.prompts[-1][-1]["content"]


# -- teacher and evolution -----------------------------------------------------------------------


def test_teacher_answers_are_parsed_from_prose_and_lists():
    text = ('Sure! ```json\n[{"title": "A", "principle": "Do a.", "when_to_apply": "always"}, '
            '{"title": "", "principle": "dropped"}]``` and {"title": "B", "principle": "Do b.", "revises": "gen_001"}')
    assert [s["title"] for s in parse_skills(text)] == ["A", "B"]
    assert parse_skills(text)[1]["revises"] == "gen_001" and parse_skills(text, limit=1)[0]["title"] == "A"
    assert parse_skills('{"title": "unclosed') == []
    mistakes = parse_mistakes('{"description": "Loops", "why_it_happens": "w", "how_to_avoid": "Stop."} {"description": "x"}')
    assert mistakes == [{"description": "Loops", "why_it_happens": "w", "how_to_avoid": "Stop."}]
    teacher = distill.Teacher(FakeLLM(reply='Skill", "principle": "P."}'), shares_policy_backend=True,
                              max_new_tokens=8, temperature=0.0, reply_prefix=True, transcript_chars=100)
    (answer,) = teacher.ask([("success", [{"role": "user", "content": "x"}])], seed=0)
    assert parse_skills(answer) == [{"title": "Skill", "principle": "P.", "when_to_apply": "", "revises": ""}]
    assert teacher.cost.calls == 1 and teacher.cost.tokens_out > 0


def test_evolution_trigger_on_constructed_accuracies():
    assert skillrl.types_to_evolve({PICK: 0.39, HEAT: 0.4, "cool": 0.0}, 0.4) == ["cool", PICK]
    assert skillrl.types_to_evolve({PICK: 1.0}, 0.4) == []
    runs = [failed(PICK, won) for won in (True, False, False)] + [failed(HEAT, True)]
    assert skillrl.accuracy_by_type(runs) == {HEAT: 1.0, PICK: pytest.approx(1 / 3)}
    assert [s for s in range(1, 11) if skillrl.evolution_due(s, 5, [])] == [5, 10]
    assert not skillrl.evolution_due(5, 5, [5]) and not skillrl.evolution_due(3, 0, [])


def failed(task_type: str, won: bool = False, index: int = 0) -> Trajectory:
    target = Task(f"valid/{task_type}/{index}", "household", "valid", task_type, "put a mug in cabinet.")
    return Trajectory(task=target, initial_observation="start", steps=[Step("look", "ok", True)],
                      status=Termination.SUCCESS if won else Termination.FAILURE)


def test_evolution_adds_dynamic_skills_and_revisions_from_valid_failures():
    method = object.__new__(skillrl.SkillRL)
    method.cfg = OmegaConf.create({"evolution": {"max_new_skills": 2}})
    bank = constructed_bank()
    before = bank.version
    failures = {PICK: [failed(PICK, index=i) for i in range(2)], HEAT: [failed(HEAT)]}
    answers = [json.dumps([{"title": "Check drawers", "principle": "Open drawers too."},
                           {"title": "New rule", "principle": "Revised.", "revises": "gen_001"},
                           {"title": "Third", "principle": "cut by max_new_skills"}]),
               "no json at all"]
    added, revised = method.apply_evolution(bank, failures, answers, step=5)
    assert added == ["dyn_002"] and revised == ["gen_001"] and bank.version == before + 1
    new = bank.skills["dyn_002"]
    assert (new.scope, new.source_split, new.added_at) == (GENERAL, "valid", "evolve@step5")
    assert new.source_task_ids == [f"valid/{PICK}/0", f"valid/{PICK}/1"]
    assert bank.skills["gen_001"].principle == "Revised." and bank.skills["gen_001"].version == 2
    assert "Third" not in {s.title for s in bank.skills.values()}


def test_the_authors_evolution_adds_new_general_skills_only():
    """scheme=authors: the answer's ``revises`` is ignored (the authors' teacher sees titles only
    and adds dyn_ general skills), at most max_new_skills from the one call."""
    method = object.__new__(skillrl.SkillRL)
    method.cfg = OmegaConf.create({"evolution": {"max_new_skills": 2}})
    bank = constructed_bank()
    failures = {skillrl.ANY_TYPE: [failed(PICK), failed(HEAT)]}
    answer = json.dumps([{"title": "New rule", "principle": "Revised.", "revises": "gen_001"},
                         {"title": "Check drawers", "principle": "Open drawers too."},
                         {"title": "Third", "principle": "cut by max_new_skills"}])
    added, revised = method.apply_evolution(bank, failures, [answer], step=5, revisions=False)
    assert added == ["dyn_002", "dyn_003"] and revised == []
    assert bank.skills["gen_001"].principle == "Principle number 0." and bank.skills["gen_001"].version == 1
    assert {bank.skills[i].scope for i in added} == {GENERAL}
    assert bank.skills["dyn_002"].source_task_ids == [f"valid/{PICK}/0", f"valid/{HEAT}/0"]


def test_the_authors_evolution_prompt_lists_failures_of_every_type_and_titles_only():
    bank = constructed_bank()
    lost = [failed(PICK), failed(HEAT)]
    _, chat = distill.evolve_general_prompt(0.25, lost, [s.title for s in bank.skills.values()],
                                            max_new=3, last_steps=5, max_chars=2000,
                                            instructions=HOUSEHOLD_INSTRUCTIONS)
    text = chat[-1]["content"]
    assert f"Attempt 1 ({PICK})" in text and f"Attempt 2 ({HEAT})" in text and "25%" in text
    assert "- Heat in microwave" in text and "Heat the object with microwave 1." not in text
    assert "revises" not in text and "1 to 3 NEW general skills" in text


@pytest.mark.parametrize("visible_to", ["training", "all"])
def test_evolved_skills_reach_only_rollouts_unless_visible_to_all(visible_to):
    method = object.__new__(skillrl.SkillRL)
    method.cfg = OmegaConf.create({"retrieval": {"mode": "template", "top_general": 6, "max_mistakes": 0,
                                                 "routing": "task_type"},
                                   "evolution": {"visible_to": visible_to}})
    run = types.SimpleNamespace(store=store_with(constructed_bank()))
    rollout = {e.experience_id for e in method._experiences(run, task(HEAT), rollout=True)}
    elsewhere = {e.experience_id for e in method.retrieve(run=run, task=task(HEAT))}
    typed = {f"skillrl:{HEAT}_001"}
    assert rollout == {"skillrl:dyn_001", *(f"skillrl:gen_00{n}" for n in range(1, 6))} | typed
    if visible_to == "all":
        assert elsewhere == rollout
    else:  # as if nothing had evolved: six distilled general skills
        assert elsewhere == {f"skillrl:gen_00{n}" for n in range(1, 7)} | typed


# -- rewards, SFT and GRPO on the tiny model ------------------------------------------------------


def test_rewards_and_groups():
    won = failed(PICK, won=True)
    lost = failed(PICK)
    lost.steps.append(Step("fly", "Nothing happens.", False, well_formed=False))
    lost.steps.append(Step("go to moon", "Nothing happens.", False))  # inadmissible, in good form
    assert skillrl.episode_reward(won, 10.0, 0.1) == 10.0
    assert skillrl.episode_reward(lost, 10.0, 0.1) == pytest.approx(-0.1)
    for trajectory in (won, lost):
        for step in trajectory.steps:
            step.rollout = RolloutTokens([1, 2, 3], [4, 5], [-0.3, -0.2])
    samples = skillrl.grpo_samples([won, lost], ["g", "g"], [10.0, -0.1], advantage_over="episodes")
    assert [s.advantage for s in samples] == pytest.approx(
        [group_advantages([10.0, -0.1], ["g", "g"])[0]] + [group_advantages([10.0, -0.1], ["g", "g"])[1]] * 3)
    assert all(s.loss_mask == [0, 0, 0, 1, 1] and s.role == "solver" for s in samples)
    # The authors' (verl-agent): every step sample is a group member with its own reward, the
    # penalty on the malformed step only: rewards 10 | 0, -0.1, 0 over four rows (the
    # inadmissible action in good form is not penalised, as theirs).
    steps = skillrl.grpo_samples([won, lost], ["g", "g"], [], advantage_over="steps",
                                 win_reward=10.0, invalid_penalty=0.1)
    assert [s.reward for s in steps] == pytest.approx([10.0, 0.0, -0.1, 0.0])
    assert [s.advantage for s in steps] == pytest.approx(group_advantages([10.0, 0.0, -0.1, 0.0], ["g"] * 4))
    assert steps[1].advantage > steps[2].advantage  # the malformed step is pushed down further
    with pytest.raises(ValueError, match="advantage_over must be one of"):
        skillrl.grpo_samples([won], ["g"], [10.0], advantage_over="tokens")


@pytest.mark.slow
@pytest.mark.parametrize("lora", [{"r": 4, "alpha": 8}, None], ids=["lora", "full"])
def test_one_sft_step_and_restore_on_tiny_model(plugins, tmp_path, lora):
    """Both kinds of SFT save and restore; full weights too on a model whose input and output
    embeddings share one tensor (the tiny model, SmolLM2), which safetensors' save_file refuses."""
    make = plugins.backends.get("transformers").factory
    backend = make({"model": "tiny", "dtype": "float32"})
    before = backend.weights_digest(fresh=True)
    prompt = [{"role": "system", "content": "You act."}, {"role": "user", "content": "Admissible actions: look, go to desk 1"}]
    rows = [sft_stage.example(prompt, "go to desk 1")] * 2
    settings = {"steps": 1, "batch_size": 2, "lr": 1e-3, "lora": lora, "max_length": 512}
    model, metrics = sft_stage.train_sft(backend.model, backend.tokenizer, rows, settings, tmp_path, seed=0)
    assert model is backend.model and metrics["sft/steps"] == 1 and metrics["sft/loss"] > 0
    backend.mark_weights_changed()
    after = backend.weights_digest(fresh=True)
    assert after != before and not any("lora" in name for name in model.state_dict())
    fresh = make({"model": "tiny", "dtype": "float32"})
    fresh.model = sft_stage.restore(fresh.model, tmp_path)
    fresh.mark_weights_changed()
    assert fresh.weights_digest(fresh=True) == after  # a resumed run rebuilds the same reference


@pytest.mark.slow
def test_one_grpo_step_on_tiny_model(plugins):
    backend = plugins.backends.get("transformers").factory({"model": "tiny"})
    prompt = [{"role": "user", "content": "Admissible actions: look, go to desk 1"}]
    trajectories = []
    for won in (True, False):
        (choice,) = backend.choose([prompt], [["look", "go to desk 1"]], SamplingParams())
        step = Step(choice.text, "ok", True, rollout=RolloutTokens(choice.prompt_token_ids, choice.token_ids,
                                                                    choice.logprobs))
        trajectories.append(Trajectory(task=failed(PICK).task, initial_observation="s", steps=[step],
                                       status=Termination.SUCCESS if won else Termination.FAILURE))
    rewards = [skillrl.episode_reward(t, 10.0, 0.1) for t in trajectories]
    samples = skillrl.grpo_samples(trajectories, ["g", "g"], rewards, advantage_over="steps")
    config = {"lr": 1e-3, "eps_low": 0.2, "eps_high": 0.2, "kl_coef": 0.01, "entropy_coef": {"solver": 0.001},
              "lora": {"r": 4, "alpha": 8}}
    trainer = PolicyTrainer(backend.model, backend.tokenizer, config, on_weights_changed=backend.mark_weights_changed)
    adapters = {n: p.detach().clone() for n, p in trainer.trainable.items()}
    metrics = trainer.step(samples)
    assert metrics["skipped"] == 0 and metrics["solver/n_tokens"] == sum(s.n_trained for s in samples)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert any(not torch.equal(adapters[n], p) for n, p in trainer.trainable.items())


# -- configs and runs ---------------------------------------------------------------------------


def test_presets(plugins):
    paper = compose(plugins, "skillrl", preset="paper")
    assert (paper.method.rl.tasks_per_step, paper.method.rl.group_size, paper.method.rl.steps) == (16, 8, 150)
    trainer = paper.method.rl.trainer
    assert (trainer.kl_coef, trainer.entropy_coef.solver, trainer.eps_low, trainer.eps_high) == (0.01, 0.001, 0.2, 0.2)
    assert paper.method.rl.invalid_action_penalty == 0.1 and paper.method.inject_from_step == 2
    assert (paper.method.evolution.every, paper.method.evolution.threshold) == (5, 0.4)
    assert compose(plugins, "skillrl", preset="micro").method.rl.steps == 2


RECORD = json.dumps([{"title": "Open containers", "principle": "Open closed receptacles before searching.",
                      "when_to_apply": "always", "description": "Searching the same place twice",
                      "why_it_happens": "no memory", "how_to_avoid": "Go somewhere new."}])


def test_fake_run_without_training_distils_retrieves_and_stays_frozen(plugins, fast, tmp_path):
    overrides = [*fast, f"llm.reply={json.dumps(RECORD)}", "method.teacher.reply_prefix=false", "method.sft.enabled=false",
                 "method.rl.steps=0", "method.collect.tasks=3", "learn.max_steps=4"]
    path, results = protocol.run("skillrl", overrides=overrides, out=tmp_path / "f", plugins=plugins)
    assert results.valid is True, results.violations
    sizes = results.state.method
    assert sizes["general_skills"] == 1 and sizes["mistakes"] == 1 and sizes["bank_version"] == 1
    assert sizes["teacher_calls"] == 3 + 1 and sizes["teacher_tokens_in"] > 0  # 3 trajectories + consolidation
    assert results.learn.used_valid_split is False  # no evolution: valid never asked for
    assert results.state.memory_items == 2
    assert results.state.digest_before_eval == results.state.digest_after_eval
    evaluated = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    evaluated = [e for e in evaluated if e["phase"] == "evaluate"]
    assert evaluated and all(set(e["experience_ids"]) == {"skillrl:gen_001", "skillrl:mis_001"} for e in evaluated)


@pytest.mark.slow
def test_tiny_end_to_end_learns_from_valid_and_evaluates_frozen(plugins, tmp_path, monkeypatch):
    # The random tiny model writes no JSON: the teacher's answers are replaced by a fixed record
    # (its calls still run and are counted), so the bank, SFT prompts and evolution have content.
    real_ask = distill.Teacher.ask
    evolved = json.dumps([{"title": "Check every drawer", "principle": "Open each drawer once."}])
    monkeypatch.setattr(distill.Teacher, "ask", lambda self, prompts, seed, max_new_tokens=None: [
        evolved if kind == "evolve" else RECORD
        for (kind, _), _answer in zip(prompts, real_ask(self, prompts, seed, max_new_tokens))])
    path, results = protocol.run("skillrl", overrides=SKILLRL_TINY, out=tmp_path / "t", plugins=plugins)
    assert results.valid is True, results.violations
    assert results.learn.used_valid_split is True and "valid" in results.learn.splits_used
    state = json.loads((path / "method" / "state.json").read_text())
    assert state["stage"] == "done" and state["sft"]["examples"] > 0 and state["steps_done"] == 1
    assert state["evolved_at"] == [1] and set(state["evolution"][0]["accuracy"]) == {
        e["task_type"] for e in map(json.loads, (path / "episodes.jsonl").read_text().splitlines())
        if e["variant"] == "evolve1/valid"}
    # The authors' evolution: one teacher call for all weak types, new dyn_ skills only, which
    # the final evaluation's prompts do not show (evolution.visible_to: training).
    (evolution,) = state["evolution"]
    assert evolution["scheme"] == "authors" and evolution["triggered"] and evolution["revised"] == []
    logged = [json.loads(line) for line in (path / "method" / "teacher.jsonl").read_text().splitlines()]
    assert [len(r["answers"]) for r in logged if r["stage"] == "evolve1"] == [1]
    assert evolution["added"] and all(i.startswith("dyn_") for i in evolution["added"])
    evaluated = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    evaluated = [e for e in evaluated if e["phase"] == "evaluate"]
    assert evaluated and not any(i.startswith("skillrl:dyn_") for e in evaluated for i in e["experience_ids"])
    sizes = results.state.method
    assert sizes["sft_examples"] > 0 and sizes["rl_steps"] == 1 and sizes["teacher_calls"] >= 3
    assert results.learn.used["gradient_steps"] == 1 + 1  # one SFT step, one GRPO step
    assert [p.name for p in (path / "method").glob("checkpoint-*")] == ["checkpoint-00001"]
    fresh = plugins.backends.get("transformers").factory({"model": "tiny"})
    assert results.provenance.model["weights_sha256"] != fresh.weights_digest()
    assert results.state.digest_before_eval == results.state.digest_after_eval
    for split in ("test_seen", "test_unseen"):
        assert results.splits[split].n_episodes == 1
    assert results.cost.evaluate.episodes == 2 and results.cost.learn.tokens_in > 0

    # Killed during evaluation and resumed: SFT weights and the GRPO checkpoint are restored
    # before the digest, so the frozen check still holds.
    lines = (path / "episodes.jsonl").read_text().splitlines(keepends=True)
    (path / "episodes.jsonl").write_text("".join(lines[:-1]))
    (path / "results.json").unlink()
    _, resumed = protocol.run(None, resume=path, plugins=plugins)
    assert resumed.valid is True, resumed.violations
    assert resumed.provenance.model["weights_sha256"] == results.provenance.model["weights_sha256"]
    assert resumed.learn.used_valid_split is True


def test_a_separate_teacher_is_counted_in_the_run_cost_and_apart_in_the_method_sizes(plugins, fast, tmp_path):
    config = tmp_path / "teacher.yaml"
    config.write_text(json.dumps({"method": {"teacher": {"llm": {"backend": "fake", "reply": RECORD},
                                                         "reply_prefix": False}}}))
    overrides = [*fast, "method.sft.enabled=false", "method.rl.steps=0", "method.collect.tasks=2",
                 "learn.max_steps=3"]
    path, results = protocol.run("skillrl", config_file=config, overrides=overrides, out=tmp_path / "s",
                                 plugins=plugins)
    sizes = results.state.method
    assert sizes["teacher_shares_policy_backend"] is False and sizes["teacher_calls"] == 2 + 1
    assert sizes["general_skills"] == 1  # the teacher's reply, not the policy's "A short insight."
    learn = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    policy_calls = sum(e["llm_calls"] for e in learn if e["phase"] == "learn")
    # The teacher is the run's auxiliary model: its calls are in the run's cost beside the policy's.
    assert results.cost.learn.llm_calls == policy_calls + sizes["teacher_calls"]


def test_an_rl_step_makes_one_update_per_mini_batch_of_step_samples(plugins, tmp_path):
    """verl-agent's ppo_mini_batch_size: the step samples of one RL step, split in order, one
    optimizer step each, every one charged to the learning budget."""
    overrides = [*SKILLRL_TINY, "method.sft.enabled=false", "method.evolution.every=0", "method.rl.mini_batch_size=2",
                 "eval.splits=[test_seen]"]
    path, results = protocol.run("skillrl", overrides=overrides, out=tmp_path / "m", plugins=plugins)
    (metrics,) = learned_metrics(path)
    assert metrics["samples"] >= 3  # 2 rollouts of up to 3 steps: more than one mini-batch
    assert metrics["updates"] == -(-metrics["samples"] // 2)
    assert results.learn.used["gradient_steps"] == metrics["updates"]
    assert results.valid is True, results.violations


# -- the authors' routing, order and cold start ---------------------------------------------------


def test_skills_keep_the_banks_order_past_a_thousand():
    """Ids are numbered in order of addition; the number orders them, not the id's text."""
    from arena.core.contract.types import Experience, Provenance
    from arena.plugins.skillrl.retrieval import bank_order

    ids = ["skillrl:gen_1000", "skillrl:gen_999", "skillrl:dyn_002", "skillrl:gen_010"]
    ordered = sorted((Experience(kind="skill", text=i, provenance=Provenance(("t",), "train"), experience_id=i)
                      for i in ids), key=bank_order)
    assert [e.experience_id for e in ordered] == ["skillrl:dyn_002", "skillrl:gen_010", "skillrl:gen_999",
                                                  "skillrl:gen_1000"]


def test_keyword_routing_files_and_finds_skills_by_the_goals_words():
    from arena.plugins.skillrl.retrieval import keyword_category, skill_category

    hot = task(HEAT, goal="put a hot apple in fridge.")
    assert skill_category(hot, "task_type") == HEAT
    assert skill_category(hot, "keywords") == "pick_and_place"  # no "heat" in the words, as theirs
    assert keyword_category("pick up the ball", distilling=True) is None  # their generation skips it
    assert keyword_category("pick up the ball") == "pick_and_place"
    with pytest.raises(ValueError, match="routing must be one of"):
        skill_category(hot, "oracle")


def test_sft_steps_follow_the_epochs_and_the_target_follows_the_solver(plugins):
    from arena.core.contract.method_config import typed_config
    from arena.plugins.skillrl.settings import SkillRLSettings

    default = typed_config(compose(plugins, "skillrl").method, SkillRLSettings)
    assert default.sft.epochs is None and default.sft.steps_for(1_000) == default.sft.steps
    paper = typed_config(compose(plugins, "skillrl", preset="paper").method, SkillRLSettings)
    assert paper.sft.steps_for(7_500) == 1_407  # 3 passes over 7,500 examples in batches of 16
    method = object.__new__(skillrl.SkillRL)
    for mode, target in (("choose", "action"), ("react", "tagged")):
        method.cfg = default
        run = types.SimpleNamespace(settings=types.SimpleNamespace(solver=types.SimpleNamespace(mode=mode)))
        assert method.sft_target(run) == target
    with pytest.raises(ValueError, match="sft.epochs must be > 0"):
        compose_settings = compose(plugins, "skillrl", overrides=["method.sft.epochs=0"]).method
        typed_config(compose_settings, SkillRLSettings)


def test_a_group_of_one_rollout_is_refused_while_rl_runs(plugins) -> None:
    """docs/fidelity.md: a lone rollout has no baseline (the authors leave it its raw reward);
    SkillRL refuses group_size 1 while it trains, and accepts it when RL is off."""
    from arena.core.contract.method_config import typed_config
    from arena.plugins.skillrl.settings import SkillRLSettings

    with pytest.raises(ValueError, match="group_size must be >= 2"):
        typed_config(compose(plugins, "skillrl", overrides=["method.rl.group_size=1"]).method, SkillRLSettings)
    off = typed_config(compose(plugins, "skillrl", overrides=["method.rl.group_size=1", "method.rl.steps=0"]).method,
                       SkillRLSettings)
    assert off.rl.group_size == 1
