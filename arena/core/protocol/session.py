"""The evaluation protocol: one code path that every method's run goes through.

1. **learn** on the train split only (valid is allowed and recorded), within enforced budgets;
2. **evaluate** on test_seen and test_unseen, every task exactly once per seed, with the
   method's state **frozen**: ``update``/``extract``/``learn`` are not called, the experience
   store refuses writes, and a digest of the state (store, method state, model weights) taken
   before and after must match. A violation marks the run invalid;
3. the ``online`` track instead calls ``update`` after each test episode; its results say
   ``track: online`` and are never mixed with frozen ones.

Every finished episode is on disk before the next starts, so a killed run resumes (``--resume``)
without redoing or losing an episode. The session only builds the run's parts and sequences the
phases; each phase and check is an object of its own in this package.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Unpack, cast

from omegaconf import OmegaConf

from arena.core.config.compose import load_yaml, to_plain
from arena.core.config.plugins import Plugins, get_plugins, new_plugin_manager
from arena.core.contract.env import POOL_SPLIT
from arena.core.contract.errors import BudgetExhausted, ProtocolViolation
from arena.core.contract.llm import LLMBackend
from arena.core.contract.results import ProtocolFields, Results, SolverFields, SourcePool, Track
from arena.core.execution import salt as eval_salt
from arena.core.execution.context import RunContext
from arena.core.execution.defaults import HarnessDefaults
from arena.core.execution.episodes import checked_experiences
from arena.core.execution.executors import build_environment
from arena.core.execution.phase import LEARN
from arena.core.host import provenance
from arena.core.isolation.isolated import IsolatedMethod, refusal_recorder
from arena.core.protocol import continuation
from arena.core.protocol.clock import PhaseClock
from arena.core.protocol.digests import StateDigests
from arena.core.protocol.evaluation import Evaluation
from arena.core.protocol.factors import Factor, NewModel, PoisonedStore
from arena.core.protocol.prepare import PreparedRun, PrepareOptions, prepare
from arena.core.protocol.results_builder import SessionFacts, build_results
from arena.core.services.batching import BatchingBackend
from arena.core.services.embedder import make_embedder
from arena.core.services.progress import Reporter, complete, phase_ending
from arena.core.services.store import ExperienceStore
from arena.core.storage.journal import crash_point
from arena.core.storage.trackers import Tracker, make_trackers


class Session:
    """Builds a run's parts from its config, then sequences the protocol: learn, freeze and
    evaluate, report."""

    def __init__(self, prepared: PreparedRun, plugins: Plugins | None = None,
                 reporter: Reporter | None = None) -> None:
        self.plugins = plugins or get_plugins()
        self.cfg, self.settings, self.run_dir = prepared.cfg, prepared.settings, prepared.run_dir
        self.resumed = prepared.resumed
        self.reporter = complete(reporter)
        self._key = object()  # the harness's: only it advances the run's phase
        self.clock = PhaseClock(self.run_dir)
        self.env = build_environment(self.plugins.envs, self.cfg, self.settings)
        self.salt = eval_salt.resolve(self.settings, self.run_dir.path)
        if self.salt.value is not None:
            try:
                self.env.draw_tests_with(self.salt.value)
            except BaseException:
                self.env.close()
                raise
        inner = self.plugins.backends.get(self.settings.llm.backend).factory(self.cfg.llm)
        self.llm = BatchingBackend(inner, max_batch=self.settings.eval.concurrency)
        self.pm = new_plugin_manager()
        self.pm.register(HarnessDefaults(), name="arena.defaults")
        trackers = make_trackers(self.settings.logging.trackers, self.run_dir.path / "trackers",
                                 label=self.run_dir.path.name, config=to_plain(self.cfg),
                                 project=self.settings.logging.project)
        try:
            self._build(prepared, trackers)
            crash_point("session.built")  # the run directory exists; nothing is played yet
        except BaseException:
            for tracker in trackers:  # the run never started: nothing keeps writing for it
                tracker.close()
            for close in (self.env.close, self.llm.close):  # nor keeps its environment's workers or the model
                with contextlib.suppress(Exception):  # the error that stopped it is the one to show
                    close()
            raise

    def _build(self, prepared: PreparedRun, trackers: list[Tracker]) -> None:
        """The run context, then (resuming) the record and the journal, the kept fine-tunes,
        then the method."""
        state = self.run_dir.ledger.read()
        if state.continued_from and not state.learn_done:
            continuation.check_same_warm_start(state.continued_from, self.llm.describe())
        embedder_cfg, store_path = self.cfg.embedder, self.run_dir.path / "store"
        self.ctx = RunContext(
            self.cfg, self.run_dir, self.env, self.llm, hooks=self.pm.hook, key=self._key,
            make_embedder=lambda: make_embedder(embedder_cfg),
            make_store=lambda embedder, before_write: ExperienceStore(
                store_path, embedder, name=self.settings.store.collection, before_write=before_write),
            make_backend=self._auxiliary_backend, on_episode=self.reporter.episode,
            phase_cost=self.clock.now, reporter=self.reporter, trackers=trackers, settings=self.settings)
        self.ctx.experience_control.check(self.settings.eval.splits, self.env.tasks)
        if self.resumed:
            # The record first (checked), then a step killed mid-way undone, then the method:
            # it is built from the state as the last committed step left it.
            self.run_dir.load_episodes(repair=prepared.repair)
            self.ctx.steps.recover(self.ctx.services)
        # The fine-tunes the method's folder keeps (run.fine_tune), served before the method is
        # built or anything digested: a resumed or continued run's method need not remember them.
        self.ctx.services.restore_fine_tunes()
        name = self.settings.method.name
        factory = self.plugins.methods.get(name).factory
        if self.settings.run.isolation == "process":
            limits = self.settings.run.isolation_limits
            self.method: Any = IsolatedMethod(
                self.ctx, name, factory, on_refused=refusal_recorder(self.ctx.violations_log, name),
                hook_seconds=limits.hook_seconds, memory_mb=limits.memory_mb,
                sandbox=(self.run_dir.path, self.ctx.method_state.folder) if limits.landlock else None)
        else:
            self.method = factory(self.ctx.method_run)
        self.pm.register(self.method, name=f"method:{name}")
        self.pm.check_pending()
        self.clock.meter(self.ctx.services.usage)
        self.digests = StateDigests(self.ctx, self.llm, self.pm.hook, name)

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

    # -- the protocol -------------------------------------------------------------------------

    def run(self) -> Results:
        if not self.run_dir.ledger.read().started:  # a new run, or one killed before it started
            self.run_dir.ledger.start(started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                      provenance=provenance.collect(tuple(self.env.packages)))
        self._learn()
        ledger, settings = self.run_dir.ledger, self.settings
        factors: list[Factor] = [NewModel(self.ctx, self.digests, ledger, self.resumed),
                   PoisonedStore(self.ctx, self.digests, ledger, self.env, settings.learn.seed, settings.method.name)]
        Evaluation(self.ctx, self.env, self.llm, self.pm.hook, self.run_dir, self.digests, self.clock,
                   self.reporter, self._key, factors, self.resumed).run()
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
        cost_before = self.clock.start(LEARN)
        budget.start_metering(tokens_before=cost_before.tokens_in + cost_before.tokens_out)
        if budget.limits.get("episodes") != 0:
            self.reporter.phase(LEARN, budget.limits.get("episodes"), len(learned))
        with phase_ending(self.reporter, LEARN):  # its line stops (a reporter ignores a phase not shown)
            try:
                self.pm.hook.learn(run=self.ctx.method_run)
            except BudgetExhausted:
                pass  # the harness stopped the method's learning; evaluation follows as usual
            except ProtocolViolation:
                pass  # already in ctx.violations: the run goes on and is reported invalid
        budget.refresh()
        cost = self.clock.now(LEARN)
        self.run_dir.ledger.learning_done(used=dict(budget.used), splits=sorted(self.ctx.gate.used_for_learning),
                                          digest=self.digests.state(), cost=cost)

    # -- results ------------------------------------------------------------------------------

    def _method_reports(self) -> tuple[dict[str, int] | None, dict[str, Any]]:
        """What the method's ``export`` hook hands over (counts by kind; None: nothing) and its
        ``state_size``; a hook that fails is a violation, the results are kept."""
        method, run = self.settings.method.name, self.ctx.method_run
        exported: dict[str, int] | None = None
        try:
            handed = self.pm.hook.export(run=run)
            items = checked_experiences("export", method, handed)
            exported = None if handed is None else dict(sorted(Counter(item.kind for item in items).items()))
        except Exception as exc:
            self.ctx.violation(f"export of method '{method}' raised {type(exc).__name__}: {exc}.")
        sizes: dict[str, Any] = {}
        try:
            for extra in self.pm.hook.state_size(run=run):
                sizes.update(extra or {})
        except Exception as exc:  # the evaluation is kept; the run is invalid
            self.ctx.violation(f"state_size of method '{method}' raised {type(exc).__name__}: {exc}.")
        return exported, sizes

    def results(self) -> Results:
        """The run's results: the ledger's state and the records, with what this session knows."""
        state, settings, ctx = self.run_dir.ledger.read(), self.settings, self.ctx
        if ctx.has_store():
            for refused in ctx.store.violations:
                ctx.violation(f"Refused store write during frozen evaluation: {refused}")
        size = self.digests.store_size()  # may record a violation
        exported, method_sizes = self._method_reports()  # before the violations and the head are read
        experience = ctx.experience_control.settings
        split_hashes = {split: self.env.split_hash(split) for split in self.env.split_names()}
        if settings.eval.source_pool == "all_types":  # the pool a method could consult
            split_hashes[POOL_SPLIT] = self.env.split_hash(POOL_SPLIT)
        isolation = ({"mode": "process", "sandbox": self.method.sandbox, "worker_restarts": self.method.restarts}
                     if isinstance(self.method, IsolatedMethod) else {"mode": "in_process"})
        facts = SessionFacts(
            method=settings.method.name, env=settings.env.name,
            track=cast(Track, ctx.track),  # checked by the model
            seeds=list(settings.run.seeds),
            # What a leaderboard must hold equal between runs it ranks together.
            protocol=ProtocolFields(
                max_steps=ctx.eval_max_steps(), max_invalid_actions=settings.eval.max_invalid_actions,
                limit=settings.eval.limit, splits=list(settings.eval.splits), env=dict(self.env.protocol_fields()),
                source_pool=cast(SourcePool, settings.eval.source_pool), eval_salt=self.salt.describe()),
            # How the standard solver laid out its prompts (a method's choice, so not a protocol
            # field; runs of different layouts never pool into one leaderboard row).
            solver=SolverFields(layout=settings.solver.layout, admissible_turns=settings.solver.admissible_turns,
                                mode=settings.solver.mode),
            learn_split=settings.learn.split, budget=dict(ctx.budget.limits), budget_used=dict(ctx.budget.used),
            experience=None if experience.is_protocol() else experience.describe(),
            violations=ctx.violations_log.messages,  # the harness's record, not state.json's
            store_size=size, method_sizes=method_sizes, exported=exported,
            collected=state.provenance or provenance.collect(tuple(self.env.packages)),
            isolation=isolation, env_version=self.env.version, split_hashes=split_hashes,
            model=self.llm.describe(),
            embedder=dict(OmegaConf.to_container(self.cfg.embedder)),  # type: ignore[arg-type]
            config=to_plain(self.cfg), record_head=self.run_dir.head, record_key_id=self.run_dir.record_key_id(),
            finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        return build_results(state, self.run_dir.episodes(), facts)


def run(method: str | None, env: str | None = None, reporter: Reporter | None = None,
        **options: Unpack[PrepareOptions]) -> tuple[Path, Results]:
    """Prepare and run; returns the run directory and its results."""
    plugins = options["plugins"] = options.get("plugins") or get_plugins()
    prepared = prepare(method, env, **options)
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
