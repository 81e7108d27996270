"""ExpeL (Zhao et al., LeapLabTHU/ExpeL): insights distilled from successes and failures, plus
retrieved successful trajectories as few-shot examples. No weights are trained.

Registered like any third-party plugin.
"""

from __future__ import annotations

from collections.abc import Callable

import arena
from arena.plugins.expel.method import ExpeL


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("expel", ExpeL, **arena.plugin_files(__file__),
             description="ExpeL: Reflexion gathering, weighted insights, insights + few-shot successes.")
