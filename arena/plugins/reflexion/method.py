"""Reflexion: an agent retries a task it failed, with its own reflections on the failures.

The authors' loop (``config.yaml`` names their values): every environment is tried; after a
failed trial the LLM writes a reflection (what went wrong, a plan for next time), and the next
trial of the same task shows the last ``memory_size`` reflections; a solved task is not tried
again; at most ``trials`` trials.

Inside Arena's protocol:

* **learning** runs that loop on ``train_tasks`` train tasks (the authors run it on the test
  games themselves, which Arena's protocol forbids). Every trial is an episode recorded through
  ``run.play`` (a finished one is read back on resume, never replayed); each reflection is
  stored (kind ``reflection``, indexed by its task's goal) under an id naming its task and trial,
  so a resumed round adds none twice; outcomes are in the method's state after each round.
* **frozen evaluation** plays each test task once (the protocol's rule), so no reflection of
  its own exists: the prompt shows the ``test_memory`` reflections of the most similar train
  tasks (of the same task type by default). A named deviation (``docs/fidelity.md``).
* **a second learning phase** (``run.continue_from``, ``arena experiment conflict``) tries every
  train task again and stores its reflections beside the first phase's (trials ``1.0``, ``1.1``).
* **the online track** also reflects on each failed test episode (``extract`` / ``update``), so
  later test tasks can retrieve reflections written on earlier ones: test-time learning,
  labelled ``online`` on every result.
"""

from __future__ import annotations

import random
from typing import Any

import arena
from arena import (
    LEARN,
    STANDARD,
    EndOnRepeat,
    EpisodeRequest,
    Experience,
    Provenance,
    Run,
    SamplingParams,
    StandardSolver,
    Task,
    Termination,
    Trajectory,
    begin_learning_phase,
    episode_seed,
    select_tasks,
    typed_config,
)
from arena.plugins.reflexion.prompts import parse_reflection, reflection_prompt
from arena.plugins.reflexion.settings import ReflexionSettings

REFLECTION = "reflection"


def reflection_id(task: Task, trial: int | str) -> str:
    return f"reflexion:{task.split}:{task.task_id}:{trial}"


def retry_due(outcomes: list[bool], trials: int) -> bool:
    """Whether a task with these trial outcomes is tried again: not once solved, and at most
    ``trials`` trials in all (the authors skip solved environments in later trials)."""
    return not any(outcomes) and len(outcomes) < trials


def reflection_experience(trajectory: Trajectory, text: str, trial: int | str) -> Experience:
    task = trajectory.task
    return Experience(REFLECTION, text, Provenance((task.task_id,), task.split),
                      {"task_id": task.task_id, "task_type": task.task_type, "goal": task.goal,
                       "trial": str(trial)},
                      reflection_id(task, trial))


class Reflexion:
    """Trials with reflections on train; reflections of similar tasks at test."""

    def __init__(self, run: Run) -> None:
        self.cfg: ReflexionSettings = typed_config(run.cfg.method, ReflexionSettings)

    @staticmethod
    def _state(run: Run) -> dict[str, Any]:
        return run.method_state.load({"outcomes": {}})

    @staticmethod
    def _trial_label(phase: int, trial: int) -> int | str:
        """A trial's name in reflection ids: its number, prefixed by the phase after the first."""
        return trial if phase == 0 else f"{phase}.{trial}"

    # -- learning ---------------------------------------------------------------------------

    def train_tasks(self, run: Run) -> list[Task]:
        """``train_tasks`` tasks of the learn split, shuffled by the learn seed, balanced over
        task types (all of them when null)."""
        tasks = list(run.tasks(run.learn_split))
        random.Random(run.learn_seed).shuffle(tasks)
        return select_tasks(tasks, self.cfg.train_tasks)

    @arena.hookimpl
    def learn(self, run: Run) -> bool:
        """Rounds of trials: round ``r`` plays trial ``r`` of every task not yet solved, side by
        side, then reflects on the failures that will be tried again."""
        state = self._state(run)
        phase = begin_learning_phase(run, state, {"outcomes": {}})  # a continued run tries every task again
        outcomes: dict[str, list[bool]] = state["outcomes"]
        tasks = self.train_tasks(run)
        if not run.store_exists():
            run.store.count()  # the store exists (and is digested) even if nothing fails
        seed = run.learn_seed
        with run.progress("reflexion trials", total=self.cfg.trials) as shown:
            for trial in range(self.cfg.trials):
                due = [t for t in tasks if len(outcomes.get(t.task_id, [])) == trial
                       and retry_due(outcomes.get(t.task_id, []), self.cfg.trials)]
                if not due:
                    shown.update(trial + 1)
                    continue
                played, stopped = self._play_round(run, due, trial, seed, phase)
                # As the authors, every failure is reflected on, the last trial's too: those
                # reflections are what similar test tasks are shown.
                failures = [t for t in played if not t.success and t.status is not Termination.ERROR]
                self._reflect(run, failures, trial, seed * 1_000 + trial, phase)
                for trajectory in played:
                    outcomes.setdefault(trajectory.task.task_id, []).append(bool(trajectory.success))
                run.method_state.save(state)
                solved = sum(any(v) for v in outcomes.values())
                run.log_metrics(trial + 1, {"trial_success": sum(t.success for t in played) / len(played)
                                            if played else 0.0,
                                            "tasks_solved": solved / max(1, len(tasks)),
                                            "reflections": run.store.count(kind=REFLECTION)})
                shown.update(trial + 1, note=f"{solved}/{len(tasks)} tasks solved")
                if stopped:
                    break
        return True

    def _memory(self, run: Run, task: Task, trial: int, phase: int) -> list[Experience]:
        """The task's reflections on its trials of this phase before ``trial``, the last
        ``memory_size``."""
        ids = [reflection_id(task, self._trial_label(phase, earlier)) for earlier in range(trial)]
        found = {e.experience_id: e for e in run.store.get(ids)}
        kept = [found[i] for i in ids if i in found]
        return kept[-self.cfg.memory_size:] if self.cfg.memory_size else []

    def _play_round(self, run: Run, due: list[Task], trial: int, seed: int, phase: int
                    ) -> tuple[list[Trajectory], bool]:
        """Trial ``trial`` of each due task with its memory (``arena.play_round``)."""
        return arena.play_round(run, due, seed, f"trial{trial}",
                                lambda task: self._memory(run, task, trial, phase))

    def _reflect(self, run: Run, failures: list[Trajectory], trial: int, seed: int, phase: int) -> list[Experience]:
        """One reflection per failure (one batched generate call), stored unless already there."""
        label = self._trial_label(phase, trial)
        failures = [t for t in failures if not run.store.get([reflection_id(t.task, label)])]
        if not failures:
            return []
        memory = {t.task.task_id: self._memory(run, t.task, trial, phase) for t in failures}
        experiences = self._write(run, failures, label, seed, memory)
        run.store.add(experiences, index_texts=[str(e.metadata["goal"]) for e in experiences])
        return experiences

    def _write(self, run: Run, failures: list[Trajectory], trial: int | str, seed: int,
               memory: dict[str, list[Experience]] | None = None) -> list[Experience]:
        """Reflections on ``failures``, each shown the task's earlier reflections in ``memory``."""
        params = SamplingParams(temperature=self.cfg.reflection_temperature,
                                max_new_tokens=self.cfg.reflection_max_tokens, seed=seed)
        prompts = [reflection_prompt(t, (memory or {}).get(t.task.task_id, []), self.cfg.transcript_chars,
                                     run.env.instructions) for t in failures]
        generations = run.llm.generate(prompts, params)
        return [reflection_experience(t, parse_reflection(g.text) or "(the model wrote nothing)", trial)
                for t, g in zip(failures, generations)]

    # -- the online track: reflect on a failed test episode ------------------------------------

    @arena.hookimpl
    def extract(self, run: Run, trajectories: list[Trajectory]) -> list[Experience]:
        """A reflection on each failed episode (called by the harness on the online track)."""
        failures = [t for t in trajectories if not t.success and t.status is not Termination.ERROR and t.steps]
        if not failures or run.phase == LEARN:
            return []
        seed = episode_seed(run.learn_seed, failures[0].task.task_id, "reflexion")
        return self._write(run, failures, "online", seed)

    @arena.hookimpl
    def update(self, run: Run, trajectories: list[Trajectory], experiences: list[Experience]) -> None:
        new = [e for e in experiences if e.kind == REFLECTION and not run.store.get([e.experience_id])]
        if new:  # indexed by the task's goal: a later task finds the reflections of similar tasks
            run.store.add(new, index_texts=[str(e.metadata["goal"]) for e in new])

    # -- every phase ------------------------------------------------------------------------

    @arena.hookimpl
    def solve(self, run: Run, task: Task, experiences: list[Experience], seed: int) -> Trajectory:
        """The standard solver; with ``end_on_repeated_action`` a repeated action ends the trial."""
        if not self.cfg.end_on_repeated_action:
            return run.play(EpisodeRequest(task, experiences, seed, policy=STANDARD))
        sampling = run.sampling()
        solver = StandardSolver.from_config(run.llm, run.settings.solver, instructions=run.env.instructions)
        policy = solver.policy(task, experiences, seed, temperature=sampling.temperature, top_p=sampling.top_p)
        return run.play(EpisodeRequest(task, experiences, policy=EndOnRepeat(policy)))

    @arena.hookimpl
    def retrieve(self, run: Run, task: Task) -> list[Experience]:
        """The task's own last reflections if it has any (none at test under the protocol),
        else those of the ``test_memory`` most similar tasks (same task type by default)."""
        if not run.store_exists():
            return []
        own = [e for e in run.store.all(kind=REFLECTION, where={"task_id": task.task_id})
               if e.provenance.source_split == task.split]
        if own:
            return own[-self.cfg.memory_size:] if self.cfg.memory_size else []
        if self.cfg.test_memory == 0:
            return []
        found = run.store.query(task.goal, k=self.cfg.test_memory, kind=REFLECTION,
                                task_type=task.task_type if self.cfg.test_same_task_type else None)
        return [experience for experience, _ in found]

    #: Exported: the reflections learned on train.
    export = arena.export_stored(REFLECTION)

    @arena.hookimpl
    def state_size(self, run: Run) -> dict[str, Any]:
        outcomes = self._state(run)["outcomes"]
        return {
            "reflections": run.store.count(kind=REFLECTION) if run.store_exists() else 0,
            "train_tasks_tried": len(outcomes),
            "train_tasks_solved": sum(1 for v in outcomes.values() if any(v)),
            "trials": sum(len(v) for v in outcomes.values()),
        }
