"""GiGPO: group-in-group policy optimisation for multi-turn agents (Feng et al., 2025).

One learning iteration (``methods.md``-style defaults and the authors' values in ``config.yaml``):

1. ``tasks_per_iteration`` train tasks are each played ``group_size`` times by the standard
   solver at the learning temperature (an episode group per task);
2. each episode's reward is ``win_reward`` x won (+ ``progress_reward`` x progress), given at its
   last step; a step whose reply was malformed has ``invalid_action_penalty`` taken off its own
   row at both levels (after discounting, as the authors);
3. advantages (``arena.rl.step_advantages``): the episode-level one, the reward normalised within
   its episode group (GRPO's), plus ``step_weight`` x the step-level one, each decision's
   discounted return (``gamma``) normalised among the decisions of the same episode group taken
   in the same anchor state (the observation the decision saw);
4. one sample per decision (the window layout's prompt, as verl-agent's history window), with
   its own advantage; a clipped policy-gradient update through the harness's trainer.

With ``method.advantage.estimator: grpo`` the same loop is plain GRPO with one advantage per
episode: the ablation that isolates the step-level term. Evaluation is the standard solver on
the learned weights (no experience at test time).
"""

from __future__ import annotations

import random
import time
from typing import Any

import arena
from arena import STANDARD, EpisodeRequest, Run, Task, Termination, Trajectory, rl, typed_config
from arena.plugins.gigpo.settings import GiGPOSettings

SOLVER = "solver"


def episode_reward(trajectory: Trajectory, cfg: GiGPOSettings) -> float:
    """``win_reward`` x won + ``progress_reward`` x the fraction of subgoals met."""
    return cfg.win_reward * trajectory.success + cfg.progress_reward * trajectory.progress


def step_rewards(trajectory: Trajectory, reward: float) -> list[float]:
    """The episode's reward on its last step (the environment's: 10 on the winning step)."""
    return rl.terminal_rewards(trajectory, reward)


def step_penalties(trajectory: Trajectory, cfg: GiGPOSettings) -> list[float]:
    """``invalid_action_penalty`` on every step whose reply was not in the asked form, 0 on the
    others. The authors take it off that step's row after the returns are discounted: off the
    row's episode score and off its step return, never carried back to earlier steps
    (``apply_invalid_action_penalty`` runs after ``compute_step_discounted_returns``)."""
    return [0.0 if step.well_formed else cfg.invalid_action_penalty for step in trajectory.steps]


def signals(episodes: list[Trajectory], groups: list[str], cfg: GiGPOSettings) -> list[rl.EpisodeSignal]:
    """What the estimator needs of each episode: group, reward, per-step rewards, anchor states
    and the per-step penalties."""
    result = []
    for trajectory, group in zip(episodes, groups):
        reward = episode_reward(trajectory, cfg)
        result.append(rl.EpisodeSignal(group, reward, step_rewards(trajectory, reward),
                                       rl.step_anchors(trajectory), step_penalties(trajectory, cfg)))
    return result


def build_samples(episodes: list[Trajectory], groups: list[str], cfg: GiGPOSettings
                  ) -> tuple[list[rl.Sample], dict[str, float]]:
    """Per-decision samples with their advantages, and the figures of the step groups. An
    episode the harness ended in an error, or one without a decision, is left out of its group:
    it says nothing about the policy."""
    kept = [(t, g) for t, g in zip(episodes, groups) if t.status is not Termination.ERROR and t.steps]
    episodes, groups = [t for t, _ in kept], [g for _, g in kept]
    episode_signals = signals(episodes, groups, cfg)
    advantages = rl.step_advantages(episode_signals, cfg.estimator)
    samples: list[rl.Sample] = []
    for trajectory, signal, per_step in zip(episodes, episode_signals, advantages):
        samples.extend(rl.decision_samples(trajectory, role=SOLVER, group=str(signal.group),
                                           reward=signal.reward, advantage=per_step))
    step_groups: dict[tuple[str, str], int] = {}
    for signal in episode_signals:
        for anchor in signal.anchors:
            key = (str(signal.group), str(anchor))
            step_groups[key] = step_groups.get(key, 0) + 1
    decisions = sum(step_groups.values())
    shared = sum(size for size in step_groups.values() if size > 1)
    return samples, {
        "step_groups": float(len(step_groups)),
        # The share of decisions whose state another decision of the group also met: only those
        # get a step-level signal (verl-agent reports the step-group size distribution).
        "decisions_in_shared_states": shared / decisions if decisions else 0.0,
    }


class GiGPO:
    """The GiGPO method: solver-only RL with episode- and step-level group advantages."""

    def __init__(self, run: Run) -> None:
        self.cfg: GiGPOSettings = typed_config(run.cfg.method, GiGPOSettings)
        run.keep_rollouts()  # a kill mid-iteration must not lose the rollouts played
        self._trainer: rl.CheckpointedTrainer | None = None
        self.held_out = arena.HeldOutCurve(self.cfg.valid_tasks, self.cfg.valid_every)
        self.iterations_done = 0
        #: The iteration this learning phase ends at (one more phase on a continued run).
        self.last_iteration = self.cfg.iterations
        # A resumed run serves its learned weights before anything is played or digested.
        self.iterations_done = arena.resume_training(
            run, lambda: self.trainer(run), self._state(run), "iterations_done", "iterations")
        if run.learning_finished():
            self.trainer(run).serve()

    @staticmethod
    def _state(run: Run) -> dict[str, Any]:
        return run.method_state.load({"iterations_done": 0, "gradient_steps": 0})

    def trainer(self, run: Run) -> rl.CheckpointedTrainer:
        if self._trainer is None:
            self._trainer = run.trainer(dict(self.cfg.trainer), " (GiGPO trains the served model)")
        return self._trainer

    @arena.hookimpl
    def learn(self, run: Run) -> bool:
        trainer = self.trainer(run)
        state = self._state(run)
        train = run.tasks(run.learn_split)
        ledger = rl.StepLedger(run, state)
        ledger.charge_owed()
        # A continued run (run.continue_from) trains cfg.iterations more from the copied weights.
        arena.begin_learning_phase(run, state, {"phase_start": self.iterations_done})
        phase_start = int(state.get("phase_start", 0))
        self.last_iteration = phase_start + self.cfg.iterations
        with run.progress("gigpo iterations", total=self.cfg.iterations) as shown:
            shown.update(self.iterations_done - phase_start)
            self.held_out.before(run, state, self.iterations_done, self.last_iteration)
            for iteration in range(self.iterations_done, self.last_iteration):
                if run.budget_exhausted():
                    break
                metrics = self._iteration(run, trainer, train, iteration)
                # Charged once the checkpoint and the state that counts it are saved.
                arena.checkpoint_update(run, trainer, ledger, state, "iterations_done", iteration + 1, metrics)
                self.iterations_done = iteration + 1
                # After the charge: a budget that runs out in these episodes ends learning here.
                self.held_out.after(run, iteration + 1, self.last_iteration, metrics)
                run.log_metrics(iteration + 1, metrics)  # step: iterations done
                shown.update(iteration + 1, note=f"train success {metrics['success']:.0%}")
        trainer.serve()
        return True

    def _iteration(self, run: Run, trainer: rl.CheckpointedTrainer, train: list[Task],
                   iteration: int) -> dict[str, Any]:
        """Rollouts of one iteration, their advantages, one update. The same variants on every
        attempt: a resumed iteration reads back the episodes an interrupted one finished."""
        cfg = self.cfg
        rng = random.Random(run.learn_seed * 100_003 + iteration)
        tag = f"it{iteration}"
        tasks = rng.sample(train, min(cfg.tasks_per_iteration, len(train)))
        requests = [EpisodeRequest(task, [], run.learn_seed, f"{tag}/task{i}/rollout{g}", policy=STANDARD)
                    for i, task in enumerate(tasks) for g in range(cfg.group_size)]
        clock = time.perf_counter()
        with run.progress(f"{tag}: rollouts", total=len(requests)) as shown:
            episodes = run.play(requests, on_done=shown.advance)
        rollout_s = time.perf_counter() - clock
        groups = [request.variant.rsplit("/", 1)[0] for request in requests]
        samples, metrics = build_samples(episodes, groups, cfg)
        metrics.update({
            "success": sum(t.success for t in episodes) / len(episodes),
            "reward": sum(episode_reward(t, cfg) for t in episodes) / len(episodes),
            "samples": float(len(samples)),
            "time/rollout_s": rollout_s,
        })
        if cfg.drop_zero_advantage:
            informative = rl.with_signal(samples)
            metrics["samples_dropped"] = float(len(samples) - len(informative))
            samples = informative
        if samples:
            metrics.update(trainer.update(samples, mini_batch_size=cfg.mini_batch_size, rng=rng,
                                          progress=run.progress, label=tag))
        return metrics

    @arena.hookimpl
    def state_size(self, run: Run) -> dict[str, Any]:
        if self._trainer is None:
            return {}
        return {"trainable_parameters": self._trainer.trainable_parameters()}
