"""Runs in tests: registering test-only methods, reaching the harness behind a run, reading its log."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import arena


def register(plugins, **methods):
    module = types.SimpleNamespace(__name__="protocol_test_plugin")

    @arena.hookimpl
    def register_methods(register):
        for name, factory in methods.items():
            register(name, factory)

    module.register_methods = register_methods
    plugins.register_plugin(module, name="protocol_test_plugin")


def oracle_episode(run, task):
    """Test code only: an episode whose expert a scripted method follows at evaluation.

    ``run.env`` refuses episodes at evaluation; this reaches past that view, as only in-process
    code can (``docs/security.md``). The harness still replays what comes back before it
    credits it: the game really is won, so it counts.
    """
    context = harness_of(run)
    return context.env._env.open(context.gate.own_task(task))


def harness_of(run):
    """Test code only: the run context behind the ``run`` an in-process method is handed (which
    answers the plugin API's names alone), reached past it as only in-process code can."""
    return getattr(run, "_context", run)


def learned_metrics(path: Path) -> list[dict]:
    """The figures the run logged per learning step (metrics.jsonl)."""
    from arena.core.storage.metrics import read_metrics

    return [entry["metrics"] for entry in read_metrics(path) if entry["phase"] == "learn"]


def killed_run(out: Path, overrides: list[str], crash_at: str, method: str = "memrl") -> int:
    """A run of ``method`` in a fresh process killed (``os._exit``) at the fault-injection point
    ``crash_at`` (``ARENA_CRASH_AT``: ``point:N``, its Nth passage); its exit status (137: killed)."""
    code = ("import sys; from arena.core import protocol; "
            "protocol.run(sys.argv[1], overrides=sys.argv[3:], out=sys.argv[2])")
    env = {**os.environ, "ARENA_CRASH_AT": crash_at}
    return subprocess.run([sys.executable, "-c", code, method, str(out), *overrides], env=env,
                          capture_output=True, text=True, timeout=300).returncode
