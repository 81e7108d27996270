"""ExpeL: experience gathering with Reflexion, insight extraction, and insights + few-shots at test.

The authors' algorithm (``methods.md`` section 4), inside Arena's protocol:

1. **gather** on train tasks: each task is tried, and a failed trial gets an LLM-written
   reflection that the next trial's prompt shows, up to ``max_reflections`` times
   (so at most ``1 + max_reflections`` trials). Every trial is stored (kind ``trajectory``).
2. **extract**: for every task with a success, each success is compared with each failure of the
   same task; then the successes are critiqued in chunks of ``success_chunk``. Each critique
   answers with ADD/EDIT/AGREE/REMOVE operations that update the weighted insight list
   (:mod:`arena.plugins.expel.insights`); the list lives in the store (kind ``insight``).
3. **evaluate** (frozen): one trial, no reflection; the prompt holds the insights and the
   ``fewshots`` most similar successful train trajectories of the same task type (never the task
   itself), found through the store by task similarity.

Resume: every trial is an episode recorded through ``run.play`` (a finished one is read
back, never replayed); reflections sit in the stored trajectories; the insight list and the
number of finished critiques are written to the method's state in one atomic write after each
critique, and the store's insights are re-synced from it, so no critique is applied twice.

A second learning phase (``run.continue_from``, ``arena experiment conflict``) gathers and
critiques again, starting from the insight list the first phase left; its trials are stored
beside the first phase's (marked with their phase), and both serve as few-shots at test.

Stored trajectories carry the task's goal as their text (what the authors embed to retrieve
few-shots by task similarity) and the transcript in their metadata.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import arena
from arena import (
    EndOnRepeat,
    EpisodeRequest,
    Experience,
    Instructions,
    Policy,
    Provenance,
    Run,
    SamplingParams,
    StandardSolver,
    Task,
    Trajectory,
    begin_learning_phase,
    select_tasks,
    typed_config,
)
from arena.plugins.expel.insights import InsightBook, UpdateReport, parse_operations
from arena.plugins.expel.prompts import (
    compare_prompt,
    parse_reflection,
    reflection_prompt,
    solver_prompt,
    success_prompt,
)
from arena.plugins.expel.settings import ExpeLSettings

TRAJECTORY = "trajectory"
INSIGHT = "insight"
REFLECTION = "reflection"
GATHER, EXTRACT, DONE = "gather", "extract", "done"
CRITIQUE_LOG = "critiques.jsonl"  # in the method's folder


# -- pure helpers (tested on their own) ------------------------------------------------------


def trials_needed(outcomes: list[bool], max_reflections: int) -> bool:
    """Whether a task whose trials so far ended with ``outcomes`` gets another trial: not after a
    success, and at most ``1 + max_reflections`` trials in all."""
    return not any(outcomes) and len(outcomes) < 1 + max_reflections


def trajectory_id(task_id: str, trial: int, phase: int = 0) -> str:
    return f"expel-trajectory:{task_id}:trial{trial}" + (f":phase{phase}" if phase else "")


def trajectory_experience(trajectory: Trajectory, trial: int, reflections_shown: list[str],
                          reflection: str, instructions: Instructions, phase: int = 0) -> Experience:
    """One gathered trial as stored: the goal is the retrieval key, the transcript metadata."""
    task = trajectory.task
    return Experience(
        kind=TRAJECTORY,
        text=task.goal,
        provenance=Provenance((task.task_id,), task.split),
        metadata={
            "task_id": task.task_id,
            "task_type": task.task_type,
            "trial": trial,
            "success": trajectory.success,
            "steps": len(trajectory.steps),
            "transcript": instructions.render(trajectory),
            "reflections_shown": list(reflections_shown),
            "reflection": reflection,
            **({"phase": phase} if phase else {}),  # a later learning phase (run.continue_from)
        },
        experience_id=trajectory_id(task.task_id, trial, phase),
    )


def select_fewshots(store: Any, task: Task, *, k: int, candidates: int, max_chars: int) -> list[Experience]:
    """The ``k`` successful stored trajectories most similar to ``task`` by goal, of the same task
    type, never of the task itself; per task the shortest success; too long ones skipped (as
    the authors skip few-shots over their token limit)."""
    if k <= 0:
        return []
    hits = store.query(
        task.goal, candidates, kind=TRAJECTORY, task_type=task.task_type,
        where={"$and": [{"success": True}, {"task_id": {"$ne": task.task_id}}]},
    )
    by_task: dict[str, list[Experience]] = {}
    for experience, _similarity in hits:  # best first; dict keeps first-seen order
        meta = experience.metadata
        if meta.get("task_id") == task.task_id or meta.get("task_type") != task.task_type:
            continue
        if not meta.get("success"):
            continue
        by_task.setdefault(str(meta["task_id"]), []).append(experience)
    chosen = []
    for experiences in by_task.values():
        shortest = min(experiences, key=lambda e: len(str(e.metadata.get("transcript", e.text))))
        if max_chars > 0 and len(str(shortest.metadata.get("transcript", ""))) > max_chars:
            continue
        chosen.append(shortest)
        if len(chosen) == k:
            break
    return chosen


def divide_in_chunks(items: list[Any], size: int, rng: random.Random) -> list[list[Any]]:
    """Shuffle, then split into the fewest chunks of at most ``size``, as even as possible
    (the authors' division of successes for the success critiques)."""
    items = list(items)
    rng.shuffle(items)
    if not items:
        return []
    count = math.ceil(len(items) / size)
    per_chunk = math.ceil(len(items) / count)
    return [items[i * per_chunk:(i + 1) * per_chunk] for i in range(count)]


def fresh_state() -> dict[str, Any]:
    return {
        "stage": GATHER,
        "jobs": [],
        "jobs_done": 0,
        "book": {"insights": [], "next_number": 1},
        "gather": {},
        "critique": {
            "critiques": 0,
            "without_operations": 0,
            "operations_parsed": 0,
            "malformed_operations": 0,
            "applied": {},
            "rejected": {},
            "dropped": 0,
            "evicted": 0,
        },
    }


def _count_into(target: dict[str, int], counts: dict[str, int]) -> None:
    for key, value in counts.items():
        target[key] = target.get(key, 0) + int(value)


class ExpeL:
    """The ExpeL method: Reflexion gathering, weighted insights, insights + few-shots at test."""

    def __init__(self, run: Run) -> None:
        self.cfg: ExpeLSettings = typed_config(run.cfg.method, ExpeLSettings)
        self.weights = self.cfg.weights
        self.phase = 0  # the learning phase (set by learn)

    def _book(self, state: dict[str, Any]) -> InsightBook:
        book = InsightBook(self.cfg.max_insights, weights=self.weights,
                           max_operations=self.cfg.max_operations,
                           parser=self.cfg.operation_parser, cap=self.cfg.cap_insights)
        book.load(state["book"])
        return book

    @staticmethod
    def _state(run: Run) -> dict[str, Any]:
        return run.method_state.load() or fresh_state()

    @staticmethod
    def _save(run: Run, state: dict[str, Any]) -> None:
        run.method_state.save(state)

    def _sampling(self, run: Run, max_new_tokens: int, seed: int) -> SamplingParams:
        sampling = run.settings.learn.sampling
        return SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                              max_new_tokens=max_new_tokens, seed=seed)

    # -- learning -----------------------------------------------------------------------------

    @arena.hookimpl
    def learn(self, run: Run) -> bool:
        state = self._state(run)
        # A continued run gathers and critiques again, from the insights the first phase left.
        fresh = fresh_state()
        self.phase = begin_learning_phase(run, state, {key: fresh[key] for key in ("stage", "jobs", "jobs_done",
                                                                               "gather")})
        self._sync_insights(run, self._book(state))  # also creates the store: digested either way
        arena.run_stages(state, [(GATHER, lambda: self._gather_stage(run, state)),
                                 (EXTRACT, lambda: self._extract(run, state))],
                         lambda state: self._save(run, state), done=DONE)
        return True

    def _gather_stage(self, run: Run, state: dict[str, Any]) -> None:
        """Reflexion's trials on the train tasks, summed up; the critiques they call for planned."""
        tasks = self.train_tasks(run)
        self._gather(run, tasks)
        state["gather"] = self._gather_summary(run)
        gathered = state["gather"]
        run.log_metrics(0, {"train_success": gathered["tasks_solved"] / max(1, gathered["tasks"]),
                            "trials": gathered["trials"], "reflections": gathered["reflections"]})
        state["jobs"] = self._plan_critiques(run, tasks)

    def train_tasks(self, run: Run) -> list[Task]:
        """``train_tasks`` tasks of the learn split, shuffled by the learn seed and balanced over
        task types (all of them when null)."""
        tasks = list(run.tasks(run.learn_split))
        random.Random(run.learn_seed).shuffle(tasks)
        return select_tasks(tasks, self.cfg.train_tasks)

    def _stored_trials(self, run: Run) -> dict[str, dict[int, Experience]]:
        trials: dict[str, dict[int, Experience]] = {}
        for experience in run.store.all(kind=TRAJECTORY):
            if int(experience.metadata.get("phase", 0)) != self.phase:
                continue  # an earlier learning phase's trial
            trials.setdefault(str(experience.metadata["task_id"]), {})[int(experience.metadata["trial"])] = experience
        return trials

    def _gather(self, run: Run, tasks: list[Task]) -> None:
        """Rounds of trials: round ``r`` plays trial ``r`` of every task still failing, side by
        side; then each failure that will be retried gets its reflection."""
        seed = run.learn_seed
        max_reflections = self.cfg.max_reflections
        stored = self._stored_trials(run)
        for trial in range(1 + max_reflections):
            due: list[Task] = []
            for task in tasks:
                done = stored.get(task.task_id, {})
                outcomes = [bool(done[t].metadata["success"]) for t in sorted(done)]
                if len(done) == trial and trials_needed(outcomes, max_reflections):
                    due.append(task)
            if not due:
                continue
            shown = {task.task_id: [str(stored[task.task_id][t].metadata["reflection"])
                                    for t in sorted(stored.get(task.task_id, {}))]
                     for task in due}
            shown = {key: [text for text in value if text] for key, value in shown.items()}
            played, stopped = self._play_round(run, due, trial, seed, shown)
            retry = trial < max_reflections and not stopped and run.budget.left("episodes") != 0
            failures = [t for t in played if not t.success] if retry else []
            reflections = self._reflect(run, failures, seed=seed * 1_000 + trial)
            experiences = [
                trajectory_experience(t, trial, shown[t.task.task_id], reflections.get(t.task.task_id, ""),
                                      run.env.instructions, self.phase)
                for t in played
            ]
            if experiences:
                run.store.add(experiences)
            for experience in experiences:
                stored.setdefault(str(experience.metadata["task_id"]), {})[trial] = experience
            if stopped:
                return

    def _play_round(self, run: Run, due: list[Task], trial: int, seed: int,
                    shown: dict[str, list[str]]) -> tuple[list[Trajectory], bool]:
        """Trial ``trial`` of each due task with its reflections shown (``arena.play_round``)."""
        return arena.play_round(
            run, due, seed, f"trial{trial}",
            lambda task: [Experience(REFLECTION, text, Provenance((task.task_id,), task.split))
                          for text in shown[task.task_id]])

    def _reflect(self, run: Run, failures: list[Trajectory], seed: int) -> dict[str, str]:
        """One reflection per failed trial, in one batched generate call."""
        if not failures:
            return {}
        max_chars = self.cfg.transcript_chars
        prompts = [reflection_prompt(t, max_chars, run.env.instructions) for t in failures]
        generations = run.llm.generate(prompts, self._sampling(run, self.cfg.reflection_max_tokens, seed))
        return {t.task.task_id: parse_reflection(g.text) for t, g in zip(failures, generations)}

    def _gather_summary(self, run: Run) -> dict[str, Any]:
        trials = [e.metadata for e in run.store.all(kind=TRAJECTORY)
                  if int(e.metadata.get("phase", 0)) == self.phase]
        by_trial: dict[str, list[int]] = {}
        for meta in trials:
            entry = by_trial.setdefault(str(meta["trial"]), [0, 0])
            entry[0] += 1
            entry[1] += int(bool(meta["success"]))
        return {
            "tasks": len({m["task_id"] for m in trials}),
            "trials": len(trials),
            "tasks_solved": len({m["task_id"] for m in trials if m["success"]}),
            "reflections": sum(1 for m in trials if m["reflection"]),
            "trials_and_successes_by_trial": by_trial,
        }

    def _plan_critiques(self, run: Run, tasks: list[Task]) -> list[dict[str, Any]]:
        """The critique jobs, fixed once gathering ends (so a resume runs the same list)."""
        stored = self._stored_trials(run)
        compare, successes = [], []
        for task in tasks:
            trials = [stored[task.task_id][t] for t in sorted(stored.get(task.task_id, {}))]
            won = [e for e in trials if e.metadata["success"]]
            lost = [e for e in trials if not e.metadata["success"]]
            for success in won:
                for failure in lost:
                    compare.append({"kind": "compare", "task_id": task.task_id,
                                    "ids": [success.experience_id, failure.experience_id]})
            if won:
                successes.append(won[0].experience_id)
        rng = random.Random(run.learn_seed * 7_919 + 1)
        chunks = divide_in_chunks(successes, self.cfg.success_chunk, rng)
        return compare + [{"kind": "success", "ids": chunk} for chunk in chunks]

    def _extract(self, run: Run, state: dict[str, Any]) -> None:
        """Run the remaining critique jobs; each one's update is saved before the next starts."""
        book = self._book(state)
        jobs = state["jobs"]
        with run.progress("expel: insight critiques", total=len(jobs)) as shown:
            shown.update(int(state["jobs_done"]))
            self._critiques(run, state, book, jobs, shown)

    def _critiques(self, run: Run, state: dict[str, Any], book: Any, jobs: list[dict[str, Any]],
                   shown: Any) -> None:
        max_chars = self.cfg.critique_chars
        max_operations = self.cfg.max_operations or 4
        for index in range(int(state["jobs_done"]), len(jobs)):
            run.refresh_token_usage()
            if "tokens" in run.budget.exhausted():
                break
            job = jobs[index]
            trials = run.store.get(job["ids"])
            if job["kind"] == "compare" and len(trials) == 2:
                success, failure = trials
                prompt = compare_prompt(success.text, str(success.metadata["transcript"]),
                                        str(failure.metadata["transcript"]), book.texts(),
                                        full=book.full, max_operations=max_operations, max_chars=max_chars)
            elif job["kind"] == "success" and trials:
                prompt = success_prompt([(e.text, str(e.metadata["transcript"])) for e in trials],
                                        book.texts(), full=book.full, max_operations=max_operations,
                                        max_chars=max_chars)
            else:
                raise RuntimeError(f"Critique job {index} refers to trajectories missing from the store: "
                                   f"{job['ids']}. The run directory is incomplete; start a new run.")
            seed = run.learn_seed * 1_000_003 + index
            (generation,) = run.llm.generate([prompt], self._sampling(run, self.cfg.critique_max_tokens, seed))
            parsed = parse_operations(generation.text, self.cfg.operation_parser)
            sources = sorted({str(e.metadata["task_id"]) for e in trials})
            report = book.apply(parsed.operations, sources=sources)
            self._count(state["critique"], parsed.malformed, len(parsed.operations), report)
            state["book"] = book.to_dict()
            state["jobs_done"] = index + 1
            self._save(run, state)  # one atomic write: the update and its job are never apart
            run.log_metrics(index + 1, {"insights": len(book.texts()), "operations": len(parsed.operations),
                                        "malformed_operations": parsed.malformed,
                                        **{f"applied/{kind}": n for kind, n in report.applied.items()}})
            self._sync_insights(run, book)
            self._log(run, index, job, generation.text, parsed.malformed, report)
            shown.update(index + 1, note=f"{len(book.texts())} insights")

    @staticmethod
    def _count(counts: dict[str, Any], malformed: int, parsed: int, report: UpdateReport) -> None:
        counts["critiques"] += 1
        counts["without_operations"] += int(parsed == 0)
        counts["operations_parsed"] += parsed
        counts["malformed_operations"] += malformed
        _count_into(counts["applied"], report.applied)
        _count_into(counts["rejected"], report.rejected)
        counts["dropped"] += report.dropped
        counts["evicted"] += report.evicted

    @staticmethod
    def _log(run: Run, index: int, job: dict[str, Any], output: str, malformed: int,
             report: UpdateReport) -> None:
        """Each critique's raw answer and what it did, for inspection (not read back)."""
        record = {"job": index, "kind": job["kind"], "ids": job["ids"], "output": output,
                  "malformed": malformed, "applied": report.applied, "rejected": report.rejected}
        with (run.method_state.folder / CRITIQUE_LOG).open("a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")

    def _sync_insights(self, run: Run, book: InsightBook) -> None:
        """Make the store's insights exactly the book's (idempotent, so safe to repeat on resume)."""
        split = run.learn_split
        wanted = [
            Experience(kind=INSIGHT, text=insight.text, provenance=Provenance(tuple(insight.sources), split),
                       metadata={"weight": insight.weight, "rank": rank}, experience_id=insight.insight_id)
            for rank, insight in enumerate(book.insights)
        ]
        stale = {e.experience_id for e in run.store.all(kind=INSIGHT)} - {e.experience_id for e in wanted}
        if stale:
            run.store.delete(sorted(stale))
        if wanted:
            run.store.add(wanted)

    # -- every phase ----------------------------------------------------------------------------

    @arena.hookimpl
    def retrieve(self, run: Run, task: Task) -> list[Experience]:
        """The insights (highest weight first) and the few-shot successes for ``task``."""
        insights = sorted(run.store.all(kind=INSIGHT), key=lambda e: int(e.metadata["rank"]))
        fewshots = select_fewshots(run.store, task, k=self.cfg.fewshots,
                                   candidates=self.cfg.fewshot_candidates,
                                   max_chars=self.cfg.fewshot_max_chars)
        return (insights[: self.cfg.max_insights] if self.cfg.cap_insights else insights) + fewshots

    @arena.hookimpl
    def solve(self, run: Run, task: Task, experiences: list[Experience], seed: int) -> Trajectory:
        """The standard solver's constrained choice, with ExpeL's prompt sections."""
        sampling = run.sampling()
        solver = StandardSolver.from_config(run.llm, run.settings.solver, prompt_builder=solver_prompt,
                                            instructions=run.env.instructions)
        policy: Policy = solver.policy(task, experiences, seed, temperature=sampling.temperature,
                                       top_p=sampling.top_p)
        if self.cfg.end_on_repeated_action:
            policy = EndOnRepeat(policy)
        return run.play(EpisodeRequest(task, experiences, policy=policy))

    #: Exported: the insights and the successful trajectories it shows as examples.
    export = arena.export_stored(INSIGHT, TRAJECTORY)

    @arena.hookimpl
    def state_size(self, run: Run) -> dict[str, Any]:
        state = self._state(run)
        critique = state["critique"]
        return {
            "insights": len(state["book"]["insights"]),
            # What the state holds: every phase's trials (a continued run keeps the first's).
            "trajectories": run.store.count(kind=TRAJECTORY) if run.store_exists() else 0,
            "tasks_solved_in_gathering": int(state["gather"].get("tasks_solved", 0)),
            "critiques": int(critique["critiques"]),
            "critiques_without_operations": int(critique["without_operations"]),
            "malformed_operations": int(critique["malformed_operations"]),
            "rejected_operations": int(sum(critique["rejected"].values())),
        }
