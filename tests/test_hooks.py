"""Plugin loading and the per-run hook calls."""

from __future__ import annotations

import importlib.metadata
import sys
import types
import warnings
from pathlib import Path
from typing import ClassVar

import pluggy
import pytest

import arena
from arena.core import protocol
from arena.core.config.plugins import PluginLoadError, PluginLoadWarning, Plugins, hook_names
from arena.core.config.registry import RegistrationError, UnknownNameError
from arena.core.execution.solver import play
from tests.helpers.runs import harness_of, oracle_episode


class ExpertMethod:
    """Overrides the default solver with the environment's expert (reached as test code only
    can): always succeeds, and the harness's replay credits it."""

    calls: ClassVar[list[str]] = []

    def __init__(self, run):
        self.run = run

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        ExpertMethod.calls.append(task.task_id)
        episode = oracle_episode(run, task)
        return play(
            episode,
            lambda observation, trajectory: _expert_action(episode),
            max_steps=harness_of(run).max_steps(),
            max_invalid_actions=3,
        )


def _expert_action(episode):
    from arena.core.execution.solver import Action

    return Action(text=episode.expert_action())


class OtherMethod:
    def __init__(self, run):
        self.run = run

    @arena.hookimpl
    def solve(self, run, task, experiences, seed):
        raise AssertionError("another method's hook must never run")


def make_plugin(**methods):
    module = types.SimpleNamespace(__name__="test_plugin")

    @arena.hookimpl
    def register_methods(register):
        for name, factory in methods.items():
            register(name, factory, description=f"{name} for tests")

    module.register_methods = register_methods
    return module


def test_in_process_plugin_overrides_default_solver(plugins, fast, tmp_path):
    plugins.register_plugin(make_plugin(expert=ExpertMethod, other=OtherMethod), name="test_plugin")
    ExpertMethod.calls.clear()
    # 30 steps: the expert's longest plan fits (the fast 12 would cut some)
    _, expert = protocol.run("expert", overrides=fast + ["eval.limit=4", "eval.max_steps=30"],
                             out=tmp_path / "e", plugins=plugins)
    _, base = protocol.run("base", overrides=fast + ["eval.limit=4"], out=tmp_path / "b", plugins=plugins)
    assert len(ExpertMethod.calls) == 8  # 4 tasks x 2 splits, each once
    for split in ("test_seen", "test_unseen"):
        assert expert.splits[split].success_rate == 1.0
    assert base.splits["test_seen"].success_rate < 1.0


def test_registered_method_lists_its_hooks(plugins):
    plugins.register_plugin(make_plugin(expert=ExpertMethod), name="test_plugin")
    entry = plugins.methods.get("expert")
    assert entry.hooks == ("solve",)
    assert entry.plugin == "test_plugin"


def test_unknown_hook_name_fails_at_registration(plugins):
    class Typo:
        @arena.hookimpl
        def retreive(self, run, task):
            return []

    with pytest.raises(pluggy.PluginValidationError, match="Did you mean 'retrieve'"):
        plugins.register_plugin(Typo(), name="typo")
    assert not plugins.pm.is_registered(Typo)


def test_hookimpl_with_unknown_argument_is_rejected(plugins):
    class BadArgs:
        @arena.hookimpl
        def solve(self, run, task, experiences, seed, temperature):
            return None

    with pytest.raises(pluggy.PluginValidationError):
        plugins.register_plugin(BadArgs(), name="bad-args")


def test_every_hook_is_documented():
    import arena.core.contract.hookspecs as specs

    names = hook_names()
    assert {"extract", "retrieve", "solve", "update", "learn", "register_methods"} <= set(names)
    for name in names:
        assert (getattr(specs, name).__doc__ or "").strip(), f"hook {name} has no docstring"


def _fake_entry_points(monkeypatch, entries):
    """Make importlib.metadata report the given (name, module) entry points in group arena."""
    eps = importlib.metadata.EntryPoints(
        importlib.metadata.EntryPoint(name=name, value=value, group="arena")
        for name, value in entries
    )

    def entry_points(**params):
        return eps if params.get("group") == "arena" else importlib.metadata.EntryPoints(())

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


@pytest.fixture
def good_module(monkeypatch):
    module = types.ModuleType("arena_good_plugin")

    @arena.hookimpl
    def register_methods(register):
        register("good", ExpertMethod, description="a good third-party method")

    module.register_methods = register_methods
    monkeypatch.setitem(sys.modules, "arena_good_plugin", module)
    return module


def test_broken_third_party_plugin_warns_and_is_skipped(monkeypatch, good_module):
    monkeypatch.delenv("ARENA_LOAD_PLUGINS", raising=False)
    monkeypatch.delenv("ARENA_STRICT_PLUGINS", raising=False)
    _fake_entry_points(monkeypatch, [("broken", "arena_missing_module_xyz"), ("good", "arena_good_plugin")])
    loaded = Plugins()
    loaded.load_defaults()
    with pytest.warns(PluginLoadWarning, match="broken"):
        loaded.load_entry_points()
    assert "good" in loaded.methods and "base" in loaded.methods
    assert "broken" in loaded.skipped


def test_strict_mode_fails_on_broken_plugin(monkeypatch):
    _fake_entry_points(monkeypatch, [("broken", "arena_missing_module_xyz")])
    monkeypatch.setenv("ARENA_STRICT_PLUGINS", "1")
    loaded = Plugins()
    with pytest.raises(PluginLoadError, match="broken"):
        loaded.load_entry_points()


def test_load_plugins_allowlist(monkeypatch, good_module):
    _fake_entry_points(monkeypatch, [("broken", "arena_missing_module_xyz"), ("good", "arena_good_plugin")])
    monkeypatch.setenv("ARENA_LOAD_PLUGINS", "good")
    loaded = Plugins()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the broken one is not even imported
        loaded.load_entry_points()
    assert loaded.methods.names() == ["good"]
    monkeypatch.setenv("ARENA_LOAD_PLUGINS", "")
    empty = Plugins()
    empty.load_entry_points()
    assert empty.methods.names() == []


def test_unknown_name_suggests_the_closest(plugins):
    with pytest.raises(UnknownNameError) as info:
        plugins.methods.get("bsae")
    message = str(info.value)
    assert message.startswith("Unknown method 'bsae'. Did you mean 'base'?")
    assert "Available: base" in message


def test_name_collision_is_an_error_and_leaves_nothing_behind(plugins):
    clash = make_plugin(base=ExpertMethod)
    with pytest.raises(RegistrationError, match="registered twice"):
        plugins.register_plugin(clash, name="clash")
    assert plugins.methods.get("base").plugin == "arena.plugins.base"
    assert not plugins.pm.has_plugin("clash")


def test_missing_config_file_is_reported(plugins, tmp_path):
    module = types.SimpleNamespace(__name__="cfgless")

    @arena.hookimpl
    def register_methods(register):
        register("cfgless", ExpertMethod, config=Path(tmp_path) / "nope.yaml")

    module.register_methods = register_methods
    with pytest.raises(RegistrationError, match="does not exist"):
        plugins.register_plugin(module, name="cfgless")


# -- an isolated method's stand-in hooks (arena.core.isolation.isolated) ----------------------------------


def test_an_isolated_hooks_stand_in_declares_its_argument_names_as_pluggy_reads_them():
    """pluggy 1.7 reads an implementation's arguments from ``__code__``, earlier releases from
    its signature: a stand-in whose code declares none gets none passed (every isolated hook
    with arguments then failed). Both readings, and a real call through a plugin manager."""
    from arena.core.contract import hookspecs
    from arena.core.isolation.isolated import hook_parameters, named_forwarder

    received = []
    params = hook_parameters("solve", ["run", "task", "seed"], "m")
    stand_in = named_forwarder("solve", params, lambda kwargs: received.append(kwargs) or "played")
    code = stand_in.__code__
    assert code.co_varnames[:code.co_argcount] == ("run", "task", "seed")
    assert list(pluggy.HookimplMarker("arena")(stand_in).__code__.co_varnames[:3]) == ["run", "task", "seed"]
    import inspect

    assert list(inspect.signature(stand_in).parameters) == ["run", "task", "seed"]

    class Stand:
        solve = staticmethod(pluggy.HookimplMarker("arena")(stand_in))

    manager = pluggy.PluginManager("arena")
    manager.add_hookspecs(hookspecs)
    manager.register(Stand())
    assert manager.hook.solve(run="R", task="T", experiences=["e"], seed=7) == "played"
    assert received == [{"run": "R", "task": "T", "seed": 7}]


@pytest.mark.parametrize("declared", [["run", "os.system('x')"], ["run", "run"], "run", ["run", "payload"]])
def test_a_worker_cannot_declare_arguments_its_hook_does_not_have(declared):
    from arena.core.isolation.isolated import IsolationError, hook_parameters

    with pytest.raises(IsolationError, match="takes some of"):
        hook_parameters("solve", declared, "m")
