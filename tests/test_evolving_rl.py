"""Evolving-RL: group formation, role switches, and one co-evolution iteration end to end."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from omegaconf import OmegaConf

from arena.core import protocol
from arena.core.config.compose import compose
from arena.core.contract.llm import Generation, SamplingParams
from arena.core.contract.types import RolloutTokens, Step, Task, Termination, Trajectory
from arena.core.execution.solver import StandardSolver
from arena.core.rl import group_advantages
from arena.envs.alfworld_tasks import HOUSEHOLD_INSTRUCTIONS
from arena.plugins.evolving_rl import method as evolving
from arena.plugins.evolving_rl.method import Candidate, build_samples
from arena.plugins.evolving_rl.skills import parse_skill
from arena.testing import FakeLLM
from tests.helpers.overrides import EVOLVING_RL_TINY, FAST
from tests.helpers.runs import learned_metrics
from tests.helpers.scripted import TURNS, Room, ScriptedLLM, play_script

CARD_JSON = json.dumps({
    "name": "Find then place", "description": "Find the object, then place it.",
    "when_to_use": ["put tasks"],
    "workflow": [{"step": 1, "goal": "find it", "action": "go to countertop 1"}],
    "decision_rules": ["open closed receptacles"], "error_handling": [],
})
CFG = OmegaConf.create({"train_extractor": True, "train_solver": True, "lambda_extractor": 0.2,
                        "advantage_std": "population", "group_of_one": "zero",
                        "solver_samples": "decision",
                        "lambda_solver": 1.0, "solver_win_reward": 10.0,
                        "solver_progress_reward": 0.0})


def fake_episode(task_id: str, won: bool, steps: int = 2) -> Trajectory:
    task = Task(task_id, "household", "train", "pick_and_place_simple", "put a mug in cabinet.")
    return Trajectory(
        task=task, initial_observation="start",
        steps=[Step("look", "ok", True, rollout=RolloutTokens([1, 2, 3], [4, 5], [-0.5, -0.1]))
               for _ in range(steps)],
        status=Termination.SUCCESS if won else Termination.FAILURE,
    )


def fake_candidates() -> list[Candidate]:
    card = parse_skill(CARD_JSON)
    return [Candidate(source, skill, [1, 2], [7, 8, 9], [-1.0, -1.0, -1.0],
                      None if (source, skill) == (1, 2) else card)
            for source in range(2) for skill in range(3)]


def test_groups_rewards_and_scaled_advantages():
    candidates = fake_candidates()
    owners, episodes = [], []
    wins = {(0, 0): [1, 1], (0, 1): [1, 0], (0, 2): [0, 0], (1, 0): [1, 0], (1, 1): [0, 0]}
    for candidate in candidates:
        if not candidate.usable:
            continue
        for k, won in enumerate(wins[(candidate.source_index, candidate.skill_index)]):
            owners.append((candidate, k))
            episodes.append(fake_episode(f"down{candidate.source_index}{k}", bool(won)))
    samples = build_samples(candidates, owners, episodes, CFG)

    extractor = [s for s in samples if s.role == "extractor"]
    assert [s.group for s in extractor] == ["source0"] * 3 + ["source1"] * 3
    assert [s.reward for s in extractor] == [1.0, 0.5, 0.0, 0.5, 0.0, 0.0]  # unusable card: 0
    expected = group_advantages([1.0, 0.5, 0.0, 0.5, 0.0, 0.0], ["source0"] * 3 + ["source1"] * 3,
                                std="population")  # the authors' grpo_normalize
    assert [s.advantage for s in extractor] == pytest.approx([0.2 * a for a in expected])

    solver = [s for s in samples if s.role == "solver"]
    assert len(solver) == 2 * len(episodes)  # one sample per decision, two decisions per episode
    members: dict[str, list[float]] = {}
    for sample in solver[::2]:
        members.setdefault(sample.group, []).append(sample.reward)
    # a solver group is one downstream task of one source under that source's cards
    assert members == {"source0/down0": [10.0, 10.0, 0.0], "source0/down1": [10.0, 0.0, 0.0],
                       "source1/down0": [10.0, 0.0], "source1/down1": [0.0, 0.0]}
    first = [s for s in solver if s.group == "source0/down0"][::2]
    assert [s.advantage for s in first] == pytest.approx(
        group_advantages([10.0, 10.0, 0.0], ["g"] * 3, std="population"))
    assert all(s.loss_mask == [0, 0, 0, 1, 1] for s in solver)  # prompt masked, action trained


def test_progress_reward_gives_a_group_of_losses_a_signal():
    candidates = fake_candidates()[:2]
    owners = [(candidates[0], 0), (candidates[1], 0)]
    episodes = [fake_episode("d", False), fake_episode("d", False)]
    episodes[0].progress = 2 / 3  # got the object and heated it, then ran out of steps
    solver_cfg = OmegaConf.merge(CFG, {"train_extractor": False})
    authors = build_samples(candidates, owners, episodes, solver_cfg)
    assert all(s.advantage == 0 for s in authors)  # the win alone: two losses say nothing
    shaped = build_samples(candidates, owners, episodes,
                           OmegaConf.merge(solver_cfg, {"solver_progress_reward": 5.0}))
    assert [s.reward for s in shaped[::2]] == pytest.approx([10 / 3, 0.0])
    assert shaped[0].advantage > 0 > shaped[2].advantage


def test_role_switches():
    candidates = fake_candidates()
    owners = [(candidates[0], 0)]
    episodes = [fake_episode("d", True)]
    solver_only = build_samples(candidates, owners, episodes, OmegaConf.merge(CFG, {"train_extractor": False}))
    assert {s.role for s in solver_only} == {"solver"}
    extractor_only = build_samples(candidates, owners, episodes, OmegaConf.merge(CFG, {"train_solver": False}))
    assert {s.role for s in extractor_only} == {"extractor"}


@pytest.mark.slow
def test_unparseable_cards_are_played_as_raw_text_by_default(plugins, tmp_path):
    """The authors play all N x K (card, task) pairs; a card that does not parse is shown as the
    extractor's raw text, in learning and at test time, and earns the extractor nothing."""
    path, results = protocol.run("evolving_rl", overrides=EVOLVING_RL_TINY, out=tmp_path / "raw", plugins=plugins)
    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    downstream = [e for e in episodes if e["phase"] == "learn" and "/skill" in e["variant"]]
    assert len(downstream) == 2 * 2 * 2  # every (card, task) pair, though no card parses
    assert all(e["experience_ids"] for e in downstream)
    assert learned_metrics(path)[0]["solver/n_tokens"] > 0
    # at test time the primary episode is played with the raw card, not copied
    primary = [e for e in episodes if e["phase"] != "learn" and e["variant"] == "default"]
    assert primary and all(e["copy_of"] is None and e["llm_calls"] > 0 for e in primary)
    assert results.valid is True


def test_the_solver_is_asked_to_judge_whether_the_skill_applies(plugins):
    """The authors' with-skill prompt tells the solver to analyse, in its reasoning, whether the
    skill applies; every card the solver is shown (parsed or raw) comes after that instruction,
    and ``method.skill_applicability=false`` shows the card alone."""
    from arena.core.contract.method_config import typed_config
    from arena.plugins.evolving_rl.method import APPLICABILITY, Candidate, candidate_experience
    from arena.plugins.evolving_rl.settings import EvolvingRLSettings

    assert typed_config(compose(plugins, "evolving_rl").method, EvolvingRLSettings).skill_applicability is True
    source = Task(task_id="s", env="household", split="train", task_type="pick", goal="put a mug")
    card = parse_skill(CARD_JSON)
    parsed = Candidate(0, 0, [], [], [], card)
    raw = Candidate(0, 1, [], [], [], None, text="no card here")
    for candidate, body in ((parsed, card.render()), (raw, "no card here")):
        shown = candidate_experience(candidate, source, True).text
        assert shown == APPLICABILITY + body and "judge" in shown and "applies" in shown
        assert candidate_experience(candidate, source, False).text == body
    # A card that parses but fails the language audit is shown as the card, not as the raw reply
    # (the authors show the parsed skill; the audit only zeroes the extractor's reward).
    repeated = parse_skill(json.dumps({"name": "look", "description": "Look around. " + "zzzzzzzzzz" * 3}))
    assert not repeated.passed_audit
    failed = Candidate(0, 2, [], [], [], repeated, text='{"name": "look", ...raw reply')
    assert not failed.usable
    shown = candidate_experience(failed, source, False)
    assert shown.text == repeated.render() and shown.metadata["unusable"] is True


def test_a_whole_card_reaches_the_solver(plugins):
    """A 1,500-character card is shown whole (the authors inject the whole card); the harness
    default would cut it at 800 characters."""
    from arena.core.contract.types import Experience, Observation, Provenance
    from arena.core.execution.solver import StandardSolver

    cfg = compose(plugins, "evolving_rl")
    assert cfg.solver.max_experience_chars is None
    card = parse_skill(CARD_JSON)
    text = card.render()
    text = (text + "\n" + "- When the target is closed, open it before moving the object. " * 40)[:1500]
    solver = StandardSolver.from_config(FakeLLM(), cfg.solver)
    task = Task(task_id="t", env="household", split="test_seen", task_type="pick", goal="put a mug")
    trajectory = Trajectory(task=task, initial_observation="start")
    prompt = solver.prompts(task, [Experience(kind="skill", text=text, provenance=Provenance(("t0",), "train"))])(
        Observation(text="start", admissible_actions=("look",)), trajectory)
    assert text.strip() in "\n".join(m["content"] for m in prompt)
    harness = compose(plugins, "base").solver
    cut = StandardSolver.from_config(FakeLLM(), harness).prompts(task, [Experience(kind="skill", text=text, provenance=Provenance(("t0",), "train"))])(
        Observation(text="start", admissible_actions=("look",)), trajectory)
    assert text.strip() not in "\n".join(m["content"] for m in cut)


def test_presets_and_grpo_registration(plugins):
    paper = compose(plugins, "evolving_rl", preset="paper")
    assert (paper.method.n_sources, paper.method.n_skills, paper.method.k_downstream) == (16, 8, 4)
    assert paper.method.trainer.lr == 1e-6 and paper.learn.sampling.top_p == 0.9
    assert compose(plugins, "evolving_rl", preset="solver_only").method.train_extractor is False
    assert compose(plugins, "grpo").method.mode == "grpo"
    grpo_paper = compose(plugins, "grpo", preset="paper")
    assert (grpo_paper.method.mode, grpo_paper.method.group_size) == ("grpo", 8)  # the authors'
    assert (grpo_paper.method.solver_samples, grpo_paper.solver.layout,
            grpo_paper.method.trainer.aggregation) == ("episode", "transcript", "sample-mean")
    assert compose(plugins, "grpo").method.group_size == 4  # the CPU default, declared
    cpu = compose(plugins, "grpo", preset="cpu")
    assert (cpu.method.mode, cpu.method.group_size, cpu.method.valid_every) == ("grpo", 8, 1)
    assert cpu.method.mini_batch_size == 64 and cpu.learn.budget.gradient_steps is None
    assert cpu.method.drop_zero_advantage and not compose(plugins, "grpo").method.drop_zero_advantage
    evolving_cpu = compose(plugins, "evolving_rl", preset="cpu")
    assert (evolving_cpu.method.mode, evolving_cpu.method.n_skills, evolving_cpu.method.k_downstream) == (
        "coevolve", 8, 1)
    # the same solver episodes per iteration as grpo's cpu preset: 3 groups of 8
    assert (evolving_cpu.method.n_sources * evolving_cpu.method.k_downstream, evolving_cpu.method.n_skills) == (
        cpu.method.n_sources, cpu.method.group_size)
    assert evolving_cpu.method.drop_zero_advantage and evolving_cpu.method.trainer.lora.r == 16
    with pytest.raises(Exception, match="Unknown preset 'papr'.*Available: cpu, extractor_only, micro, paper"):
        compose(plugins, "evolving_rl", preset="papr")


@pytest.mark.slow
def test_one_coevolution_iteration_end_to_end(plugins, tmp_path, monkeypatch):
    # The random tiny model never writes valid JSON; accept its text as a fixed card so the
    # downstream (skill, task) episodes run. Tokens and log-probs stay the model's own.
    monkeypatch.setattr(evolving, "parse_skill", lambda text: parse_skill(CARD_JSON))
    path, results = protocol.run("evolving_rl", overrides=EVOLVING_RL_TINY, out=tmp_path / "e", plugins=plugins)
    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    learn = [e for e in episodes if e["phase"] == "learn"]
    assert len(learn) == 2 + 2 * 2 * 2  # sources + (skill, task) pairs
    assert all("/skill" in e["variant"] for e in learn if "/source0/" in e["variant"] or "/source1/" in e["variant"])
    assert all(e["experience_ids"] for e in learn if "/skill" in e["variant"])
    assert results.learn.used["gradient_steps"] == 1
    assert [p.name for p in (path / "method").glob("checkpoint-*")] == ["checkpoint-00001"]
    state = json.loads((path / "method" / "state.json").read_text())
    (metrics,) = learned_metrics(path)
    assert state["iterations_done"] == 1 and metrics["samples"] > 0
    assert metrics["extractor/n_tokens"] > 0 and metrics["solver/n_tokens"] > 0
    # the shared weights moved: the served model is no longer the tiny model as built
    fresh = plugins.backends.get("transformers").factory({"model": "tiny"})
    assert results.provenance.model["weights_sha256"] != fresh.weights_digest()
    # paired evaluation: with the skill (primary) and without it, plus the source episode
    assert results.valid is True
    for split in ("test_seen", "test_unseen"):
        assert results.splits[split].n_episodes == 1
        assert results.splits[split].variants["without_skill"].n_episodes == 1
    assert results.cost.evaluate.episodes == 2 * 3

    # Killed during evaluation, resumed: the learned weights are restored before the digest.
    lines = (path / "episodes.jsonl").read_text().splitlines(keepends=True)
    (path / "episodes.jsonl").write_text("".join(lines[:-1]))
    (path / "results.json").unlink()
    _, resumed = protocol.run(None, resume=path, plugins=plugins)
    assert resumed.valid is True, resumed.violations
    assert resumed.provenance.model["weights_sha256"] == results.provenance.model["weights_sha256"]
    assert resumed.cost.evaluate.episodes == 2 * 3


@pytest.mark.slow
def test_paired_evaluation_copies_instead_of_replaying_when_no_card_is_usable(plugins, tmp_path):
    # With unusable cards skipped (not the default), the random tiny model's invalid card leaves
    # the primary episode to repeat the without-skill one: recorded as its copy, not played.
    overrides = EVOLVING_RL_TINY + ["method.iterations=0", "learn.max_steps=2", "method.unusable_cards=skip"]
    path, results = protocol.run("evolving_rl", overrides=overrides, out=tmp_path / "c", plugins=plugins)
    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    primary = [e for e in episodes if e["variant"] == "default"]
    without = {e["task_id"]: e for e in episodes if e["variant"] == "without_skill"}
    sources = [e for e in episodes if e["variant"].startswith("eval_source/")]
    assert len(primary) == 2 and all(e["copy_of"] == "without_skill" for e in primary)
    for e in primary:
        assert (e["success"], e["steps"], e["status"]) == (without[e["task_id"]]["success"],
                                                           without[e["task_id"]]["steps"],
                                                           without[e["task_id"]]["status"])
        assert e["llm_calls"] == 0
    assert all(e["steps"] <= 2 for e in sources)  # helper episodes capped at learn.max_steps
    assert results.cost.evaluate.episodes == 2 * 2
    assert results.cost.evaluate.copied_episodes == 2
    assert results.valid is True


@pytest.mark.slow
def test_grpo_baseline_end_to_end(plugins, tmp_path):
    path, results = protocol.run("grpo", overrides=EVOLVING_RL_TINY, out=tmp_path / "g", plugins=plugins)
    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    assert len([e for e in episodes if e["phase"] == "learn"]) == 2 * 2  # tasks x group size
    assert results.learn.used["gradient_steps"] == 1
    assert results.splits["test_seen"].variants is None  # no skills at evaluation
    assert results.cost.evaluate.episodes == 2


@pytest.mark.slow
def test_grpo_with_skill_is_evaluated_with_and_without_its_own_card(plugins, tmp_path):
    """The authors' GRPO-with-skill row: method.eval_with_skill=true evaluates the GRPO model as
    Evolving-RL is evaluated (a source episode, a card, the task with it and without it)."""
    path, results = protocol.run("grpo", overrides=[*EVOLVING_RL_TINY, "method.eval_with_skill=true"],
                                 out=tmp_path / "g", plugins=plugins)
    variants = {json.loads(line)["variant"] for line in (path / "episodes.jsonl").read_text().splitlines()}
    assert {"without_skill", "default"} <= variants and any(v.startswith("eval_source/") for v in variants)
    for split in ("test_seen", "test_unseen"):
        variants_of = results.splits[split].variants
        assert variants_of is not None and variants_of["without_skill"].n_episodes == 1


@pytest.mark.slow
def test_grpo_drops_groups_without_a_signal_before_its_update(plugins, tmp_path):
    # The tiny random model wins nothing in 3 steps: every group has advantage 0, so nothing
    # is left to train on and no gradient step is taken (without the option: one step).
    path, results = protocol.run("grpo", overrides=[*EVOLVING_RL_TINY, "method.drop_zero_advantage=true"],
                                 out=tmp_path / "g", plugins=plugins)
    (metrics,) = learned_metrics(path)
    assert metrics["success"] == 0.0
    assert metrics["samples"] > 0 and metrics["samples_dropped"] == metrics["samples"]
    assert results.learn.used["gradient_steps"] == 0


class Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so nothing on the way catches it."""


@pytest.mark.slow
def test_kill_mid_iteration_resumes_without_replaying_or_losing_rollouts(plugins, tmp_path, monkeypatch):
    from arena.core.execution.context import LEARN
    from arena.core.rl.trainer import PolicyTrainer
    from arena.core.storage.rundir import RunDir

    monkeypatch.setattr(evolving, "parse_skill", lambda text: parse_skill(CARD_JSON))
    real_record, real_step, real_extract = RunDir.record, PolicyTrainer.step, evolving.EvolvingRL.extract
    recorded: list[tuple] = []
    lock = threading.Lock()

    def record_then_die(self, result, trajectory):
        with lock:  # episodes end in several threads at once
            if result.phase == "learn" and len(recorded) >= 5:  # 2 sources + 3 of 8 downstream
                raise Killed()
            real_record(self, result, trajectory)
            recorded.append(result.key)

    monkeypatch.setattr(RunDir, "record", record_then_die)
    with pytest.raises(Killed):
        protocol.run("evolving_rl", overrides=EVOLVING_RL_TINY, out=tmp_path / "k", plugins=plugins)
    path = tmp_path / "k"
    assert len(recorded) == 5 and (path / "rollouts").is_dir()

    monkeypatch.setattr(RunDir, "record", real_record)
    stepped, learn_extracts = [], []

    def spy_step(self, samples, on_micro_batch=None):
        stepped.append(list(samples))
        return real_step(self, samples, on_micro_batch)

    def spy_extract(self, run, sources, n, seed, params=None):
        if run.phase == LEARN:
            learn_extracts.append(n)
        return real_extract(self, run, sources, n, seed, params)

    monkeypatch.setattr(PolicyTrainer, "step", spy_step)
    monkeypatch.setattr(evolving.EvolvingRL, "extract", spy_extract)
    _, results = protocol.run(None, resume=path, plugins=plugins)

    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    learn = [e for e in episodes if e["phase"] == "learn"]
    keys = [(e["task_id"], e["variant"]) for e in learn]
    assert len(learn) == 2 + 2 * 2 * 2 and len(set(keys)) == len(keys)  # nothing played twice
    assert learn_extracts == []  # the interrupted attempt's cards were reused, not re-sampled
    (samples,) = stepped
    solver = [s for s in samples if s.role == "solver"]
    extractor = [s for s in samples if s.role == "extractor"]
    downstream_steps = sum(e["steps"] for e in learn if "/skill" in e["variant"])
    assert len(solver) == downstream_steps  # the reloaded episodes kept their rollout tokens
    assert len(extractor) == 2 * 2
    assert results.valid is True and results.learn.used["gradient_steps"] == 1
    assert not (path / "rollouts").exists()  # discarded once the update was checkpointed
    assert sorted(p.name for p in (path / "method").glob("checkpoint-*")) == ["checkpoint-00001"]


def test_the_extractor_reads_the_reasoning_a_free_text_solver_wrote():
    """The authors' extractor reads the whole episode, the solver's reasoning included; a
    constrained choice writes none, so its transcript is unchanged."""
    from arena.core.contract.types import Step
    from arena.envs.household.environment import HouseholdEnvironment
    from arena.plugins.evolving_rl.prompts import extractor_prompt

    instructions = HouseholdEnvironment(level="easy", n_train=4, n_valid=2, n_test=2).instructions()
    task = Task(task_id="s", env="household", split="train", task_type="pick", goal="put a mug")
    trajectory = Trajectory(task=task, initial_observation="You are in a kitchen.", steps=[
        Step("go to desk 1", "You see a mug.", True, thought="<reasoning>The mug may be on the desk.</reasoning>"),
        Step("take mug 1 from desk 1", "You pick up the mug.", True)])
    shown = extractor_prompt(trajectory, instructions)[1]["content"]
    assert "The mug may be on the desk." in shown
    assert shown.index("The mug may be on the desk.") < shown.index("> go to desk 1")
    assert "The mug may be on the desk." not in extractor_prompt(trajectory, instructions, reasoning=False)[1]["content"]


def test_extractor_reply_prefix_is_prompt_and_part_of_the_card():
    """The prefix opens the assistant's reply; the card parsed is prefix + generated text."""
    from types import SimpleNamespace

    from arena.core.contract.llm import SamplingParams

    body = CARD_JSON.removeprefix('{"name": "')
    seen = []

    class Stub:
        def generate(self, prompts, params):
            seen.extend(prompts)
            return [Generation(body, [5, 6], [-0.1, -0.2], 10, 2, [1, 2, 3]) for _ in prompts]

    method = object.__new__(evolving.EvolvingRL)
    method.cfg = OmegaConf.create({"extractor_reply_prefix": '{"name": "', "extractor_max_tokens": 8,
                                     "extractor_steps_shown": 30})
    run = SimpleNamespace(llm=Stub(), env=SimpleNamespace(instructions=HOUSEHOLD_INSTRUCTIONS))
    (candidate,) = method.extract(run, [fake_episode("t1", won=True)], 1, seed=0, params=SamplingParams())
    assert seen[0][-1] == {"role": "assistant", "content": '{"name": "'}
    assert candidate.usable and candidate.card.name == "Find then place"
    assert candidate.token_ids == [5, 6]  # only generated tokens are trained on
    method.cfg = OmegaConf.create({"extractor_reply_prefix": None, "extractor_max_tokens": 8,
                                   "extractor_steps_shown": None})
    (candidate,) = method.extract(run, [fake_episode("t1", won=True, steps=40)], 1, seed=0,
                                  params=SamplingParams())
    assert seen[-1][-1]["role"] == "user" and candidate.card is None  # body alone is not JSON
    # extractor_steps_shown: null shows the whole episode (the authors'), 30 its last 30 steps
    assert seen[-1][-1]["content"].count("> look") == 40
    assert seen[0][-2]["content"].count("> look") == 2


@pytest.mark.parametrize("pool", ["train", "all_types"])
def test_the_test_time_source_comes_from_the_protocols_source_pool(plugins, tmp_path, pool):
    """With ``eval.source_pool=all_types`` a held-out-type test task can borrow a source of its
    own type (the authors' pool of every type); by default only the train split is consulted."""
    overrides = EVOLVING_RL_TINY + ["method.iterations=0", "learn.max_steps=2", "eval.max_steps=2",
                        "eval.splits=[test_unseen]", "eval.limit=2", f"eval.source_pool={pool}"]
    path, results = protocol.run("evolving_rl", overrides=overrides, out=tmp_path / pool, plugins=plugins)
    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    sources = [e for e in episodes if e["variant"].startswith("eval_source/")]
    assert len(sources) == 2
    source_of = {e["variant"].split("/", 1)[1]: e for e in sources}
    looks = [e for e in episodes if e["variant"] == "default" and e["task_type"] == "look_at_obj_in_light"]
    assert looks
    for e in looks:  # no train goal mentions a desklamp: only the pool's look_at games match
        source = source_of[e["task_id"]]
        if pool == "all_types":
            assert (source["split"], source["task_type"]) == ("pool", e["task_type"])
        else:
            assert source["split"] == "train"
    assert results.protocol.source_pool == pool and results.valid is True


def test_a_cut_episode_split_into_decisions_is_counted_not_silent():
    """With one sample per episode asked for, an episode whose prompts do not extend each other
    (a transcript cut to fit llm.max_context) trains one sample per decision: counted and shown."""
    cut = fake_episode("cut", won=True)  # every step's prompt is [1, 2, 3]: no growing context
    task = cut.task
    grown = Trajectory(task=task, initial_observation="start", status=Termination.SUCCESS, steps=[
        Step("look", "ok", True, rollout=RolloutTokens([1, 2, 3], [4, 5], [-0.5, -0.1])),
        Step("look", "ok", True, rollout=RolloutTokens([1, 2, 3, 4, 5, 6], [7], [-0.2]))])
    assert evolving.split_episodes([cut, grown], "episode") == 1
    assert evolving.split_episodes([cut, grown], "decision") == 0
    assert len(evolving.solver_samples(cut, "g", 10.0, 1.0, "episode")) == 2  # its decisions
    assert len(evolving.solver_samples(grown, "g", 10.0, 1.0, "episode")) == 1
    assert "1 episodes split into decisions" in evolving._progress_note({"solver_episodes_split": 1})
    assert "split" not in evolving._progress_note({"solver_episodes_split": 0, "success": 0.5})


def test_the_paper_preset_reads_the_authors_lengths(plugins):
    """Context, test-time card length, the whole source episode and recomputed old log-probs,
    as the authors (the CPU default keeps its own, declared on docs/fidelity.md)."""
    paper = compose(plugins, "evolving_rl", preset="paper")
    assert paper.llm.max_context == 16384 and paper.method.eval_extractor_max_tokens == 4096
    assert paper.method.extractor_steps_shown is None
    assert paper.method.trainer.old_logprobs == "recompute"
    default = compose(plugins, "evolving_rl")
    assert (default.llm.max_context, default.method.eval_extractor_max_tokens,
            default.method.extractor_steps_shown, default.method.trainer.old_logprobs) == (
        2048, None, 30, "rollout")
    assert compose(plugins, "skillrl", preset="paper").llm.max_context == 4096 + 512


FITS = TURNS["fits"]


def _play_react(script: list[Any], end: bool) -> tuple[Trajectory, Room]:
    solver = StandardSolver(ScriptedLLM(script), mode="react", layout="transcript", reasoning_max_tokens=8,
                            end_at_context_limit=end)
    return play_script(solver, len(script))


def test_a_turn_that_does_not_fit_ends_the_episode_as_the_authors_end_it():
    """solver.end_at_context_limit (the paper preset's): a reply that runs to its token limit
    without closing its action is kept (its tokens are trained on) but never played, and the
    episode ends (the authors' finish "length"); a turn whose transcript had to be cut to fit the
    context is dropped and the episode ends (their "no room"). Off, both turns are played."""
    long_reply = ("<reasoning>" + "so " * 20, 8, False)
    ended, room = _play_react([FITS, long_reply, FITS], end=True)
    assert ended.status is Termination.CONTEXT_LIMIT and room.played == ["look"]
    assert len(ended.steps) == 2 and ended.steps[-1].observation == "" and ended.steps[-1].rollout is not None
    assert ended.llm_calls == 2
    cut, room = _play_react([FITS, FITS, ("<action>wait</action>", 5, True)], end=True)
    assert cut.status is Termination.CONTEXT_LIMIT and len(cut.steps) == 2 and room.played == ["look", "look"]
    assert cut.llm_calls == 3  # the dropped turn's cost is still counted
    # A reply that closed its action at the limit fits (the authors' stop string ends it there).
    closed, _ = _play_react([FITS, ("<action>look</action>", 8, False)], end=True)
    assert closed.status is Termination.STEP_LIMIT and len(closed.steps) == 2
    for script in ([FITS, long_reply, FITS], [FITS, FITS, ("<action>wait</action>", 5, True)]):
        going_on, room = _play_react(script, end=False)
        assert going_on.status is Termination.STEP_LIMIT and len(room.played) == 3


def test_the_transformers_backend_says_when_it_cut_a_prompt():
    from arena.backends.transformers_backend import TransformersBackend

    llm = TransformersBackend({"model": "tiny", "dtype": "float32", "max_context": 80})
    short = [{"role": "user", "content": "hi"}]
    long = [{"role": "user", "content": "first " * 30}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "filler " * 60}]
    fits, cut = llm.generate([short, long], SamplingParams(max_new_tokens=4))
    assert not fits.prompt_cut and cut.prompt_cut


def test_the_paper_preset_ends_episodes_at_the_context_limit(plugins):
    for method in ("evolving_rl", "grpo"):
        assert compose(plugins, method, preset="paper").solver.end_at_context_limit is True
        assert compose(plugins, method).solver.end_at_context_limit is False


def test_the_paper_preset_names_the_authors_retrieval_embedder(plugins, tmp_path, monkeypatch):
    """The paper preset retrieves with Qwen3-Embedding-4B (the tests run it with the hashing
    embedder, as they run the tiny model); without its weights the run stops before it plays,
    naming the fix; the embedder itself pools the last token of a local model."""
    from arena.backends.embedded import tiny_model_dir
    from arena.core.services.embedder import LastTokenEmbedder, make_embedder

    for method in ("evolving_rl", "grpo"):
        assert compose(plugins, method, preset="paper").embedder.name == "qwen3-embedding-4b"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(RuntimeError, match=r"huggingface-cli download Qwen/Qwen3-Embedding-4B.*embedder.name=minilm"):
        make_embedder({"name": "qwen3-embedding-4b"})
    with pytest.raises(RuntimeError, match="embedder.name=minilm"):
        protocol.run("evolving_rl", overrides=[*FAST, "embedder.name=qwen3-embedding-4b"],
                     out=tmp_path / "run", plugins=plugins)
    local = LastTokenEmbedder(model_id=str(tiny_model_dir()), name="tiny")
    vectors = local.embed(["put a mug in the cabinet", "heat an egg", "put a mug in the cabinet"])
    assert vectors.shape == (3, local.dim) and abs(float(vectors[0] @ vectors[0]) - 1.0) < 1e-5
    assert float(vectors[0] @ vectors[2]) > 0.9999 and float(vectors[0] @ vectors[1]) < 0.9999


def test_a_reply_stops_at_its_stop_string_and_keeps_it(plugins):
    """solver.stop_after_action (the paper preset's): the react reply ends at the first
    </action>, kept, as the authors' SGLang call stops it; the backend keeps the shortest prefix of
    the reply that holds the stop string (decoding is causal: the reply generation would have
    stopped at)."""
    from arena.backends.transformers_backend import TransformersBackend

    llm = TransformersBackend({"model": "tiny", "dtype": "float32"})
    prompt = [{"role": "user", "content": "Say something."}]
    (free,) = llm.generate([prompt], SamplingParams(max_new_tokens=24))
    stop = free.text[6:10]
    assert len(stop) == 4 and stop in free.text
    (stopped,) = llm.generate([prompt], SamplingParams(max_new_tokens=24, stop=(stop,)))
    k = len(stopped.token_ids)
    assert stopped.token_ids == free.token_ids[:k] and stopped.logprobs == free.logprobs[:k]
    assert stop in stopped.text and stop not in llm.tokenizer.decode(free.token_ids[: k - 1])
    (no_stop,) = llm.generate([prompt], SamplingParams(max_new_tokens=24, stop=("\x00never",)))
    assert no_stop.token_ids == free.token_ids
    asked: list[SamplingParams] = []
    for on in (True, False):
        backend = ScriptedLLM([FITS])
        play_script(StandardSolver(backend, mode="react", stop_after_action=on), 1)
        asked += backend.asked
    assert [p.stop for p in asked] == [("</action>",), ()]
    assert compose(plugins, "evolving_rl", preset="paper").solver.stop_after_action is True


@pytest.mark.slow
def test_an_empty_extractor_reply_is_played_without_a_skill(plugins, tmp_path, monkeypatch):
    """No card and an empty reply: the authors play the task with no skill (an empty skill
    selects their no-skill prompt), in learning and at test time (where the with-skill result is
    then the no-skill one)."""
    assert Candidate(0, 0, [], [], [], None, text="  \n").blank
    assert not Candidate(0, 0, [], [], [], None, text="no card").blank
    extract = evolving.EvolvingRL.extract

    def blank(self: Any, *args: Any, **kwargs: Any) -> list[Candidate]:
        candidates = extract(self, *args, **kwargs)
        for candidate in candidates:
            candidate.text, candidate.card = "", None
        return candidates

    monkeypatch.setattr(evolving.EvolvingRL, "extract", blank)
    path, results = protocol.run("evolving_rl", overrides=EVOLVING_RL_TINY, out=tmp_path / "blank", plugins=plugins)
    episodes = [json.loads(line) for line in (path / "episodes.jsonl").read_text().splitlines()]
    downstream = [e for e in episodes if e["phase"] == "learn" and "/skill" in e["variant"]]
    assert len(downstream) == 2 * 2 * 2 and not any(e["experience_ids"] for e in downstream)
    primary = [e for e in episodes if e["phase"] != "learn" and e["variant"] == "default"]
    assert primary and all(e["copy_of"] == "without_skill" for e in primary)
    assert results.valid is True
