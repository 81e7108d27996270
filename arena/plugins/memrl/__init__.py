"""MemRL (MemTensor/MemRL): a Q-valued episodic memory learned from reward, LLM frozen.

Registered like any third-party plugin. The algorithm is in :mod:`arena.plugins.memrl.method`;
defaults and every deviation from the authors' ALFWorld config are in ``config.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable

import arena
from arena.plugins.memrl.method import MemRL


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("memrl", MemRL, **arena.plugin_files(__file__),
             description="MemRL: two-phase retrieval over an episodic memory with Q-values from reward.")
