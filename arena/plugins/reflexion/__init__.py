"""Reflexion (Shinn et al., 2023): verbal self-reflection after a failed trial, kept for the next.

Registered like any third-party plugin; the algorithm is in :mod:`arena.plugins.reflexion.method`,
defaults and every deviation from the authors' ALFWorld code in ``config.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import arena
from arena.plugins.reflexion.method import Reflexion

HERE = Path(__file__).parent


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register(
        "reflexion",
        Reflexion,
        config=HERE / "config.yaml",
        presets={path.stem: path for path in sorted((HERE / "presets").glob("*.yaml"))},
        description="Reflexion: reflections on failed trials, retried on train; shared by similarity at test.",
    )
