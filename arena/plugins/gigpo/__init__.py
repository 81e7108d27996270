"""GiGPO (verl-agent): GRPO with step-level advantages from anchor states a group shares.

Registered like any third-party plugin; the algorithm is in :mod:`arena.plugins.gigpo.method`,
the estimator in the RL core (``arena.rl.step_advantages``), where any method can select it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import arena
from arena.plugins.gigpo.method import GiGPO

HERE = Path(__file__).parent


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register(
        "gigpo",
        GiGPO,
        config=HERE / "config.yaml",
        presets={path.stem: path for path in sorted((HERE / "presets").glob("*.yaml"))},
        description="GiGPO: group-in-group policy optimisation (episode and anchor-state step advantages).",
    )
