"""Evolving-RL: one model, two roles (skill extractor and skill-using solver), one gradient.

One learning iteration (``methods.md`` section 1, authors' defaults in ``config.yaml``):

1. ``n_sources`` source tasks from train are solved without a skill (not trained on);
2. the extractor writes ``n_skills`` candidate skill cards per source;
3. ``k_downstream`` train tasks most similar to each source (embedding cosine, source included)
   are solved by the solver under every valid card;
4. rewards: extractor = mean downstream success (0 for a card that does not parse or fails the
   audit); solver = ``solver_win_reward`` x won;
5. GRPO: extractor groups = the cards of one source; solver groups = one downstream task under
   the cards of its source; advantages scaled by ``lambda`` per role; one trainer step.

Evaluation (inside the frozen protocol): for each test task the most similar train task is
solved, one card is extracted from it, and the test task is solved with the card (the primary
result) and without it (variant ``without_skill``), so both are reported, paired.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import arena
from arena import (
    EVALUATE,
    STANDARD,
    EpisodeRequest,
    Experience,
    Provenance,
    Run,
    SamplingParams,
    Task,
    Trajectory,
    rl,
    typed_config,
    write_json_atomic,
)
from arena.plugins.evolving_rl.prompts import extractor_prompt
from arena.plugins.evolving_rl.settings import (
    EvolvingRLSettings,
)
from arena.plugins.evolving_rl.skills import SkillCard, SkillParseError, parse_skill

EXTRACTOR = "extractor"
SOLVER = "solver"


@dataclass
class Candidate:
    """One extracted skill: the extractor's tokens, the parsed card (None if invalid)."""

    source_index: int
    skill_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    card: SkillCard | None
    reward: float = 0.0
    text: str = ""

    @property
    def usable(self) -> bool:
        return self.card is not None and self.card.passed_audit

    @property
    def blank(self) -> bool:
        """Nothing to show: no card and an empty reply. The authors then play the task without
        a skill (``run_episode`` with an empty skill; at test time a copy of the no-skill run)."""
        return self.card is None and not self.text.strip()


#: Said before every card the solver is shown (``method.skill_applicability``; the authors' with-
#: skill prompt asks the same, in its words).
APPLICABILITY = ("A skill from an earlier, similar task, for reference. In your reasoning, judge "
                 "whether it applies to this task before you follow it.\n")


def candidate_experience(candidate: Candidate, source: Task, applicability: bool = False) -> Experience:
    """What the solver is shown for a candidate: its rendered card (one that failed the audit
    too: it earns the extractor nothing, but the solver sees it as written), or, for a reply that
    did not parse, the extractor's raw text (the authors play every card, so the solver also
    meets bad skills and learns to resist them); with ``applicability``, after the instruction to
    judge whether it applies."""
    card = candidate.card
    return Experience(
        kind="skill",
        text=(APPLICABILITY if applicability else "") + (candidate.text.strip() if card is None else card.render()),
        provenance=Provenance((source.task_id,), source.split),
        metadata={"name": None if card is None else card.name, "task_type": source.task_type,
                  **({} if candidate.usable else {"unusable": True})},
    )


def most_similar(run: Run, queries: list[Task], pool: list[Task], k: int) -> list[list[Task]]:
    """For each query, the ``k`` pool tasks whose goals are most similar (the query included)."""
    matrix = run.embedder.similarity([q.goal for q in queries], [t.goal for t in pool])
    ranked = []
    for row in matrix:
        order = sorted(range(len(pool)), key=lambda i: (-float(row[i]), i))
        ranked.append([pool[i] for i in order[:k]])
    return ranked


def solver_samples(trajectory: Trajectory, group: str, reward: float, advantage: float,
                   how: str = "decision") -> list[rl.Sample]:
    """The solver samples of one episode, all with the episode's advantage: one per model
    decision (``decision``), or the whole episode as one sequence (``episode``, as slime trains
    the authors' multi-turn rollouts; needs ``solver.layout: transcript``). An episode whose
    prompts do not extend each other (the window layout, or a transcript cut to fit
    ``llm.max_context``) is split into one sample per decision: :func:`split_episodes` counts
    those, and the method reports the count (metrics ``solver_episodes_split``)."""
    if how == "episode":
        whole = rl.episode_sample(trajectory, role=SOLVER, group=group, reward=reward,
                                  advantage=advantage)
        if whole is not None:
            return [whole]
    return rl.decision_samples(trajectory, role=SOLVER, group=group, reward=reward, advantage=advantage)


def split_episodes(episodes: list[Trajectory], how: str) -> int:
    """How many of ``episodes`` ``solver_samples(..., how)`` trains as one sample per decision
    although ``how`` is ``episode``: their prompts do not extend each other (a cut transcript)."""
    if how != "episode":
        return 0
    return sum(1 for t in episodes
               if any(step.rollout is not None and step.rollout.token_ids for step in t.steps)
               and rl.episode_sample(t, role=SOLVER, group="", reward=0.0, advantage=0.0) is None)


def solver_reward(trajectory: Trajectory, cfg: EvolvingRLSettings) -> float:
    """``solver_win_reward`` x won, plus ``solver_progress_reward`` x the episode's progress
    (the fraction of its subgoals the environment counts as met; 1 for a win)."""
    return (cfg.solver_win_reward * trajectory.success
            + cfg.solver_progress_reward * trajectory.progress)


def build_samples(candidates: list[Candidate], owners: list[tuple[Candidate, int]],
                  episodes: list[Trajectory], cfg: EvolvingRLSettings) -> list[rl.Sample]:
    """Rewards, GRPO groups and scaled advantages of one co-evolution iteration.

    ``owners[i]`` is the (card, downstream index) that ``episodes[i]`` was played with.
    Extractor: reward = mean downstream success of the card (0 if unusable), grouped by source.
    Solver: reward = :func:`solver_reward`, grouped by (source, downstream task), so a
    group is one task under the different cards of its source.
    """
    wins: dict[int, list[float]] = {}
    for (candidate, _), trajectory in zip(owners, episodes):
        wins.setdefault(id(candidate), []).append(1.0 if trajectory.success else 0.0)
    for candidate in candidates:
        won = wins.get(id(candidate), [])
        candidate.reward = sum(won) / len(won) if candidate.usable and won else 0.0
    samples: list[rl.Sample] = []
    if cfg.train_extractor:
        groups = [f"source{c.source_index}" for c in candidates]
        advantages = rl.group_advantages([c.reward for c in candidates], groups,
                                         std=cfg.advantage_std, single=cfg.group_of_one)
        for candidate, group, advantage in zip(candidates, groups, advantages):
            if not candidate.token_ids:
                continue
            sample = rl.sample_from_choice(candidate.prompt_token_ids, candidate.token_ids,
                                           candidate.logprobs, role=EXTRACTOR, group=group,
                                           reward=candidate.reward)
            sample.advantage = advantage * cfg.lambda_extractor
            samples.append(sample)
    if cfg.train_solver and episodes:
        rewards = [solver_reward(t, cfg) for t in episodes]
        groups = [f"source{c.source_index}/down{k}" for c, k in owners]
        for trajectory, group, reward, advantage in zip(
                episodes, groups, rewards,
                rl.group_advantages(rewards, groups, std=cfg.advantage_std, single=cfg.group_of_one)):
            samples.extend(solver_samples(trajectory, group, reward,
                                          advantage * cfg.lambda_solver,
                                          cfg.solver_samples))
    return samples


def grpo_samples(episodes: list[Trajectory], groups: list[str], cfg: EvolvingRLSettings) -> list[rl.Sample]:
    """The GRPO baseline's samples: each episode's :func:`solver_reward`, normalised within its
    group (one task's ``group_size`` rollouts) and scaled by ``lambda_solver``."""
    rewards = [solver_reward(t, cfg) for t in episodes]
    samples: list[rl.Sample] = []
    for trajectory, group, reward, advantage in zip(
            episodes, groups, rewards,
            rl.group_advantages(rewards, groups, std=cfg.advantage_std, single=cfg.group_of_one)):
        samples.extend(solver_samples(trajectory, group, reward, advantage * cfg.lambda_solver,
                                      cfg.solver_samples))
    return samples


class EvolvingRL:
    """The Evolving-RL method (``mode: coevolve``) and its GRPO baseline (``mode: grpo``)."""

    def __init__(self, run: Run) -> None:
        self.cfg: EvolvingRLSettings = typed_config(run.cfg.method, EvolvingRLSettings)
        self.folder = run.method_state.folder
        run.keep_rollouts()  # a kill mid-iteration must not lose the rollouts played
        if self.cfg.mode == "coevolve" or self.cfg.eval_with_skill:
            # Built now: an embedder without its weights (the paper preset's 4B) stops the run
            # before anything is played, with its fix, not after the first source episodes.
            _ = run.embedder
        self._trainer: rl.CheckpointedTrainer | None = None
        self.held_out = arena.HeldOutCurve(self.cfg.valid_tasks, self.cfg.valid_every)
        self.iterations_done = 0
        #: The iteration this learning phase ends at (one more phase on a continued run).
        self.last_iteration = self.cfg.iterations
        # A resumed run: serve the learned weights before anything is played or digested.
        self.iterations_done = arena.resume_training(
            run, lambda: self.trainer(run), self._state(run), "iterations_done", "iterations",
            recovered=lambda done: self._candidates_file(done - 1).unlink(missing_ok=True))
        if run.learning_finished():
            self.trainer(run).serve()  # the very state the pre-evaluation digest covers

    @staticmethod
    def _state(run: Run) -> dict[str, Any]:
        return run.method_state.load({"iterations_done": 0, "attempts": {}})

    def trainer(self, run: Run) -> rl.CheckpointedTrainer:
        """The checkpointed trainer on the served model (built on first use)."""
        if self._trainer is None:
            self._trainer = run.trainer(dict(self.cfg.trainer), " (Evolving-RL trains the served model)")
        return self._trainer

    # -- learning -----------------------------------------------------------------------------

    @arena.hookimpl
    def learn(self, run: Run) -> bool:
        trainer = self.trainer(run)
        state = self._state(run)
        state["iterations_done"] = self.iterations_done
        # A continued run (run.continue_from) trains cfg.iterations more from the copied weights.
        arena.begin_learning_phase(run, state, {"phase_start": self.iterations_done})
        phase_start = int(state.get("phase_start", 0))
        self.last_iteration = phase_start + self.cfg.iterations
        train = run.tasks("train")
        iterations = run.progress("evolving_rl iterations", total=self.cfg.iterations)
        iterations.update(self.iterations_done - phase_start)
        ledger = rl.StepLedger(run, state)
        ledger.charge_owed()
        with iterations:
            self._iterate(run, trainer, state, train, iterations, ledger)
        trainer.serve()
        return True

    def _iterate(self, run: Run, trainer: rl.CheckpointedTrainer, state: dict[str, Any],
                 train: list[Task], iterations: Any, ledger: rl.StepLedger) -> None:
        self.held_out.before(run, state, self.iterations_done, self.last_iteration)
        for iteration in range(self.iterations_done, self.last_iteration):
            if run.budget_exhausted():
                break
            attempt = int(state["attempts"].get(str(iteration), 0))
            state["attempts"][str(iteration)] = attempt + 1
            run.method_state.save(state)
            # The same tags on every attempt: a resumed iteration gets back the episodes (and
            # their rollout tokens) an interrupted attempt finished, instead of replaying them.
            tag = f"it{iteration}"
            rng = random.Random(run.learn_seed * 100_003 + iteration)
            if self.cfg.mode == "grpo":
                samples, metrics = self._grpo_iteration(run, train, rng, tag)
            else:
                samples, metrics = self._coevolution_iteration(run, train, rng, tag)
            # One sample per episode asked for, one per decision trained: counted, never silent.
            state["episodes_split"] = (int(state.get("episodes_split", 0))
                                       + int(metrics.get("solver_episodes_split", 0)))
            if self.cfg.drop_zero_advantage:
                informative = rl.with_signal(samples)
                metrics["samples_dropped"] = len(samples) - len(informative)
                samples = informative
            if samples:
                metrics.update(trainer.update(samples, mini_batch_size=self.cfg.mini_batch_size,
                                              rng=rng, progress=run.progress, label=tag))
            # Charged once the checkpoint and the state that counts it are saved; the iteration's
            # cards are dropped once its update is checkpointed.
            cards = self._candidates_file(iteration)
            arena.checkpoint_update(run, trainer, ledger, state, "iterations_done", iteration + 1, metrics,
                                    checkpointed=functools.partial(cards.unlink, missing_ok=True))
            self.iterations_done = iteration + 1
            # After the charge: a budget that runs out in these episodes ends learning here.
            self.held_out.after(run, iteration + 1, self.last_iteration, metrics)
            run.log_metrics(iteration + 1, metrics)  # step: iterations done
            iterations.update(iteration + 1, note=_progress_note(metrics))

    def _candidates_file(self, iteration: int | str) -> Path:
        tag = iteration if isinstance(iteration, str) else f"it{iteration}"
        return self.folder / f"{tag}-candidates.json"

    def _save_candidates(self, tag: str, candidates: list[Candidate]) -> None:
        """Keep an iteration's extracted cards until its update is checkpointed: a resumed
        attempt must train on the cards its finished downstream episodes were played with."""
        rows = [{"source_index": c.source_index, "skill_index": c.skill_index,
                 "prompt_token_ids": c.prompt_token_ids, "token_ids": c.token_ids,
                 "logprobs": c.logprobs, "text": c.text} for c in candidates]
        write_json_atomic(self._candidates_file(tag), rows)

    def _load_candidates(self, tag: str) -> list[Candidate] | None:
        path = self._candidates_file(tag)
        if not path.exists():
            return None
        return [Candidate(row["source_index"], row["skill_index"], row["prompt_token_ids"],
                          row["token_ids"], row["logprobs"], _parse_or_none(row["text"]),
                          text=row["text"])
                for row in json.loads(path.read_text())]

    def _sampling(self, run: Run, max_new_tokens: int, seed: int) -> SamplingParams:
        sampling = run.settings.learn.sampling
        return SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                              max_new_tokens=max_new_tokens, seed=seed)

    def extract(self, run: Run, sources: list[Trajectory], n: int, seed: int,
                params: SamplingParams | None = None) -> list[Candidate]:
        """``n`` candidate cards per source trajectory (one batched generate call)."""
        prefix = self.cfg.extractor_reply_prefix or ""
        prompts = [extractor_prompt(t, run.env.instructions, max_steps_shown=self.cfg.extractor_steps_shown,
                                    reply_prefix=prefix) for t in sources for _ in range(n)]
        params = params or self._sampling(run, self.cfg.extractor_max_tokens, seed)
        generations = run.llm.generate(prompts, params)
        candidates = []
        for index, generation in enumerate(generations):
            text = prefix + generation.text  # the prefix is prompt, not trained on
            candidates.append(Candidate(index // n, index % n, generation.prompt_token_ids,
                                        generation.token_ids, generation.logprobs,
                                        _parse_or_none(text), text=text))
        return candidates

    def _coevolution_iteration(self, run: Run, train: list[Task], rng: random.Random,
                               tag: str) -> tuple[list[rl.Sample], dict[str, Any]]:
        cfg = self.cfg
        seed = run.learn_seed
        clock = time.perf_counter()
        sources = rng.sample(train, min(cfg.n_sources, len(train)))
        with run.progress(f"{tag}: source episodes", total=len(sources)) as shown:
            source_runs = run.play(
                [EpisodeRequest(task, [], seed, f"{tag}/source{i}", policy=STANDARD)
                 for i, task in enumerate(sources)],
                on_done=shown.advance,
            )
        source_s, clock = time.perf_counter() - clock, time.perf_counter()
        extract_seed = rng.randrange(2**31)
        candidates = self._load_candidates(tag)
        if candidates is None:
            cards = len(source_runs) * cfg.n_skills
            with run.progress(f"{tag}: skill extraction ({cards} cards, one batch)", total=cards) as shown:
                candidates = self.extract(run, source_runs, cfg.n_skills, seed=extract_seed)
                shown.update(cards, note=f"{sum(c.usable for c in candidates)} usable")
            self._save_candidates(tag, candidates)
        extract_s, clock = time.perf_counter() - clock, time.perf_counter()
        downstream = most_similar(run, sources, train, cfg.k_downstream)
        requests, owners = [], []
        play_unusable = cfg.unusable_cards == "raw_text"
        for candidate in candidates:
            if not candidate.usable and not play_unusable:
                continue
            experiences = ([] if candidate.blank else
                           [candidate_experience(candidate, sources[candidate.source_index], cfg.skill_applicability)])
            for k, task in enumerate(downstream[candidate.source_index]):
                requests.append(EpisodeRequest(
                    task, experiences, seed,
                    f"{tag}/source{candidate.source_index}/skill{candidate.skill_index}/down{k}",
                    policy=STANDARD))
                owners.append((candidate, k))
        with run.progress(f"{tag}: downstream episodes", total=len(requests)) as shown:
            episodes = run.play(requests, on_done=shown.advance)
        downstream_s = time.perf_counter() - clock

        samples = build_samples(candidates, owners, episodes, cfg)
        metrics = {
            "time/source_s": source_s,
            "time/extract_s": extract_s,
            "time/downstream_s": downstream_s,
            "source_success": _mean([t.success for t in source_runs]),
            "skills_usable": _mean([c.usable for c in candidates]),
            "downstream_success": _mean([t.success for t in episodes]),
            "extractor_reward": _mean([c.reward for c in candidates]),
            "samples": len(samples),
        }
        if cfg.train_solver:
            metrics["solver_episodes_split"] = split_episodes(episodes, cfg.solver_samples)
        return samples, metrics

    def _grpo_iteration(self, run: Run, train: list[Task], rng: random.Random,
                        tag: str) -> tuple[list[rl.Sample], dict[str, Any]]:
        """Solver-only GRPO, no skills: each task played ``group_size`` times is one group."""
        cfg = self.cfg
        seed = run.learn_seed
        tasks = rng.sample(train, min(cfg.n_sources, len(train)))
        requests = [EpisodeRequest(task, [], seed, f"{tag}/task{i}/rollout{g}", policy=STANDARD)
                    for i, task in enumerate(tasks) for g in range(cfg.group_size)]
        with run.progress(f"{tag}: rollouts", total=len(requests)) as shown:
            episodes = run.play(requests, on_done=shown.advance)
        samples = grpo_samples(episodes, [r.variant.rsplit("/", 1)[0] for r in requests], cfg)
        return samples, {"success": _mean([t.success for t in episodes]), "samples": len(samples),
                         "solver_episodes_split": split_episodes(episodes, cfg.solver_samples)}

    # -- evaluation ---------------------------------------------------------------------------

    @arena.hookimpl
    def evaluation_variants(self, run: Run) -> list[str]:
        """The without-skill episode :meth:`solve` plays beside each result, declared before play
        (the GRPO baseline's too with ``eval_with_skill``: the authors evaluate their GRPO model
        with and without a skill its own extractor wrote)."""
        return ["without_skill"] if self.cfg.eval_with_skill else []

    @arena.hookimpl
    def solve(self, run: Run, task: Task, experiences: list[Experience],
              seed: int) -> Trajectory | None:
        """Paired evaluation with a skill extracted from the most similar train task."""
        if run.phase != EVALUATE or not self.cfg.eval_with_skill:
            return None  # the harness's standard solver
        # The task whose experience to bring: ``task``, except under `arena experiment relevance`
        # (another type's test task, or none: then the harness's standard solver, no card).
        target = run.experience_task(task)
        if target is None:
            return None
        run_seed = run.current_seed()
        # The train tasks the protocol opens at test time (eval.source_pool: the train split, or
        # train tasks of every type as the authors' pool).
        (source_task,) = most_similar(run, [target], run.source_pool(), 1)[0]
        # The source episode is played as in learning (learn.max_steps), so the extractor reads
        # the kind of trajectory it was trained on.
        source = run.play(EpisodeRequest(source_task, [], run_seed, f"eval_source/{task.task_id}", policy=STANDARD,
                                         max_steps=self.cfg.eval_source_max_steps or run.settings.learn.max_steps))
        params = SamplingParams(temperature=0.0, seed=seed,
                                max_new_tokens=self.cfg.eval_extractor_max_tokens or self.cfg.extractor_max_tokens)
        (candidate,) = self.extract(run, [source], 1, seed=seed, params=params)
        without = run.play(EpisodeRequest(task, [], run_seed, "without_skill", policy=STANDARD))
        play_unusable = self.cfg.unusable_cards == "raw_text"
        if candidate.usable or (play_unusable and not candidate.blank):
            # As in learning: the card, or an unusable one as its raw text (the authors').
            return run.play(EpisodeRequest(
                task, [candidate_experience(candidate, source_task, self.cfg.skill_applicability)],
                policy=STANDARD))
        if run.sampling().temperature == 0.0:
            # No card to show: the primary episode would see exactly the without-skill prompts,
            # and greedy decoding would replay the same episode. Record a copy, not a replay.
            return dataclasses.replace(without, copy_of="without_skill", llm_calls=0,
                                       tokens_in=0, tokens_out=0, wall_s=0.0)
        return run.play(EpisodeRequest(task, [], policy=STANDARD))

    @arena.hookimpl
    def state_size(self, run: Run) -> dict[str, Any]:
        if self._trainer is None:
            return {}
        return {"trainable_parameters": self._trainer.trainable_parameters()}


def _parse_or_none(text: str) -> SkillCard | None:
    try:
        return parse_skill(text)
    except SkillParseError:
        return None


def _mean(values: list[Any]) -> float:
    return float(sum(float(v) for v in values) / len(values)) if values else 0.0


def _progress_note(metrics: dict[str, Any]) -> str:
    """The figures of an iteration worth a glance while it runs."""
    shown = {"source_success": "source", "downstream_success": "downstream", "success": "success",
             "skills_usable": "usable cards"}
    note = ", ".join(f"{label} {metrics[key]:.0%}" for key, label in shown.items() if key in metrics)
    split = int(metrics.get("solver_episodes_split", 0))
    if split:
        note += f", {split} episodes split into decisions (cut to fit llm.max_context)"
    return note
