"""Reflexion (Shinn et al., 2023): verbal self-reflection after a failed trial, kept for the next.

Registered like any third-party plugin; the algorithm is in :mod:`arena.plugins.reflexion.method`,
defaults and every deviation from the authors' ALFWorld code in ``config.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable

import arena
from arena.plugins.reflexion.method import Reflexion


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("reflexion", Reflexion, **arena.plugin_files(__file__),
             description="Reflexion: reflections on failed trials, retried on train; shared by similarity at test.")
