"""SkillRL (aiming-lab/SkillRL): a teacher-distilled SkillBank, cold-start SFT, GRPO with
skill-augmented prompts, and recursive evolution of the bank from validation failures.

The authors' pipeline (``methods.md`` section 2), inside Arena's protocol; the learning phase
runs these stages, each checkpointed in the method's state (``run.method_state``):

1. **collect**: the base policy plays ``collect.tasks`` train tasks without skills (the
   authors' base-model rollouts that o3 turns into memories);
2. **distill**: the teacher writes one task-type skill per success, one mistake per failure,
   then consolidates them into general skills (:mod:`.distill`); the bank is mirrored into the
   experience store (:mod:`.skillbank`);
3. **sft**: demonstrations of ``sft.tasks`` train tasks, played by the teacher (or the
   environment's expert, ``sft.demonstrations``) with the skill-augmented prompt, become
   prompt -> completion examples for trl's SFTTrainer (``sft.target``: the bare action, or the
   reasoning and the action in the react solver's tags), for ``sft.steps`` steps or
   ``sft.epochs`` passes, trained by the harness (``run.fine_tune``, which keeps the update and
   restores it on resume); the result is the RL reference;
4. **rl**: ``rl.steps`` GRPO steps on the harness's trainer (``run.trainer``):
   ``rl.tasks_per_step`` train tasks x ``rl.group_size`` rollouts with retrieved skills (from
   step ``inject_from_step`` of each episode), reward ``win_reward`` x won, less
   ``invalid_action_penalty`` on each step whose reply was malformed, groups per task; one
   checkpoint per step (``skillrl/checkpoint-NNNNN``);
5. **evolve** every ``evolution.every`` steps: the policy plays ``evolution.valid_tasks`` tasks of
   the **valid** split; for each task type under ``evolution.threshold`` the teacher proposes 1 to
   ``evolution.max_new_skills`` new (``dyn_NNN``) or revised skills from at most
   ``evolution.max_failures`` failed trajectories. Asking for valid tasks is recorded by the
   harness: ``results.json`` says ``learn.used_valid_split: true``.

Evaluation is frozen: ``retrieve`` reads the bank from the (read-only) store, ``solve`` shows it
from step ``inject_from_step`` on, the weights are the learned ones with LoRA merged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import arena
from arena import (
    Action,
    Episode,
    EpisodeRequest,
    Experience,
    Observation,
    Policy,
    Run,
    StandardSolver,
    Task,
    Trajectory,
    episode_seed,
    rl,
    run_in_threads,
    select_tasks,
    typed_config,
    write_json_atomic,
)
from arena.plugins.skillrl.distill import (
    Teacher,
    build_teacher,
    consolidate_prompt,
    evolve_general_prompt,
    evolve_prompt,
    parse_mistakes,
    parse_skills,
    trajectory_prompt,
)
from arena.plugins.skillrl.retrieval import (
    embedding_retrieve,
    make_prompt_builder,
    skill_category,
    template_retrieve,
)
from arena.plugins.skillrl.settings import (
    ADVANTAGE_OVER,
    EVOLVE_AUTHORS,
    EVOLVE_PER_TYPE,
    SFT_TARGET_ACTION,
    SFT_TARGET_AUTO,
    SFT_TARGET_TAGGED,
    VISIBLE_TO_ALL,
    SkillRLSettings,
)
from arena.plugins.skillrl.skillbank import GENERAL, MISTAKE, SKILL, SkillBank, sync_store

COLLECT, DISTILL, SFT, RL, DONE = "collect", "distill", "sft", "rl", "done"
SOLVER = "solver"
#: The teacher's raw answers, in the method's folder (for inspection, never read back).
TEACHER_LOG = "teacher.jsonl"
#: Added to the error of a run whose backend serves no model to train.
_TRAINING_OFF = ", or turn SkillRL's training off with method.sft.enabled=false method.rl.steps=0"


# -- pure helpers (tested on their own) --------------------------------------------------------


#: The failures group of the authors' scheme (every type together).
ANY_TYPE = "any"


def types_to_evolve(accuracy_by_type: dict[str, float], threshold: float) -> list[str]:
    """Task types whose validation success is below ``threshold`` (the authors' trigger)."""
    return sorted(task_type for task_type, accuracy in accuracy_by_type.items() if accuracy < threshold)


def accuracy_by_type(trajectories: Iterable[Trajectory]) -> dict[str, float]:
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for trajectory in trajectories:
        outcomes[trajectory.task.task_type].append(trajectory.success)
    return {task_type: sum(won) / len(won) for task_type, won in sorted(outcomes.items())}


def evolution_due(steps_done: int, every: int, evolved_at: Iterable[int]) -> bool:
    """After every ``every`` RL steps, once (a resumed run redoes an interrupted evolution)."""
    return every > 0 and steps_done > 0 and steps_done % every == 0 and steps_done not in set(evolved_at)


def episode_reward(trajectory: Trajectory, win_reward: float, invalid_penalty: float) -> float:
    """verl-agent's ALFWorld reward (10 x won) minus the invalid-action penalty per step whose
    reply was malformed (the authors' "invalid": no action or reasoning tags, another script;
    a well-formed inadmissible action is not one)."""
    invalid = sum(not step.well_formed for step in trajectory.steps)
    return win_reward * float(trajectory.success) - invalid_penalty * invalid


def grpo_samples(trajectories: list[Trajectory], groups: list[str], rewards: list[float],
                 *, advantage_over: str = "episodes", win_reward: float = 10.0,
                 invalid_penalty: float = 0.0) -> list[rl.Sample]:
    """One sample per model decision.

    ``episodes``: each carries its episode's group-normalised advantage (``rewards`` per episode).
    ``steps`` (verl-agent's, the authors'): each decision is a member of its group with its own
    reward, ``win_reward`` x won, less ``invalid_penalty`` when that very step's reply was
    malformed (:func:`episode_reward`), and
    the mean and std run over every step sample of the group, so a long failed episode weighs by
    its length (``rewards`` is then unused).
    """
    if advantage_over not in ADVANTAGE_OVER:
        raise ValueError(f"method.rl.advantage_over must be one of {ADVANTAGE_OVER}, "
                         f"not {advantage_over!r}")
    samples = []
    if advantage_over == "episodes":
        for trajectory, group, reward, advantage in zip(trajectories, groups, rewards,
                                                         rl.group_advantages(rewards, groups)):
            samples.extend(rl.decision_samples(trajectory, role=SOLVER, group=group, reward=reward,
                                               advantage=advantage))
        return samples
    for trajectory, group in zip(trajectories, groups):
        won = win_reward * float(trajectory.success)
        decided = [step for step in trajectory.steps if step.rollout is not None and step.rollout.token_ids]
        for step, sample in zip(decided, rl.decision_samples(trajectory, role=SOLVER, group=group,
                                                             reward=won, advantage=0.0)):
            sample.reward = won - (0.0 if step.well_formed else invalid_penalty)
            samples.append(sample)
    rl.assign_advantages(samples, {})
    return samples


def fresh_state() -> dict[str, Any]:
    return {"stage": COLLECT, "bank": None, "teacher": {}, "distill": {}, "sft": {}, "steps_done": 0,
            "evolution": [], "evolved_at": [], "valid_used": False}


class SkillRL:
    """The SkillRL method (see the module docstring)."""

    def __init__(self, run: Run) -> None:
        self.cfg: SkillRLSettings = typed_config(run.cfg.method, SkillRLSettings)
        self.work = run.method_state.folder
        self._trainer: rl.CheckpointedTrainer | None = None
        self._teacher: Teacher | None = None
        self.prompt_builder = make_prompt_builder(self.cfg.inject_from_step,
                                                  self.cfg.retrieval.max_chars,
                                                  self.cfg.retrieval.style)
        run.keep_rollouts()  # a kill mid-step must not lose the rollouts played
        state = self._state(run)
        if self._needs_model():
            # The SFT weights (the RL reference) are served already: the harness restores what
            # run.fine_tune kept before the method is built.
            if state["sft"].get("done") and not state["sft"].get("skipped") and self._kept_by_itself():
                raise RuntimeError(
                    "This SkillRL run fine-tuned its model before Arena kept fine-tunes itself "
                    "(run.fine_tune): its SFT weights are in method/sft-adapter, which this Arena does "
                    "not restore. Finish it with the Arena that started it, or start a new run.")
            if int(state["steps_done"]) or run.method_state.checkpoints().latest():
                latest = self.trainer(run).resume(int(state["steps_done"]), "RL steps")
                counted = rl.StepLedger(run, state).recover(latest)
                if counted is not None:  # killed between a checkpoint and the state that counts it
                    state["steps_done"] = latest
                    run.discard_rollouts()
                    self._save(run, state)
                    run.log_metrics(latest, counted)
            if run.learning_finished() and self._trainer is not None:
                self._trainer.serve()

    # -- state and files -------------------------------------------------------------------------

    @staticmethod
    def _state(run: Run) -> dict[str, Any]:
        return run.method_state.load() or fresh_state()

    def _save(self, run: Run, state: dict[str, Any]) -> None:
        if self._teacher is not None:
            state["teacher"] = self._teacher.cost_dict()
        run.method_state.save(state)

    def _needs_model(self) -> bool:
        return self.cfg.sft.enabled or self.cfg.rl.steps > 0

    def teacher(self, run: Run) -> Teacher:
        if self._teacher is None:
            self._teacher = build_teacher(run, self.cfg.teacher, cost=self._state(run).get("teacher") or None)
        return self._teacher

    def _kept_by_itself(self) -> bool:
        """Whether the SFT update is where SkillRL kept it before ``run.fine_tune`` (a run from
        an older Arena), not with the harness."""
        return (self.work / rl.sft.ADAPTER_DIR).is_dir() or (self.work / rl.sft.FULL_WEIGHTS).is_file()

    def trainer(self, run: Run) -> rl.CheckpointedTrainer:
        """GRPO on the served model (the harness's trainer), built after SFT so its reference is
        the SFT policy."""
        if self._trainer is None:
            self._trainer = run.trainer(dict(self.cfg.rl.trainer), _TRAINING_OFF)
        return self._trainer

    def bank(self, state: dict[str, Any]) -> SkillBank:
        return SkillBank.from_dict(state.get("bank"))

    # -- episodes ------------------------------------------------------------------------------

    def _play(self, run: Run, requests: list[EpisodeRequest], *, mode: str | None = None,
              temperature: float | None = None) -> list[Trajectory]:
        """Play and record ``requests`` side by side: with ``mode`` as demonstrations (the
        teacher's or the expert's), with ``temperature`` by the policy decoding so; else
        through ``solve``."""
        if mode is None and temperature is None:
            return run.play(requests)

        def one(request: EpisodeRequest) -> Trajectory:
            task, run_seed = request.task, request.seed
            assert run_seed is not None, "a new episode names its run seed"
            seed = episode_seed(run_seed, task.task_id, request.variant)
            if mode is None:
                policy = self._policy(run, run.llm, task, request.experiences, seed, temperature)
                return run.play(dataclasses.replace(request, policy=policy))
            demo = self._demonstration(run, task, request.experiences, seed, mode)
            if run.finished(task, run_seed, request.variant) is not None:  # an earlier session's
                return run.play(dataclasses.replace(request, policy=demo))
            # Recorded only once its rows are on disk: a kill in between plays it again.
            trajectory = run.play(dataclasses.replace(request, policy=demo, record=False))
            if mode == "teacher":
                self.teacher(run).charge(trajectory.llm_calls, trajectory.tokens_in,
                                         trajectory.tokens_out)
            self._demo_path(task).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self._demo_path(task), {"success": trajectory.success,
                                                      "rows": demo.rows})
            run.record(trajectory, seed=run_seed, variant=request.variant)
            return trajectory

        return run_in_threads(one, list(requests), workers=run.concurrency, llm=run.llm)

    def _demo_path(self, task: Task) -> Path:
        """Task ids hold slashes; the file name is a digest of the id."""
        return self.work / "demos" / f"{hashlib.sha256(task.task_id.encode()).hexdigest()[:16]}.json"

    def _loaded(self, run: Run, task: Task, seed: int, variant: str) -> Trajectory | None:
        return run.recorded_trajectory(task, seed, variant)

    # -- learning ------------------------------------------------------------------------------

    @arena.hookimpl
    def learn(self, run: Run) -> bool:
        state = self._state(run)
        if state["valid_used"]:
            run.tasks("valid")  # a resumed session records again that valid was learned from
        sync_store(run.store, self.bank(state))  # creates the store: digested either way
        ledger = rl.StepLedger(run, state)  # the optimizer steps, charged once each
        ledger.charge_owed()
        # A continued run (run.continue_from) plays cfg.rl.steps more RL steps, evolving its
        # copied bank, from its copied weights; collection, distillation and SFT are not redone.
        arena.begin_learning_phase(run, state, {"stage": RL, "phase_start": int(state["steps_done"])})
        arena.run_stages(state, [(COLLECT, lambda: self._collect(run)),
                                 (DISTILL, lambda: self._distill(run, state)),
                                 (SFT, lambda: self._sft_stage(run, state, ledger)),
                                 (RL, lambda: self._rl(run, state, ledger))],
                         lambda state: self._save(run, state), done=DONE)
        if self._trainer is not None:
            self._trainer.serve()  # unmerged adapters slow every evaluation forward
        return True

    def train_tasks(self, run: Run, count: int | None, salt: int) -> list[Task]:
        """``count`` train tasks, shuffled by the learn seed and balanced over task types."""
        tasks = list(run.tasks(run.learn_split))
        random.Random(run.learn_seed * 7_919 + salt).shuffle(tasks)
        return select_tasks(tasks, count)

    def _collect(self, run: Run) -> list[Trajectory]:
        tasks = self.train_tasks(run, self.cfg.collect.tasks, salt=1)
        seed = run.learn_seed
        return self._play(run, [EpisodeRequest(task, [], seed, "collect") for task in tasks])

    def _collected(self, run: Run) -> list[Trajectory]:
        seed = run.learn_seed
        found = [self._loaded(run, task, seed, "collect")
                 for task in self.train_tasks(run, self.cfg.collect.tasks, salt=1)]
        return [t for t in found if t is not None]

    def _distill(self, run: Run, state: dict[str, Any]) -> None:
        """Per-trajectory skills (successes) and mistakes (failures), then general skills."""
        cfg, teacher = self.cfg.distill, self.teacher(run)
        trajectories = self._collected(run)
        split = run.learn_split
        bank = self.bank(state)
        seed = run.learn_seed * 1_000_003
        answers = teacher.ask([trajectory_prompt(t, teacher.transcript_chars, run.env.instructions)
                              for t in trajectories], seed)
        bank.begin()
        parsed = {"success": 0, "failure": 0, "skills": 0, "mistakes": 0, "general": 0}
        for trajectory, answer in zip(trajectories, answers):
            task = trajectory.task
            if trajectory.success:
                parsed["success"] += 1
                # Filed under the task's type, or its keyword category (retrieval.routing).
                scope = skill_category(task, self.cfg.retrieval.routing, distilling=True)
                if scope is None or len(bank.for_type(scope)) >= cfg.max_type_skills:
                    continue
                for skill in parse_skills(answer, limit=1):
                    added = bank.add_skill(title=skill["title"], principle=skill["principle"],
                                           when_to_apply=skill["when_to_apply"], scope=scope,
                                           source_split=split, source_task_ids=[task.task_id], added_at="distill")
                    parsed["skills"] += added is not None
            else:
                parsed["failure"] += 1
                if len(bank.mistakes) >= cfg.max_mistakes:
                    continue
                for mistake in parse_mistakes(answer, limit=1):
                    new_mistake = bank.add_mistake(**mistake, source_split=split, source_task_ids=[task.task_id],
                                                   added_at="distill")
                    parsed["mistakes"] += new_mistake is not None
        lines = [s.render() for s in bank.skills.values()] + [m.render() for m in bank.mistakes.values()]
        lines = lines or [f"{t.task.goal} -> {'completed' if t.success else 'failed'}" for t in trajectories]
        if lines and cfg.n_general > 0:
            (answer,) = teacher.ask([consolidate_prompt(lines, cfg.n_general, teacher.transcript_chars,
                                                        run.env.instructions)],
                                    seed + 1, max_new_tokens=cfg.consolidate_max_tokens)
            sources = sorted(t.task.task_id for t in trajectories)
            for skill in parse_skills(answer, limit=cfg.n_general):
                added = bank.add_skill(title=skill["title"], principle=skill["principle"],
                                       when_to_apply=skill["when_to_apply"], scope=GENERAL, source_split=split,
                                       source_task_ids=sources, added_at="distill")
                parsed["general"] += added is not None
        bank.commit()
        state["bank"] = bank.to_dict()
        state["distill"] = {"trajectories": len(trajectories), **parsed,
                            "collect_success": sum(t.success for t in trajectories)}
        self._save(run, state)
        sync_store(run.store, bank)
        self._log(run, "distill", {"answers": answers})

    # -- SFT ------------------------------------------------------------------------------------

    def _sft(self, run: Run, state: dict[str, Any]) -> dict[str, Any]:
        """Demonstrations with skill-augmented prompts, then trl's SFTTrainer."""
        cfg = self.cfg.sft
        mode = cfg.demonstrations
        seed = run.learn_seed
        tasks = self.train_tasks(run, cfg.tasks, salt=2)
        requests = [EpisodeRequest(task, self.retrieve(run, task), seed, "sft_demo") for task in tasks]
        demos = self._play(run, requests, mode=mode, temperature=self.teacher(run).temperature)
        rows: list[dict[str, Any]] = []
        won = 0
        for task, trajectory in zip(tasks, demos):
            path = self._demo_path(task)
            won += trajectory.success
            # A teacher's failed episode is no demonstration (rejection sampling); an expert's
            # episode cut by the step limit still shows only correct actions.
            if path.exists() and (trajectory.success or mode == "expert"):
                rows.extend(json.loads(path.read_text())["rows"])
        summary: dict[str, Any] = {"demonstrations": mode, "tasks": len(tasks), "successful": won,
                                   "examples": len(rows)}
        if not rows:
            summary["skipped"] = "no demonstration to learn from"
            return summary
        settings: dict[str, Any] = dataclasses.asdict(cfg)
        settings["steps"] = cfg.steps_for(len(rows))  # sft.epochs passes, when set
        # The harness trains the model it serves, keeps the update and restores it on resume.
        metrics = run.fine_tune(rows, settings, _TRAINING_OFF)
        # Its duration is no learned state (two equal runs learn one digest): the progress line
        # shows it as the SFT ends.
        kept = {key: value for key, value in metrics.items() if key != "sft/seconds"}
        return {**summary, **kept}  # its sft/steps are charged once the state keeps them

    def _demonstration(self, run: Run, task: Task, experiences: list[Experience], seed: int,
                       mode: str) -> DemonstrationPolicy:
        """The policy of one demonstration episode: the expert's plan or the teacher's choices,
        each decision kept with SkillRL's prompt as an SFT row."""
        act = None if mode == "expert" else self._policy(run, self.teacher(run).backend, task,
                                                         experiences, seed)
        return DemonstrationPolicy(act, self._solver(run, run.llm).prompts(task, experiences),
                                   env_name=run.env_name, target=self.sft_target(run))

    def sft_target(self, run: Run) -> str:
        """``sft.target`` resolved: ``auto`` is what the run's solver writes (tags under react)."""
        target = self.cfg.sft.target
        if target == SFT_TARGET_AUTO:
            return SFT_TARGET_TAGGED if run.settings.solver.mode == "react" else SFT_TARGET_ACTION
        return target

    # -- GRPO and evolution ----------------------------------------------------------------------

    def _sft_stage(self, run: Run, state: dict[str, Any], ledger: rl.StepLedger) -> None:
        """Cold-start SFT (or its skip); its optimizer steps are counted, charged by the RL stage
        once the state that counts them is saved."""
        state["sft"] = self._sft(run, state) if self.cfg.sft.enabled else {"skipped": "disabled"}
        state["sft"]["done"] = True
        ledger.count(int(state["sft"].get("sft/steps", 0)))
        run.discard_rollouts()

    def _rl(self, run: Run, state: dict[str, Any], ledger: rl.StepLedger) -> None:
        ledger.charge_owed()  # the SFT steps the saved state counts (repeatable: a no-op if none)
        cfg = self.cfg.rl
        steps = cfg.steps
        every = self.cfg.evolution.every
        train = list(run.tasks(run.learn_split))
        trainer = self.trainer(run) if steps > 0 else None
        phase_start = int(state.get("phase_start", 0))
        with run.progress("skillrl: RL steps", total=steps) as shown:
            shown.update(int(state["steps_done"]) - phase_start)
            self._rl_steps(run, state, train, trainer, shown, ledger, phase_start)
        if evolution_due(int(state["steps_done"]), every, state["evolved_at"]):
            self._evolve(run, state, int(state["steps_done"]))

    def _rl_steps(self, run: Run, state: dict[str, Any], train: list[Task],
                  trainer: rl.CheckpointedTrainer | None, shown: Any, ledger: rl.StepLedger,
                  phase_start: int) -> None:
        """RL steps ``phase_start + 1`` to ``phase_start + rl.steps`` (numbered across phases:
        a second phase draws new tasks and writes new checkpoints)."""
        cfg = self.cfg.rl
        every = self.cfg.evolution.every
        seed = run.learn_seed
        for step in range(int(state["steps_done"]), phase_start + cfg.steps):
            if evolution_due(int(state["steps_done"]), every, state["evolved_at"]):
                self._evolve(run, state, int(state["steps_done"]))
            if run.budget_exhausted():
                return
            assert trainer is not None
            clock = time.perf_counter()
            rng = random.Random(seed * 100_003 + step)
            tasks = rng.sample(train, min(cfg.tasks_per_step, len(train)))
            requests = [EpisodeRequest(task, self._experiences(run, task, rollout=True), seed,
                                       f"step{step}/task{i}/rollout{g}")
                        for i, task in enumerate(tasks) for g in range(cfg.group_size)]
            episodes = self._play(run, requests)
            rollout_s, clock = time.perf_counter() - clock, time.perf_counter()
            rewards = [episode_reward(t, cfg.win_reward, cfg.invalid_action_penalty) for t in episodes]
            groups = [r.variant.rsplit("/", 1)[0] for r in requests]
            samples = grpo_samples(episodes, groups, rewards,
                                   advantage_over=cfg.advantage_over,
                                   win_reward=cfg.win_reward,
                                   invalid_penalty=cfg.invalid_action_penalty)
            metrics: dict[str, Any] = {"rl_step": step, "success": _mean([t.success for t in episodes]),
                                       "reward": _mean(rewards), "samples": len(samples),
                                       "time/rollout_s": rollout_s}
            if samples and any(s.n_trained for s in samples):
                # verl-agent's updates: the step samples split in order into mini-batches of
                # ``rl.mini_batch_size``, one optimizer step each (null: one step).
                metrics.update(trainer.update(samples, mini_batch_size=cfg.mini_batch_size,
                                              progress=run.progress, label=f"step{step}"))
            # Charged once the checkpoint and the state that counts it are saved.
            arena.checkpoint_update(run, trainer, ledger, state, "steps_done", step + 1, metrics,
                                    save=lambda state: self._save(run, state))
            run.log_metrics(step + 1, metrics)  # step: RL steps done
            shown.update(step + 1 - phase_start, note=f"success {metrics['success']:.0%}")

    def _evolve(self, run: Run, state: dict[str, Any], step: int) -> None:
        """Validate on the valid split; the teacher grows the bank when a task type is weak."""
        cfg, teacher = self.cfg.evolution, self.teacher(run)
        valid = list(run.tasks("valid"))  # recorded by the harness as learning from valid
        state["valid_used"] = True
        random.Random(run.learn_seed * 31 + step).shuffle(valid)
        tasks = select_tasks(valid, cfg.valid_tasks)
        seed = run.learn_seed
        requests = [EpisodeRequest(task, self._experiences(run, task, rollout=False), seed,
                                   f"evolve{step}/valid") for task in tasks]
        episodes = self._play(run, requests, temperature=cfg.temperature)
        accuracy = accuracy_by_type(episodes)
        weak = types_to_evolve(accuracy, cfg.threshold)
        bank = self.bank(state)
        prompts, failures_by_group = [], {}
        scheme = cfg.scheme
        limits: dict[str, Any] = {"max_new": cfg.max_new_skills, "last_steps": cfg.last_steps,
                                  "max_chars": teacher.transcript_chars, "instructions": run.env.instructions}
        if scheme == EVOLVE_AUTHORS and weak:
            # One call: the first failures of any type, the titles of the bank, new general skills.
            failures = [t for t in episodes if not t.success][: cfg.max_failures]
            if failures:
                failures_by_group[ANY_TYPE] = failures
                overall = _mean([t.success for t in episodes])
                titles = [skill.title for skill in bank.skills.values()]
                prompts.append(evolve_general_prompt(overall, failures, titles, **limits))
        elif scheme == EVOLVE_PER_TYPE:
            for task_type in weak:
                failures = [t for t in episodes if t.task.task_type == task_type and not t.success]
                failures = failures[: cfg.max_failures]
                if not failures:
                    continue
                failures_by_group[task_type] = failures
                scopes = {skill_category(t.task, self.cfg.retrieval.routing) for t in failures}
                shown = bank.general() + [s for scope in sorted(x for x in scopes if x)
                                          for s in bank.for_type(scope)]
                prompts.append(evolve_prompt(task_type, accuracy[task_type], failures, shown, **limits))
        answers = teacher.ask(prompts, seed * 7 + step) if prompts else []
        added, revised = self.apply_evolution(bank, failures_by_group, answers, step,
                                              revisions=scheme == EVOLVE_PER_TYPE)
        state["bank"] = bank.to_dict()
        state["evolved_at"].append(step)
        state["evolution"].append({"step": step, "accuracy": {k: round(v, 4) for k, v in accuracy.items()},
                                   "triggered": weak, "scheme": scheme, "added": added, "revised": revised,
                                   "bank_version": bank.version})
        self._save(run, state)
        run.log_metrics(step, {"valid_success": _mean([t.success for t in episodes]),
                               "evolved_skills": len(added), "bank_skills": len(bank.skills),
                               **{f"valid_success/{k}": round(v, 4) for k, v in accuracy.items()}})
        sync_store(run.store, bank)
        run.discard_rollouts()  # validation episodes are not trained on
        self._log(run, f"evolve{step}", {"answers": answers})

    def apply_evolution(self, bank: SkillBank, failures_by_group: dict[str, list[Trajectory]],
                        answers: list[str], step: int, *, revisions: bool = True) -> tuple[list[str], list[str]]:
        """Add (``dyn_NNN`` general skills, as the authors) or, with ``revisions``, revise skills
        from the teacher's answers (one per group of failures); every change records the failed
        valid tasks it came from."""
        added, revised = [], []
        bank.begin()
        for failures, answer in zip(failures_by_group.values(), answers):
            sources = [t.task.task_id for t in failures]
            split = failures[0].task.split
            for skill in parse_skills(answer, limit=self.cfg.evolution.max_new_skills):
                if revisions and skill["revises"] and skill["revises"] in bank.skills:
                    bank.revise_skill(skill["revises"], title=skill["title"], principle=skill["principle"],
                                      when_to_apply=skill["when_to_apply"], source_split=split,
                                      source_task_ids=sources, added_at=f"evolve@step{step}")
                    revised.append(skill["revises"])
                    continue
                new = bank.add_skill(title=skill["title"], principle=skill["principle"],
                                     when_to_apply=skill["when_to_apply"], scope=GENERAL, source_split=split,
                                     source_task_ids=sources, added_at=f"evolve@step{step}", dynamic=True)
                if new is not None:
                    added.append(new.skill_id)
        bank.commit()
        return added, revised

    def _log(self, run: Run, stage: str, record: dict[str, Any]) -> None:
        """The teacher's raw answers, for inspection (not read back)."""
        with (run.method_state.folder / TEACHER_LOG).open("a") as handle:
            handle.write(json.dumps({"stage": stage, **record}, sort_keys=True) + "\n")

    # -- every phase -----------------------------------------------------------------------------

    @arena.hookimpl
    def retrieve(self, run: Run, task: Task) -> list[Experience]:
        return self._experiences(run, task, rollout=False)

    def _experiences(self, run: Run, task: Task, *, rollout: bool) -> list[Experience]:
        """The skills of ``task``'s prompt. Evolved skills are left out except in RL rollouts
        when ``evolution.visible_to`` is ``training`` (the authors: only the training envs get
        them; validation and test prompts do not)."""
        cfg = self.cfg.retrieval
        evolved = rollout or self.cfg.evolution.visible_to == VISIBLE_TO_ALL
        if cfg.mode == "embedding":
            found = embedding_retrieve(run.store, task, top_k=cfg.top_k, threshold=cfg.threshold)
            return [e for e in found if evolved or not e.metadata.get("dynamic", False)]
        return template_retrieve(run.store, task, top_general=cfg.top_general,
                                 max_mistakes=cfg.max_mistakes, evolved=evolved,
                                 category=skill_category(task, cfg.routing))

    def _solver(self, run: Run, backend: Any) -> StandardSolver:
        """The standard solver with SkillRL's prompt (every retrieved skill shown)."""
        return StandardSolver.from_config(backend, run.settings.solver, max_experiences=1_000,
                                          prompt_builder=self.prompt_builder,
                                          instructions=run.env.instructions)

    def _policy(self, run: Run, backend: Any, task: Task, experiences: list[Experience],
                seed: int, temperature: float | None = None) -> Policy:
        sampling = run.sampling()
        solver = self._solver(run, backend)
        return solver.policy(task, experiences, seed,
                             temperature=sampling.temperature if temperature is None else temperature,
                             top_p=sampling.top_p)

    @arena.hookimpl
    def solve(self, run: Run, task: Task, experiences: list[Experience], seed: int) -> Trajectory:
        """The standard constrained choice, with the skills shown from ``inject_from_step`` on."""
        policy = self._policy(run, run.llm, task, experiences, seed)
        return run.play(EpisodeRequest(task, experiences, policy=policy))

    #: Exported: the SkillBank (skills and mistakes); its fine-tuned weights stay with the model.
    export = arena.export_stored(SKILL, MISTAKE)

    @arena.hookimpl
    def state_size(self, run: Run) -> dict[str, Any]:
        state = self._state(run)
        bank = self.bank(state)
        teacher = state.get("teacher") or {}
        sizes: dict[str, Any] = {
            **bank.sizes(),
            "teacher_calls": int(teacher.get("calls", 0)),
            "teacher_tokens_in": int(teacher.get("tokens_in", 0)),
            "teacher_tokens_out": int(teacher.get("tokens_out", 0)),
            "teacher_shares_policy_backend": self.cfg.teacher.llm is None,
            "sft_examples": int(state["sft"].get("examples", 0)),
            "rl_steps": int(state["steps_done"]),
            "evolutions": len(state["evolution"]),
            "evolved_skills": sum(len(e["added"]) for e in state["evolution"]),
            "revised_skills": sum(len(e["revised"]) for e in state["evolution"]),
        }
        if self._trainer is not None:
            sizes["trainable_parameters"] = self._trainer.trainable_parameters()
        return sizes

    @arena.hookimpl
    def state_digest(self, run: Run) -> str:
        """The bank as the method keeps it (the store copy is digested by the harness)."""
        bank = self._state(run).get("bank")
        return json.dumps(bank, sort_keys=True) if bank else ""


_REASONING = re.compile(r"<reasoning>(.*?)</reasoning>", re.S)


def sft_completion(action: str, *, target: str, goal: str, reply: str = "") -> str:
    """An SFT example's completion. ``action``: the bare action (what constrained choice
    scores). ``tagged``: reasoning then the action in the react solver's tags, the form the
    prompt asks for (the authors' SFT rows: their teacher's think-tagged reasoning, then the
    action in its tags). The reasoning is the demonstrator's own (a react teacher's ``reply``)
    or, where it wrote none (the expert plan), one sentence naming the task and the step."""
    if target == SFT_TARGET_ACTION:
        return action
    if target != SFT_TARGET_TAGGED:
        raise ValueError(f"method.sft.target must be action or tagged here, not {target!r}")
    found = _REASONING.search(reply)
    reasoning = found.group(1).strip() if found else ""
    if not reasoning:
        reasoning = f"The task is to {goal.strip().rstrip('.')}. The next step toward it: {action}."
    return f"<reasoning>{reasoning}</reasoning>\n<action>{action}</action>"


class DemonstrationPolicy:
    """A demonstration's policy: ``act`` (the teacher's), or with ``act`` None the expert plan
    of the episode the harness gives it (``start``, learning only); every decision is kept as a
    (SkillRL prompt, completion) row for SFT, the completion in the form ``target`` names
    (:func:`sft_completion`)."""

    def __init__(self, act: Policy | None, prompt_of: Callable[[Observation, Trajectory], Any],
                 env_name: str, target: str = SFT_TARGET_ACTION) -> None:
        self._act = act
        self._prompt_of = prompt_of
        self._env_name = env_name
        self._target = target
        self._episode: Episode | None = None
        self.rows: list[dict[str, Any]] = []

    def start(self, episode: Episode) -> None:
        self._episode = episode

    def __call__(self, observation: Observation, trajectory: Trajectory) -> Action:
        if self._act is not None:
            action = self._act(observation, trajectory)
        else:
            plan = self._episode.expert_action() if self._episode is not None else None
            if plan is None:
                raise RuntimeError(f"Environment '{self._env_name}' has no expert; use "
                                   "method.sft.demonstrations=teacher.")
            action = Action(text=plan)
        completion = sft_completion(action.text, target=self._target, goal=trajectory.task.goal,
                                    reply=action.thought)
        self.rows.append(rl.sft.example(self._prompt_of(observation, trajectory), completion))
        return action


def _mean(values: list[Any]) -> float:
    return float(sum(float(v) for v in values) / len(values)) if values else 0.0
