"""Registers BabyAI-Text through Arena's ``register_envs`` hook, like any plugin."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import arena
from arena.envs.babyai.levels import DEFAULT_SEEN, DEFAULT_UNSEEN, LADDER


@dataclass
class BabyAISettings:
    """The ``env`` section's keys (config.yaml); one left out takes this default."""

    seed: int = 0
    n_train: int = 1000
    n_valid: int = 100
    n_test: int = 100
    seen_levels: list[str] = field(default_factory=lambda: list(DEFAULT_SEEN))
    unseen_levels: list[str] = field(default_factory=lambda: list(DEFAULT_UNSEEN))
    recolour: bool = False


def make_babyai(cfg: Mapping[str, Any]) -> Any:
    """Build the environment from the ``env`` config section (minigrid is imported here, when a
    run asks for the environment, not when plugins are listed)."""
    from arena.envs.babyai.environment import BabyAIEnvironment

    settings = arena.typed_config(cfg, BabyAISettings, prefix="env.", ignore=("name",))
    return BabyAIEnvironment(
        seed=settings.seed, n_train=settings.n_train, n_valid=settings.n_valid, n_test=settings.n_test,
        seen_levels=tuple(settings.seen_levels), unseen_levels=tuple(settings.unseen_levels),
        recolour=settings.recolour,
    )


@arena.hookimpl
def register_envs(register: Callable[..., None]) -> None:
    register("babyai", make_babyai, config=arena.plugin_files(__file__)["config"],
             description=(
                 "BabyAI-Text on minigrid: the agent's view in words, six commands, minigrid's bot "
                 f"as expert. Seen levels {', '.join(DEFAULT_SEEN)}; held out to test_unseen "
                 f"{', '.join(DEFAULT_UNSEEN)}. Levels, easiest first: "
                 + ", ".join(level.name for level in LADDER) + "."))
