"""The evaluation protocol: one code path that every method's run goes through.

1. **learn** on the train split only (valid is allowed and recorded), within enforced budgets;
2. **evaluate** on test_seen and test_unseen, every task exactly once per seed, with the
   method's state **frozen**: ``update``/``extract``/``learn`` are not called, the experience
   store refuses writes, and a digest of the state (store, method state, model weights) taken
   before and after must match. A violation marks the run invalid;
3. the ``online`` track instead calls ``update`` after each test episode; its results say
   ``track: online`` and are never mixed with frozen ones.

Every finished episode is on disk before the next starts, so a killed run resumes (``--resume``)
without redoing or losing an episode.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

import arena
from arena.core.config.compose import compose, load_yaml, to_plain
from arena.core.config.plugins import Plugins, get_plugins, new_plugin_manager
from arena.core.contract.env import POOL_SPLIT, TEST_SPLITS, TRAIN_SPLIT, Environment
from arena.core.contract.errors import BudgetExhausted, HookReturnError, ProtocolViolation
from arena.core.contract.llm import LLMBackend
from arena.core.contract.results import ProtocolFields, Results, SolverFields, SourcePool, Track
from arena.core.contract.settings import Settings
from arena.core.contract.types import EpisodeResult, Experience, Task, Termination, Trajectory
from arena.core.execution import salt as eval_salt
from arena.core.execution.context import RunContext
from arena.core.execution.defaults import HarnessDefaults
from arena.core.execution.episodes import checked_experiences, run_in_threads
from arena.core.execution.executors import build_environment
from arena.core.execution.experience_controls import poison_items
from arena.core.execution.phase import EVALUATE, LEARN
from arena.core.execution.tasks import select_tasks
from arena.core.execution.views import public_task
from arena.core.host import provenance
from arena.core.isolation.isolated import IsolatedMethod, refusal_recorder
from arena.core.protocol import continuation
from arena.core.protocol.results_builder import PRIMARY_VARIANT, SessionFacts, build_results
from arena.core.services.batching import BatchingBackend
from arena.core.services.embedder import make_embedder
from arena.core.services.progress import Reporter, complete
from arena.core.services.store import ExperienceStore
from arena.core.storage import integrity
from arena.core.storage.journal import crash_point
from arena.core.storage.ledger import PhaseCost, RunState
from arena.core.storage.rundir import RunDir, RunDirError, RunLock, new_run_dir
from arena.core.storage.trackers import Tracker, make_trackers

#: Random moments of a frozen evaluation at which the harness re-hashes store and weights.
SPOT_CHECKS = 8


@dataclass
class PreparedRun:
    cfg: DictConfig
    run_dir: RunDir
    resumed: bool
    #: Held from here until the run ends: no second process writes the same directory.
    lock: RunLock | None = None
    #: The directory did not exist before: a run that fails before its first episode removes it.
    created: bool = False
    #: ``--repair``: move damaged lines of episodes.jsonl aside before resuming.
    repair: bool = False
    #: The harness's sections of ``cfg``, typed once here for the whole session.
    settings: Settings = field(init=False)

    def __post_init__(self) -> None:
        self.settings = Settings.of(self.cfg)

    def discard(self) -> None:
        """Remove a new run's directory (nothing was recorded in it yet)."""
        if self.created and not self.resumed and not (self.run_dir.path / "episodes.jsonl").exists():
            shutil.rmtree(self.run_dir.path, ignore_errors=True)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


def prepare(
    method: str | None,
    env: str | None = None,
    config_file: Path | str | None = None,
    overrides: list[str] | None = None,
    out: Path | str | None = None,
    resume: Path | str | None = None,
    plugins: Plugins | None = None,
    preset: str | None = None,
    allow_version_change: bool = False,
    repair: bool = False,
) -> PreparedRun:
    """Resolve the config and the run directory (a new one, or the one to resume)."""
    plugins = plugins or get_plugins()
    if resume is not None:
        run_dir = RunDir(resume)
        run_dir.load_config()  # is it a run directory at all?
        lock = run_dir.lock().acquire()  # a second process on this folder stops here
        try:
            prepared = _resumed(run_dir, lock, method, env, config_file, overrides, plugins, preset,
                                allow_version_change)
            prepared.repair = repair
            return prepared
        except BaseException:
            lock.release()
            raise
    if repair:
        raise ValueError("--repair applies to --resume RUN_DIR only.")
    if method is None:
        raise ValueError("Name a method with --method (see `arena plugins`).")
    cfg = compose(plugins, method, env, config_file, overrides, preset)
    path = Path(out) if out else new_run_dir(cfg.run.root, method, cfg.env.name)
    run_dir = RunDir(path)
    existed = run_dir.path.exists()
    try:
        run_dir.path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"Cannot create the run directory {path}: {exc.strerror or exc}. "
                          "Choose another --out.") from exc
    lock = run_dir.lock().acquire()
    try:
        run_dir.create(cfg, _learned_state_to_start_from(cfg, run_dir))
    except BaseException:
        lock.release()
        raise
    return PreparedRun(cfg, run_dir, resumed=False, lock=lock, created=not existed)


def _learned_state_to_start_from(cfg: DictConfig, run_dir: RunDir,
                                 remaking: bool = False) -> dict[str, Any] | None:
    """A continued run's learned state, copied into its folder first (a folder without it is no
    run yet), and what its first state records of it; None for a run that learns from nothing."""
    continued = continuation.source_of(cfg)
    if continued is None:
        return None
    started_from = continuation.check_source(continued, cfg, run_dir, remaking=remaking)
    continuation.seed_learned_state(continued, run_dir.path)
    return started_from


def _resumed(run_dir: RunDir, lock: RunLock, method: str | None, env: str | None,
             config_file: Path | str | None, overrides: list[str] | None, plugins: Plugins,
             preset: str | None, allow_version_change: bool = False) -> PreparedRun:
    """The checks of ``--resume`` (made while holding the run's lock)."""
    resume = run_dir.path
    cfg = run_dir.load_config()
    if not run_dir.was_made():  # killed between its config and its first state: nothing was played
        run_dir.write_first_state(_learned_state_to_start_from(cfg, run_dir, remaking=True))
    if method is not None and method != cfg.method.name:
        raise RunDirError(
            f"{resume} is a run of method '{cfg.method.name}', not '{method}'. "
            "Drop --method when resuming, or pass the right run directory."
        )
    if overrides or config_file or preset or env:
        raise RunDirError(
            "A resumed run keeps its saved config; drop --env, --preset, --config and "
            "key=value overrides, or start a new run."
        )
    if run_dir.config_changed():
        raise RunDirError(
            f"{run_dir.path / 'config.yaml'} was edited after the run started; a resumed run keeps "
            "the config it started with. Undo the edit, or start a new run with the new settings."
        )
    started = run_dir.ledger.read().provenance
    now = {"arena_version": arena.__version__, "git_sha": provenance.git_sha()}
    changed = {k: (started.get(k), v) for k, v in now.items() if k in started and started.get(k) != v}
    if changed:
        named = "; ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
        if not allow_version_change:
            raise RunDirError(
                f"{run_dir.path} was started by another Arena ({named}). Resume it with the version "
                "that started it, or pass --allow-version-change (results.json then records it).")
        run_dir.ledger.resumed_by(now)
    plugins.methods.get(cfg.method.name)  # still installed?
    if (run_dir.path / "results.json").exists():
        raise RunDirError(f"{resume} already finished; see `arena show {resume}`.")
    return PreparedRun(cfg, run_dir, resumed=True, lock=lock)


def evaluation_plan(env: Environment, settings: Settings) -> list[tuple[Task, int]]:
    """Every (task, seed) of the evaluation, in a fixed order: no random draws."""
    seeds, splits = settings.run.seeds, settings.eval.splits
    for name, values in (("run.seeds", seeds), ("eval.splits", splits)):
        if len(set(values)) != len(values):
            raise ValueError(f"{name} lists a value twice ({values}); each must appear once.")
    plan: list[tuple[Task, int]] = []
    for split in splits:
        if split not in TEST_SPLITS:
            raise ValueError(
                f"eval.splits may only name test splits {list(TEST_SPLITS)}, got '{split}'."
            )
        tasks = select_tasks(env.tasks(split), settings.eval.limit)
        plan.extend((task, seed) for seed in seeds for task in tasks)
    return plan


class Session:
    """Builds the run's components from the config and runs the protocol."""

    def __init__(self, prepared: PreparedRun, plugins: Plugins | None = None,
                 reporter: Reporter | None = None) -> None:
        self.plugins = plugins or get_plugins()
        self.cfg = prepared.cfg
        self.settings = settings = prepared.settings
        self.run_dir = prepared.run_dir
        self.resumed = prepared.resumed
        self.reporter = complete(reporter)
        cfg = self.cfg
        self._usage_lock = threading.Lock()
        self._frozen_digests: dict[str, str] | None = None  # set when evaluation starts
        self._last_harness_digests: dict[str, str] | None = None  # of the last state_digest
        self._key = object()  # the harness's: only it advances the run's phase
        self.env: Environment = build_environment(self.plugins.envs, cfg, settings)
        self.salt = eval_salt.resolve(settings, self.run_dir.path)
        if self.salt.value is not None:
            try:
                self.env.draw_tests_with(self.salt.value)
            except BaseException:
                self.env.close()
                raise
        inner = self.plugins.backends.get(settings.llm.backend).factory(cfg.llm)
        self.llm = BatchingBackend(inner, max_batch=settings.eval.concurrency)
        self.pm = new_plugin_manager()
        self.pm.register(HarnessDefaults(), name="arena.defaults")
        embedder_cfg = cfg.embedder
        store_path = self.run_dir.path / "store"
        trackers = make_trackers(settings.logging.trackers, self.run_dir.path / "trackers",
                                 label=self.run_dir.path.name, config=to_plain(cfg),
                                 project=settings.logging.project)
        try:
            self._build(prepared, cfg, store_path, embedder_cfg, trackers)
            crash_point("session.built")  # the run directory exists; nothing is played yet
        except BaseException:
            for tracker in trackers:  # the run never started: nothing keeps writing for it
                tracker.close()
            for close in (self.env.close, self.llm.close):  # nor keeps its environment's workers or the model
                with contextlib.suppress(Exception):  # the error that stopped it is the one to show
                    close()
            raise

    def _build(self, prepared: PreparedRun, cfg: DictConfig, store_path: Path, embedder_cfg: DictConfig,
               trackers: list[Tracker]) -> None:
        """The run context, then (resuming) the record and the journal, then the method."""
        state = self.run_dir.ledger.read()
        if state.continued_from and not state.learn_done:
            continuation.check_same_warm_start(state.continued_from, self.llm.describe())
        self.ctx = RunContext(
            cfg, self.run_dir, self.env, self.llm,
            hooks=self.pm.hook,
            key=self._key,
            make_embedder=lambda: make_embedder(embedder_cfg),
            make_store=lambda embedder, before_write: ExperienceStore(
                store_path, embedder, name=self.settings.store.collection, before_write=before_write),
            make_backend=self._auxiliary_backend,
            on_episode=self._on_episode,
            phase_cost=self._phase_cost_now,
            reporter=self.reporter,
            trackers=trackers,
        )
        self.ctx.experience_control.check(self.settings.eval.splits, self.env.tasks)
        if self.resumed:
            # The record first (checked), then a step killed mid-way undone, then the method:
            # it is built from the state as the last committed step left it.
            self.run_dir.load_episodes(repair=prepared.repair)
            self.ctx.steps.recover(self.ctx.services)
        method = self.settings.method.name
        method_entry = self.plugins.methods.get(method)
        if self.settings.run.isolation == "process":
            limits = self.settings.run.isolation_limits
            self.method = IsolatedMethod(
                self.ctx, method, method_entry.factory,
                on_refused=refusal_recorder(self.ctx.violations_log, method),
                hook_seconds=limits.hook_seconds, memory_mb=limits.memory_mb,
                sandbox=(self.run_dir.path, self.ctx.method_state.folder) if limits.landlock else None)
        else:
            self.method = method_entry.factory(self.ctx.method_run)
        self.pm.register(self.method, name=f"method:{cfg.method.name}")
        self.pm.check_pending()
        self._phase_started = time.perf_counter()
        self._usage_at_phase_start = self.ctx.services.usage()
        self._phase_base = PhaseCost()

    def _isolation(self) -> dict[str, Any]:
        """How the method ran: in Arena's process, or in a worker (with its sandbox)."""
        if isinstance(self.method, IsolatedMethod):
            return {"mode": "process", "sandbox": self.method.sandbox, "worker_restarts": self.method.restarts}
        return {"mode": "in_process"}

    def _auxiliary_backend(self, settings: Mapping[str, Any]) -> LLMBackend:
        """A backend a method asked for (``run.auxiliary_llm``): ``settings`` over the YAML
        defaults of the backend it names (the run's own backend if it names none)."""
        name = settings.get("backend") or self.settings.llm.backend
        entry = self.plugins.backends.get(name)
        merged = OmegaConf.merge(*[load_yaml(path) for path in entry.configs], dict(settings),
                                 {"backend": name})
        return entry.factory(merged)

    def close(self) -> None:
        """Close the environment, every backend and the experiment trackers of the run."""
        self.env.close()
        if isinstance(getattr(self, "method", None), IsolatedMethod):
            self.method.close()
        self.ctx.services.close()
        self.ctx.metrics.close()

    # -- cost bookkeeping (on the records, so it survives a resume) ---------------------------

    def _phase_cost_now(self, phase: str) -> PhaseCost:
        """The phase's cost so far: earlier sessions' (its base) and this session's."""
        now = self.ctx.services.usage()
        return self._phase_base.plus(PhaseCost(
            **{key: now[key] - self._usage_at_phase_start[key] for key in ("llm_calls", "tokens_in", "tokens_out")},
            wall_s=time.perf_counter() - self._phase_started))

    def _start_phase(self, phase: str) -> PhaseCost:
        """Take the phase's cost from earlier sessions as the base (the ledger's, or the last
        record's where that is ahead: a session killed after a record), and note what this
        session of the phase runs on (commit, CPU; a resumed phase can have two)."""
        self._phase_base = self.run_dir.ledger.phase_cost(phase, self.run_dir.episodes())
        self.run_dir.ledger.phase_session(phase, provenance.session())
        self._phase_started = time.perf_counter()
        self._usage_at_phase_start = self.ctx.services.usage()
        return self._phase_base

    def _on_episode(self, result: EpisodeResult) -> None:
        self.reporter.episode(result)

    # -- state digest -------------------------------------------------------------------------

    def _harness_digests(self) -> dict[str, str]:
        """What the harness hashes itself: the store, the served weights and the method's
        state file."""
        text = self.ctx.method_state.text()
        return {"store": self._store_digest(),
                "weights": self.llm.weights_digest(fresh=True),
                "method_state": hashlib.sha256(text.encode()).hexdigest() if text else "empty"}

    def _store_digest(self) -> str:
        """The store's digest; a store that cannot be read (its folder deleted under the open
        database) is a violation and a digest of its own, never a crash that loses the run."""
        if not self._store_exists():
            return "empty"
        try:
            return self.ctx.store.digest()
        except Exception as exc:
            self.ctx.violation(f"The experience store could not be read for its digest ({type(exc).__name__}: "
                               f"{exc}): its folder was changed or deleted during the run.")
            return f"unreadable: {type(exc).__name__}"

    def state_digest(self) -> str:
        """Digest of everything the method could have learned: store, method state, weights.

        The harness hashes the store and the weights *before* any method hook runs, so a method
        cannot put back a copy of its learned state inside its own ``state_digest``."""
        return self._state_digests()[0]

    def _state_digests(self, *other_weights: str) -> list[str]:
        """The state digest, then the same state with each of ``other_weights`` (another model's
        weights digest) in place of the served one's (the state a declared change of model
        started from, :meth:`_rebase_on_new_model`): the store, weights and method are hashed once."""
        parts: dict[str, Any] = dict(self._harness_digests())
        self._last_harness_digests = dict(parts)  # evaluation's reference, not hashed again
        try:
            parts["method"] = sorted(str(d) for d in self.pm.hook.state_digest(run=self.ctx.method_run) if d)
        except Exception as exc:  # the finished work is kept; the run is invalid
            self.ctx.violation(f"state_digest of method '{self.cfg.method.name}' raised "
                               f"{type(exc).__name__}: {exc}; its state cannot be verified.")
            parts["method"] = ["<state_digest failed>"]
        return [hashlib.sha256(json.dumps({**parts, **({} if weights is None else {"weights": weights})},
                                          sort_keys=True).encode()).hexdigest()
                for weights in (None, *other_weights)]

    def _spot_check(self) -> None:
        """At a random moment of a frozen evaluation: are the store and weights still those
        learning ended with?"""
        if self._frozen_digests is not None and self._harness_digests() != self._frozen_digests:
            self.ctx.violation("The store or the weights differed from the learned state at a "
                               "random check during frozen evaluation: the method changed them "
                               "while being evaluated.")

    def _store_exists(self) -> bool:
        return self.ctx.store_exists()

    def _store_size(self) -> dict[str, int]:
        """The store's size for results.json; a store a plugin damaged (its folder deleted while
        the database was open) is a recorded violation, not a crash that loses the results."""
        if not self._store_exists():
            return {"items": 0, "bytes": 0}
        try:
            return self.ctx.store.size()
        except Exception as exc:  # chromadb's errors when its files vanish have no common base
            self.ctx.violation(f"the experience store could not be read for its size "
                               f"({type(exc).__name__}: {exc}); was its folder changed?")
            return {"items": 0, "bytes": 0}

    # -- the protocol -------------------------------------------------------------------------

    def run(self) -> Results:
        if not self.run_dir.ledger.read().started:  # a new run, or one killed before it started
            self.run_dir.ledger.start(started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                      provenance=provenance.collect(tuple(self.env.packages)))
        self._learn()
        self._evaluate()
        results = self.results()
        self.run_dir.write_results(results)
        return results

    def _learn(self) -> None:
        state = self.run_dir.ledger.read()
        budget = self.ctx.budget
        if state.learn_done:
            budget.restore(state.learn_used or {})
            return
        learned = [r for r in self.run_dir.episodes() if r.phase == LEARN]
        budget.restore({"episodes": len(learned), "env_steps": sum(r.steps for r in learned),
                        "gradient_steps": state.gradient_steps})
        cost_before = self._start_phase(LEARN)
        budget.start_metering(tokens_before=cost_before.tokens_in + cost_before.tokens_out)
        if self.ctx.budget.limits.get("episodes") != 0:
            self.reporter.phase(LEARN, self.ctx.budget.limits.get("episodes"), len(learned))
        try:
            self.pm.hook.learn(run=self.ctx.method_run)
        except BudgetExhausted:
            pass  # the harness stopped the method's learning; evaluation follows as usual
        except ProtocolViolation:
            pass  # already in ctx.violations: the run goes on and is reported invalid
        finally:
            self.reporter.phase_end(LEARN)  # its line stops (a reporter ignores a phase not shown)
        budget.refresh()
        with self._usage_lock:
            cost = self._phase_cost_now(LEARN)
        self.run_dir.ledger.learning_done(used=dict(budget.used), splits=sorted(self.ctx.gate.used_for_learning),
                                          digest=self.state_digest(), cost=cost)

    def _poison_store(self, state: RunState) -> RunState:
        """Add ``eval.experience.poison``'s share of poison items to the learned store, before
        evaluation; the state evaluation must keep is the poisoned one (the clean digest is kept
        beside it). Deterministic: a session killed half-way takes out what it added, and adds
        the same items again."""
        fraction = self.ctx.experience_control.settings.poison
        if not self._store_exists():
            raise ValueError(f"eval.experience.poison={fraction}: method '{self.cfg.method.name}' "
                                "has no experience store to poison (its learning is elsewhere, e.g. "
                                "in weights). Poison a run of a method that stores experience.")
        store = self.ctx.services.raw_store()
        items = store.all()
        rows = store.rows_of(e.experience_id for e in items)
        types = {t.task_id: t.task_type for split in (TRAIN_SPLIT, "valid")
                 if split in self.env.split_names() for t in self.env.tasks(split)}

        def task_type_of(item: Experience) -> str | None:
            found = {types.get(i) for i in item.provenance.source_task_ids} - {None}
            return found.pop() if len(found) == 1 else None

        try:
            poison = poison_items(items, {i: row["embedding"] for i, row in rows.items() if row},
                                  task_type_of, fraction, seed=self.settings.learn.seed)
        except ValueError as exc:
            raise ValueError(f"eval.experience.poison={fraction}: {exc}") from exc
        if poison:  # a share of a small store may round to no item: recorded as 0 poison items
            # Named before they are added: a session killed between the two takes them out again
            # (at the start of _evaluate) rather than poisoning a poisoned store.
            self.run_dir.ledger.poisoning([p.experience.experience_id for p in poison])
            store.add([p.experience for p in poison], embeddings=[p.embedding for p in poison])
        summary = {"fraction": fraction, "clean_items": len(items), "poison_items": len(poison),
                   "from_another_type": sum(p.other_type for p in poison),
                   "digest_clean": state.digest_before_eval}
        return self.run_dir.ledger.poisoned(summary, self.state_digest())

    def _rebase_on_new_model(self, state: RunState) -> RunState:
        """A learned state evaluated with another model (``arena experiment transfer``): with
        the source model's weights digest in place of the served one's, the state must be the
        one the source's learning ended with; then the new model's digest is the reference that
        evaluation must keep."""
        change = state.model_changed
        assert change is not None and state.digest_before_eval is not None  # the caller checked
        served, learned = self._state_digests(change.from_weights_sha256)
        method_files = integrity.tree_sha256(self.ctx.method_state.folder)
        if learned != state.digest_before_eval or method_files != change.method_files_sha256:
            self.ctx.violation(
                "The learned state evaluated with another model differs from the one its source's "
                f"learning ended with ({state.digest_before_eval[:12]} -> {learned[:12]}): the "
                "method must restore its learned state when constructed.")
        rebased = change.model_copy(update={"rebased": True, "digest_learned": state.digest_before_eval})
        return self.run_dir.ledger.rebased(rebased, served)

    def _evaluate(self) -> None:
        ctx = self.ctx
        state = self.run_dir.ledger.read()
        plan = evaluation_plan(self.env, self.settings)
        frozen = ctx.track == "frozen"
        poisons = frozen and self.ctx.experience_control.settings.poison > 0
        if self.resumed and poisons and state.poisoning and state.poisoned is None:
            self.ctx.services.raw_store().delete(state.poisoning)  # killed while poisoning
        if self.resumed and frozen and state.model_changed is not None and not state.model_changed.rebased:
            state = self._rebase_on_new_model(state)
        elif self.resumed and frozen:
            digest_now = self.state_digest()
            if state.digest_before_eval != digest_now:
                ctx.violation(
                    "The method's state on resume differs from the state learning ended with "
                    f"({str(state.digest_before_eval)[:12]} -> {digest_now[:12]}): the method must "
                    "restore its learned state when constructed (e.g. load its checkpoint)."
                )
        if poisons and state.poisoned is None:
            state = self._poison_store(state)
        if frozen:  # what the random checks compare with: hashed once, by the last state_digest
            self._frozen_digests = self._last_harness_digests or self._harness_digests()
        ctx.episodes.begin_evaluation(self._key, plan, self._declared_variants(),
                                      spot_check=self._spot_check if frozen else None,
                                      spot_checks=SPOT_CHECKS,
                                      steps=len(plan) * ctx.eval_max_steps() // 2)
        todo = [(task, seed) for task, seed in plan if ctx.finished(task, seed) is None]
        self._start_phase(EVALUATE)
        self.reporter.phase(EVALUATE, len(plan), len(plan) - len(todo))
        try:
            if ctx.track == "online":
                for task, seed in todo:
                    self._online_episode(task, seed)
            else:
                self._run_concurrently(todo, self._frozen_episode)
        finally:
            self.reporter.phase_end(EVALUATE)
        with self._usage_lock:
            cost = self._phase_cost_now(EVALUATE)
        digest_after = self.state_digest()
        if ctx.track == "frozen" and digest_after != state.digest_before_eval:
            ctx.violation(
                "The method's state changed during frozen evaluation "
                f"({str(state.digest_before_eval)[:12]} -> {digest_after[:12]}): it learned from "
                "test episodes."
            )
        if frozen:
            self._check_shown_experiences()
        self._check_run_files()
        self._check_plan(plan)
        self.run_dir.ledger.evaluation_done(digest=digest_after, cost=cost)

    def _declared_variants(self) -> list[str]:
        """The helper variants the method declares before the evaluation plays anything
        (``evaluation_variants``): names, none of them the result's."""
        method = self.cfg.method.name
        declared = self.pm.hook.evaluation_variants(run=self.ctx.method_run)
        if declared is None:
            return []
        if not isinstance(declared, (list, tuple)) or not all(isinstance(v, str) and v for v in declared) \
                or PRIMARY_VARIANT in declared:
            raise HookReturnError(f"evaluation_variants of method '{method}' returned {declared!r}; expected a "
                                  f"list of variant names (strings other than {PRIMARY_VARIANT!r}).")
        return sorted(set(declared))

    def _check_shown_experiences(self) -> None:
        """Every experience id recorded at evaluation is in the frozen store (or was derived at
        test time from non-test tasks): memory written during evaluation and deleted before the
        end digest is caught here."""
        shown: set[str] = set()
        for record in self.run_dir.episodes():
            if record.phase == EVALUATE:
                shown.update(set(record.experience_ids) - set(record.derived_experience_ids))
        if not shown:
            return
        found = ({e.experience_id for e in self.ctx.store.get(sorted(shown))}
                 if self._store_exists() else set())
        missing = sorted(shown - found)
        if missing:
            self.ctx.violation(f"{len(missing)} experience ids recorded at evaluation are not in the "
                               f"frozen store (e.g. {missing[0]}): they were written during "
                               "evaluation and removed, or never stored.")

    def _check_plan(self, plan: list[tuple[Task, int]]) -> None:
        """Every planned (task, seed) has exactly one result on record, and nothing unplanned
        has one: what the board counts is what the harness set out to play."""
        planned = {(task.task_id, seed) for task, seed in plan}
        on_record: dict[tuple[str, int], int] = {}
        for record in self.run_dir.episodes():
            if record.phase == EVALUATE and record.variant == PRIMARY_VARIANT:
                on_record[(record.task_id, record.seed)] = on_record.get((record.task_id, record.seed), 0) + 1
        missing = sorted(planned - set(on_record))
        doubled = sorted(key for key, count in on_record.items() if count > 1)
        unplanned = sorted(set(on_record) - planned)
        for what, keys in (("has no result on record", missing), ("has more than one result", doubled),
                           ("was not planned but has a result", unplanned)):
            if keys:
                self.ctx.violation(f"{len(keys)} evaluation task(s) {what} (e.g. {keys[0][0]} seed "
                                   f"{keys[0][1]}): the record is not the harness's plan.")

    def _check_run_files(self) -> None:
        """config.yaml as the run started, and the store still on disk where there was one."""
        if self.run_dir.config_changed():
            self.ctx.violation("config.yaml was changed while the run ran: its results would not "
                               "describe the config they came from.")
        if self._frozen_digests and self._frozen_digests["store"] != "empty" \
                and not (self.run_dir.path / "store").is_dir():
            self.ctx.violation("The run's store/ folder was deleted during evaluation.")

    def _retrieve(self, task: Task, seed: int) -> list[Experience] | Trajectory:
        """The method's experiences for ``task`` (as methods see it), or an error trajectory if
        retrieval failed. Under ``eval.experience`` the harness decides whose experience it is:
        another task's (a decoy of another type), or none."""
        try:
            source = self.ctx.experience_control.task_for(task, seed)
            if source is None:
                return []
            return checked_experiences("retrieve", self.cfg.method.name,
                                       self.pm.hook.retrieve(run=self.ctx.method_run, task=source))
        except Exception as exc:
            return Trajectory(task=task, initial_observation="", status=Termination.ERROR,
                              error=f"retrieve failed: {type(exc).__name__}: {exc}")

    def _frozen_episode(self, task: Task, seed: int) -> None:
        self.ctx.episodes.begin_task(self._key, task, seed)
        self.reporter.plan_task_start(EVALUATE)
        task = public_task(task)
        experiences = self._retrieve(task, seed)
        if isinstance(experiences, Trajectory):
            self.ctx.episodes.record(experiences, seed=seed)
            return
        self.ctx.episodes.play(task, experiences, seed=seed)

    def _online_episode(self, task: Task, seed: int) -> None:
        self.ctx.episodes.begin_task(self._key, task, seed)
        self.reporter.plan_task_start(EVALUATE)
        task = public_task(task)
        experiences = self._retrieve(task, seed)
        if isinstance(experiences, Trajectory):
            self.ctx.episodes.record(experiences, seed=seed)
            return
        trajectory = self.ctx.episodes.play(task, experiences, seed=seed, record=False)
        self.ctx.steps.commit(trajectory, seed=seed)

    def _run_concurrently(self, items: list[tuple[Task, int]],
                          episode: Callable[[Task, int], None]) -> None:
        run_in_threads(lambda item: episode(*item), items,
                       workers=self.settings.eval.concurrency, llm=self.llm)

    # -- results ------------------------------------------------------------------------------

    def _split_hashes(self) -> dict[str, str]:
        """Every split's hash, and the source pool's where a method could consult it."""
        hashes = {split: self.env.split_hash(split) for split in self.env.split_names()}
        if self.settings.eval.source_pool == "all_types":
            hashes[POOL_SPLIT] = self.env.split_hash(POOL_SPLIT)
        return hashes

    def _exported(self) -> dict[str, int] | None:
        """Counts by kind of what the method's ``export`` hook hands over (None: it exports
        nothing); a hook that fails is a violation, as ``state_size``'s."""
        try:
            exported = self.pm.hook.export(run=self.ctx.method_run)
            items = checked_experiences("export", self.cfg.method.name, exported)
        except Exception as exc:
            self.ctx.violation(f"export of method '{self.cfg.method.name}' raised "
                               f"{type(exc).__name__}: {exc}.")
            return None
        return None if exported is None else dict(sorted(Counter(item.kind for item in items).items()))

    def results(self) -> Results:
        """The run's results: the ledger's state and the records, with what this session knows."""
        cfg = self.cfg
        state = self.run_dir.ledger.read()
        if self.ctx.has_store():
            for refused in self.ctx.store.violations:
                self.ctx.violation(f"Refused store write during frozen evaluation: {refused}")
        size = self._store_size()  # may record a violation
        exported = self._exported()  # may record one too: before the violations and the head are read
        method_sizes: dict[str, Any] = {}
        try:
            for extra in self.pm.hook.state_size(run=self.ctx.method_run):
                method_sizes.update(extra or {})
        except Exception as exc:  # the evaluation is kept; the run is invalid
            self.ctx.violation(f"state_size of method '{cfg.method.name}' raised "
                               f"{type(exc).__name__}: {exc}.")
        experience, settings = self.ctx.experience_control.settings, self.settings
        facts = SessionFacts(
            method=settings.method.name, env=settings.env.name,
            track=cast(Track, self.ctx.track),  # checked by the model
            seeds=list(settings.run.seeds),
            # What a leaderboard must hold equal between runs it ranks together.
            protocol=ProtocolFields(
                max_steps=self.ctx.eval_max_steps(), max_invalid_actions=settings.eval.max_invalid_actions,
                limit=settings.eval.limit, splits=list(settings.eval.splits), env=dict(self.env.protocol_fields()),
                source_pool=cast(SourcePool, settings.eval.source_pool), eval_salt=self.salt.describe()),
            # How the standard solver laid out its prompts (a method's choice, so not a protocol
            # field; runs of different layouts never pool into one leaderboard row).
            solver=SolverFields(layout=settings.solver.layout, admissible_turns=settings.solver.admissible_turns,
                                mode=settings.solver.mode),
            learn_split=settings.learn.split, budget=dict(self.ctx.budget.limits),
            budget_used=dict(self.ctx.budget.used),
            experience=None if experience.is_protocol() else experience.describe(),
            violations=self.ctx.violations_log.messages,  # the harness's record, not state.json's
            store_size=size, method_sizes=method_sizes, exported=exported,
            collected=state.provenance or provenance.collect(tuple(self.env.packages)),
            isolation=self._isolation(), env_version=self.env.version, split_hashes=self._split_hashes(),
            model=self.llm.describe(),
            embedder=dict(OmegaConf.to_container(cfg.embedder)),  # type: ignore[arg-type]
            config=to_plain(cfg), record_head=self.run_dir.head, record_key_id=self.run_dir.record_key_id(),
            finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        return build_results(state, self.run_dir.episodes(), facts)


def run(
    method: str | None,
    env: str | None = None,
    config_file: Path | str | None = None,
    overrides: list[str] | None = None,
    out: Path | str | None = None,
    resume: Path | str | None = None,
    reporter: Reporter | None = None,
    plugins: Plugins | None = None,
    preset: str | None = None,
    allow_version_change: bool = False,
    repair: bool = False,
) -> tuple[Path, Results]:
    """Prepare and run; returns the run directory and its results."""
    plugins = plugins or get_plugins()
    prepared = prepare(method, env, config_file, overrides, out, resume, plugins, preset,
                       allow_version_change, repair)
    try:
        try:
            session = Session(prepared, plugins, reporter)
        except BaseException:
            # The environment, backend or method refused its config: no run happened, so no run
            # directory is left behind (a resumed one is kept as it was).
            prepared.release()
            prepared.discard()
            raise
        try:
            results = session.run()
        finally:
            session.close()
    finally:
        prepared.release()
    return prepared.run_dir.path, results
