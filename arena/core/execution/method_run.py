"""The run as an in-process method is handed it: the :class:`~arena.core.contract.run_api.Run` protocol's
names, and nothing else of the harness's run context.

In one process a method is trusted code (Python hides nothing from code in its own process:
``docs/security.md`` says what that leaves open, and ``run.isolation=process`` closes it). What
this stand-in stops is the documented kind of reach: a public name of the context that is no part
of the plugin API (``run.episodes``, ``run.steps``, ``run.gate``, ...) is refused and recorded as
a violation, as a worker's request for such a name is under ``run.isolation=process``; so a
method that records through ``run.episodes`` instead of playing through ``run.play`` ends invalid
in either mode.
"""

from __future__ import annotations

from typing import Any

from arena.core.contract.run_api import DEPRECATED_NAMES, Run, protocol_names

#: What an in-process method may use of its run: the whole protocol (and, for plugins written for
#: Arena 0.2, its ways to play, each warning that it is deprecated).
METHOD_RUN_NAMES = protocol_names(Run) | DEPRECATED_NAMES


class MethodRun:
    """Forwards the :class:`Run` protocol's names to the run context; refuses the others."""

    __slots__ = ("_context",)

    def __init__(self, context: Any) -> None:  # a RunContext (typed loosely: it imports this module)
        object.__setattr__(self, "_context", context)

    def __getattr__(self, name: str) -> Any:
        context = object.__getattribute__(self, "_context")
        if name in METHOD_RUN_NAMES:
            return getattr(context, name)
        if name.startswith("_"):
            raise AttributeError(name)
        raise context.violations_log.refusal(
            f"Method '{context.method_name}' asked for run.{name}, which is not part of the plugin API "
            "(arena.Run; docs/plugin_hooks.md lists what a method may call).")

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_context"), name, value)  # the context refuses, on record

    def __dir__(self) -> list[str]:
        return sorted(METHOD_RUN_NAMES)

    def __repr__(self) -> str:
        return f"<run of method '{object.__getattribute__(self, '_context').method_name}'>"
