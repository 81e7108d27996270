"""The ``base`` method: no experience at all, the uniform baseline every method is compared to.

It implements no method hook, so every hook falls back to the harness defaults: the standard
solver, nothing retrieved, nothing learned. It is registered exactly like a third-party plugin.
"""

from __future__ import annotations

from collections.abc import Callable

import arena
from arena import Run


class BaseMethod:
    """The harness's standard solver with no experience."""

    def __init__(self, run: Run) -> None:
        self.run = run


@arena.hookimpl
def register_methods(register: Callable[..., None]) -> None:
    register("base", BaseMethod, **arena.plugin_files(__file__),
             description="No experience: the standard solver alone (the uniform baseline).")
