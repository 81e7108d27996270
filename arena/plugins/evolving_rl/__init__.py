"""Evolving-RL, the reference method: one model co-evolves as skill extractor and solver.

Registered like any third-party plugin; also registers its GRPO baseline as method ``grpo``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import arena
from arena.plugins.evolving_rl.method import EvolvingRL

HERE = Path(__file__).parent


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    # Evolving-RL's presets; files named grpo* belong to the GRPO baseline.
    register("evolving_rl", EvolvingRL, **arena.plugin_files(__file__, exclude="grpo*"),
             description="Evolving-RL: extractor and solver co-evolved by GRPO on one model.")
    register(
        "grpo",
        EvolvingRL,
        config=[HERE / "config.yaml", HERE / "presets" / "grpo.yaml"],
        presets={"paper": HERE / "presets" / "paper.yaml", "cpu": HERE / "presets" / "grpo_cpu.yaml"},
        description="GRPO baseline: solver-only RL on the train split, no skills.",
    )
