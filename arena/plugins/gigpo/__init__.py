"""GiGPO (verl-agent): GRPO with step-level advantages from anchor states a group shares.

Registered like any third-party plugin; the algorithm is in :mod:`arena.plugins.gigpo.method`,
the estimator in the RL core (``arena.rl.step_advantages``), where any method can select it.
"""

from __future__ import annotations

from collections.abc import Callable

import arena
from arena.plugins.gigpo.method import GiGPO


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("gigpo", GiGPO, **arena.plugin_files(__file__),
             description="GiGPO: group-in-group policy optimisation (episode and anchor-state step advantages).")
