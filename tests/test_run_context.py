"""The run context's parts: built complete, the method's own state apart from the harness's,
auxiliary models counted and closed, training through one interface."""

from __future__ import annotations

import inspect
import json
from typing import ClassVar

import pytest

import arena
from arena.core import protocol
from arena.core.contract.errors import NotTrainable
from arena.core.contract.llm import SamplingParams, TrainableBackend
from arena.core.execution.context import RunContext
from arena.testing import learning_context
from tests.helpers.runs import register

EVAL = ["eval.limit=1"]


def test_nothing_is_set_on_the_run_context_from_outside(tmp_path, fast) -> None:
    run = learning_context("base", fast, out=tmp_path / "r")
    try:
        with pytest.raises(AttributeError, match="built complete"):
            run.notes = []
        with pytest.raises(AttributeError, match=r"call run.keep_rollouts\(\) once"):
            run.keep_rollouts = True
        with pytest.raises(AttributeError, match="hook relay"):
            run.hook = None
        with pytest.raises(AttributeError, match="run.method_state"):
            run.run_dir  # noqa: B018
        assert not hasattr(run, "start_evaluation") and not hasattr(run, "start_learning")
    finally:
        run.env._env.close()


def test_the_run_context_offers_every_member_of_the_run_protocol(tmp_path, fast) -> None:
    """At run time as mypy checks it statically (``context._is_a_run``): every member of
    ``arena.Run`` is on a real context, each method accepting the protocol's parameters (same
    names, kinds and defaults), so a method typed against ``Run`` never meets a missing call."""
    run = learning_context("base", fast, out=tmp_path / "r")
    try:
        members = [name for name in vars(arena.Run) if not name.startswith("_")]
        assert len(members) >= 30
        for name in members:
            declared = vars(arena.Run)[name]
            if isinstance(declared, property):
                assert name in vars(run) or isinstance(inspect.getattr_static(RunContext, name, None),
                                                       property), name
                continue
            offered = inspect.signature(getattr(RunContext, name)).parameters
            for param in inspect.signature(declared).parameters.values():
                assert param.name in offered, f"RunContext.{name} lacks {param.name}"
                got = offered[param.name]
                assert (got.kind, got.default) == (param.kind, param.default), f"RunContext.{name}({param.name})"
        assert not hasattr(arena.Run, "phases") and hasattr(run, "phases")  # a part stays the harness's
    finally:
        run.env._env.close()


def test_learn_seed_is_the_config_s_seed_typed(tmp_path, fast) -> None:
    """``run.learn_seed`` replaces the plugins' ``int(run.cfg.learn.seed)``: the same number,
    as an int, and read-only."""
    run = learning_context("base", [*fast, "learn.seed=17"], out=tmp_path / "r")
    try:
        assert run.learn_seed == 17 and isinstance(run.learn_seed, int)
        with pytest.raises(AttributeError):
            run.learn_seed = 3
    finally:
        run.env._env.close()


def test_the_budget_is_the_harness_s_and_persists_gradient_steps(tmp_path, fast) -> None:
    run = learning_context("base", fast, out=tmp_path / "r")
    try:
        run.charge(gradient_steps=3)
        with pytest.raises(TypeError, match=r"run.charge\(episodes=1"):
            run.budget.used["gradient_steps"] = 99  # a copy: refused, it would change nothing
        assert run.budget.used["gradient_steps"] == 3
        state = json.loads((tmp_path / "r" / "state.json").read_text())
        assert state["gradient_steps"] == 3
        with pytest.raises(ValueError, match="Unknown budget 'gradient'"):
            run.charge(gradient=1)
    finally:
        run.env._env.close()


def test_a_backend_with_no_trainable_model_names_the_fix(tmp_path, fast) -> None:
    run = learning_context("base", fast, out=tmp_path / "r")
    try:
        with pytest.raises(NotTrainable, match="Use llm.backend=transformers or llm.backend=vllm, or not"):
            run.trainable_backend(", or not")
    finally:
        run.env._env.close()


@pytest.mark.slow
def test_the_served_model_is_trainable_through_the_batching_wrapper(tmp_path, fast) -> None:
    run = learning_context("base", [*fast, "llm.backend=transformers", "llm.model=tiny"], out=tmp_path / "r")
    try:
        backend = run.trainable_backend()
        assert isinstance(backend, TrainableBackend) and backend is not run.llm
        assert sum(p.numel() for p in backend.model.parameters()) > 0
    finally:
        run.env._env.close()


#: One SFT step of LoRA on the tiny model (arena.rl.sft.train_sft's settings).
SFT_SETTINGS = {"steps": 1, "batch_size": 2, "lr": 1e-3, "lora": {"r": 4, "alpha": 8}, "max_length": 512}


def sft_rows() -> list[dict]:
    from arena.core.rl import sft

    prompt = [{"role": "user", "content": "Admissible actions: look, go to desk 1"}]
    return [sft.example(prompt, "go to desk 1")] * 2


def test_a_fine_tune_that_cannot_run_names_the_fix(tmp_path, fast) -> None:
    run = learning_context("base", fast, out=tmp_path / "r")
    try:
        with pytest.raises(ValueError, match="at least one row"):
            run.fine_tune([], SFT_SETTINGS)
        with pytest.raises(ValueError, match="name no batch_size, lr"):
            run.fine_tune(sft_rows(), {"steps": 1})
        with pytest.raises(NotTrainable, match="llm.backend=transformers or llm.backend=vllm, or not"):
            run.fine_tune(sft_rows(), SFT_SETTINGS, ", or not")  # the fake backend serves no model
    finally:
        run.env._env.close()


@pytest.mark.slow
def test_a_fine_tune_is_kept_restored_and_never_trained_twice(plugins, tmp_path) -> None:
    """run.fine_tune's series in the method's folder: a later session restores it before
    anything else; asked again for the newest (killed before the method's state counted it) it
    trains nothing; a continued run's copies are restored, never taken for its own rerun."""
    from arena.core.services.fine_tune import FineTunes, mark_inherited

    make = plugins.backends.get("transformers").factory
    backend, method, rows = make({"model": "tiny"}), tmp_path / "method", sft_rows()
    base = backend.weights_digest(fresh=True)
    metrics = FineTunes(method).train(backend, rows, SFT_SETTINGS, seed=0)
    tuned = backend.weights_digest(fresh=True)
    assert metrics["sft/steps"] == 1 and tuned != base
    assert (method / "fine-tune-00001" / "fine-tune.json").is_file()

    resumed, again = make({"model": "tiny"}), FineTunes(method)
    assert again.restore(lambda: resumed) == 1 and resumed.weights_digest(fresh=True) == tuned
    assert again.train(resumed, rows, SFT_SETTINGS, seed=0) == metrics  # its rerun: nothing trained
    assert resumed.weights_digest(fresh=True) == tuned and not (method / "fine-tune-00002").exists()
    again.train(resumed, rows, SFT_SETTINGS, seed=0)  # asked once more in the same session: a new one
    twice = resumed.weights_digest(fresh=True)
    assert twice != tuned and (method / "fine-tune-00002" / "fine-tune.json").is_file()

    mark_inherited(method)
    continued, copied = make({"model": "tiny"}), FineTunes(method)
    assert copied.restore(lambda: continued) == 2 and continued.weights_digest(fresh=True) == twice
    copied.train(continued, rows, SFT_SETTINGS, seed=0)
    assert (method / "fine-tune-00003").is_dir() and continued.weights_digest(fresh=True) != twice
    assert FineTunes(tmp_path / "none").restore(lambda: pytest.fail("no fine-tune: no model asked for")) == 0


@pytest.mark.slow
def test_run_fine_tune_serves_the_result_and_comes_before_the_trainer(tmp_path, fast) -> None:
    run = learning_context("base", [*fast, "llm.backend=transformers", "llm.model=tiny"], out=tmp_path / "r")
    try:
        before = run.llm.weights_digest(fresh=True)
        metrics = run.fine_tune(sft_rows(), SFT_SETTINGS)
        assert metrics["sft/steps"] == 1 and run.llm.weights_digest(fresh=True) != before
        assert (run.method_state.folder / "fine-tune-00001" / "sft-adapter").is_dir()
        run.trainer({"lr": 1e-3, "lora": {"r": 4, "alpha": 8}})
        with pytest.raises(RuntimeError, match="fine-tune first, then build the trainer"):
            run.fine_tune(sft_rows(), SFT_SETTINGS)
    finally:
        run.env._env.close()


class Counter:
    """Counts its updates in its own state; fails once, inside a step, after saving."""

    fail_at: int | None = None

    def __init__(self, run) -> None:
        self.run = run

    @arena.hookimpl
    def update(self, run, trajectories, experiences) -> None:
        count = run.method_state.load({"updates": 0})["updates"] + 1
        run.method_state.save({"updates": count})
        if count == Counter.fail_at:
            raise KeyboardInterrupt("killed inside the step")


def test_the_method_state_is_put_back_when_a_step_is_killed(plugins, fast, tmp_path) -> None:
    register(plugins, counter=Counter)
    overrides = [*fast, *EVAL, "learn.budget.episodes=4"]
    Counter.fail_at = 3
    with pytest.raises(KeyboardInterrupt):
        protocol.run("counter", overrides=overrides, out=tmp_path / "k", plugins=plugins)
    assert json.loads((tmp_path / "k" / "method" / "state.json").read_text()) == {"updates": 3}
    Counter.fail_at = None
    path, results = protocol.run(None, resume=tmp_path / "k", plugins=plugins)
    # The killed step's save was undone and the step done again: 4 steps, 4 updates.
    assert json.loads((path / "method" / "state.json").read_text()) == {"updates": 4}
    assert results.valid is True and results.learn.used["episodes"] == 4
    assert "updates" not in json.loads((path / "state.json").read_text())


class Writer:
    """Changes its own state file during frozen evaluation (and puts nothing in the store)."""

    def __init__(self, run) -> None:
        self.run = run

    @arena.hookimpl
    def episode_end(self, run, result, trajectory) -> None:
        if run.phase == "evaluate":
            run.method_state.save({"seen": result.task_id})


def test_writing_the_method_state_during_frozen_evaluation_is_caught(plugins, fast, tmp_path) -> None:
    register(plugins, writer=Writer)
    _, results = protocol.run("writer", overrides=[*fast, *EVAL], out=tmp_path / "w", plugins=plugins)
    assert results.valid is False
    assert any("changed during frozen evaluation" in v for v in results.violations)


class EvaluationTuner:
    """Asks for a fine-tune of the served model in a frozen evaluation's episode."""

    def __init__(self, run) -> None:
        pass

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        with pytest.raises(arena.ProtocolViolation):
            run.fine_tune(sft_rows(), SFT_SETTINGS)


def test_a_fine_tune_in_a_frozen_evaluation_is_refused_on_record(plugins, fast, tmp_path) -> None:
    register(plugins, tuner=EvaluationTuner)
    _, results = protocol.run("tuner", overrides=[*fast, *EVAL], out=tmp_path / "t", plugins=plugins)
    assert results.valid is False
    assert any("run.fine_tune during a frozen evaluation" in v for v in results.violations)


class Taught:
    """Asks a teacher (another fake backend) once while learning."""

    closed: ClassVar[list[bool]] = []

    def __init__(self, run) -> None:
        self.run = run

    @arena.hookimpl
    def learn(self, run) -> bool:
        teacher = run.auxiliary_llm({"backend": "fake"})
        original_close = teacher.close

        def close() -> None:
            Taught.closed.append(True)
            original_close()

        teacher.close = close  # type: ignore[method-assign]
        teacher.generate([[{"role": "user", "content": "teach me " * 50}]],
                         SamplingParams(max_new_tokens=8))
        return True


def test_an_auxiliary_model_is_counted_in_the_run_cost_and_closed(plugins, fast, tmp_path) -> None:
    register(plugins, taught=Taught)
    Taught.closed.clear()
    _, results = protocol.run("taught", overrides=[*fast, *EVAL], out=tmp_path / "t", plugins=plugins)
    learn = results.cost.learn
    assert learn.llm_calls == 1 and learn.tokens_in > 50
    assert results.learn.used["tokens"] == learn.tokens_in + learn.tokens_out
    assert Taught.closed == [True]


@pytest.mark.slow
def test_the_checkpointed_trainer_is_seeded_saves_one_checkpoint_and_resumes(plugins, tmp_path) -> None:
    """LoRA's initial weights come from the learn seed, not the process's RNG; ``save`` keeps
    the newest checkpoint only; ``resume`` loads it, and refuses a state that counts more."""
    import torch

    from arena.core.rl import CheckpointedTrainer, TrainerConfig
    from arena.core.storage.method_state import Checkpoints

    make = plugins.backends.get("transformers").factory
    config = TrainerConfig.from_mapping({"lora": {"r": 4, "alpha": 8}})
    checkpoints = Checkpoints(tmp_path / "method")

    def adapters(trainer: CheckpointedTrainer) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in trainer.trainer.model.named_parameters() if "lora_A" in n}

    first = CheckpointedTrainer(make({"model": "tiny"}), config, checkpoints, seed=7)
    torch.rand(1000)  # the global RNG moves on between the two
    second = CheckpointedTrainer(make({"model": "tiny"}), config, checkpoints, seed=7)
    other = CheckpointedTrainer(make({"model": "tiny"}), config, checkpoints, seed=8)
    a, b, c = adapters(first), adapters(second), adapters(other)
    assert a and all(torch.equal(a[n], b[n]) for n in a) and not all(torch.equal(a[n], c[n]) for n in a)
    assert first.trainable_parameters() > 0

    first.save(1)
    first.save(2)
    assert [p.name for p in sorted(checkpoints.folder.glob("checkpoint-*"))] == ["checkpoint-00002"]
    assert second.resume(recorded=1) == 2
    with pytest.raises(FileNotFoundError, match="the 3 updates the method's state records"):
        other.resume(recorded=3)
