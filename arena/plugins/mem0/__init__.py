"""A Mem0-style memory (mem0ai/mem0): facts an LLM extracts from episodes, reconciled with what is
stored by an LLM that decides ADD / UPDATE / DELETE / NONE, retrieved by similarity.

Registered like any third-party plugin; the algorithm is in :mod:`arena.plugins.mem0.method`,
defaults and every deviation from mem0's code in ``config.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable

import arena
from arena.plugins.mem0.method import Mem0


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("mem0", Mem0, **arena.plugin_files(__file__),
             description="Mem0-style memory: LLM-extracted facts, ADD/UPDATE/DELETE/NONE against the store.")
