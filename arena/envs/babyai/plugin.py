"""Registers BabyAI-Text through Arena's ``register_envs`` hook, like any plugin."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import arena
from arena.envs.babyai.levels import DEFAULT_SEEN, DEFAULT_UNSEEN, LADDER


def make_babyai(cfg: Mapping[str, Any]) -> Any:
    """Build the environment from the ``env`` config section (minigrid is imported here, when a
    run asks for the environment, not when plugins are listed)."""
    from arena.envs.babyai.environment import BabyAIEnvironment

    return BabyAIEnvironment(
        seed=int(cfg.get("seed", 0)),
        n_train=int(cfg.get("n_train", 1000)),
        n_valid=int(cfg.get("n_valid", 100)),
        n_test=int(cfg.get("n_test", 100)),
        seen_levels=tuple(str(name) for name in cfg.get("seen_levels", DEFAULT_SEEN)),
        unseen_levels=tuple(str(name) for name in cfg.get("unseen_levels", DEFAULT_UNSEEN)),
        recolour=bool(cfg.get("recolour", False)),
    )


@arena.hookimpl
def register_envs(register: Callable[..., None]) -> None:
    register(
        "babyai",
        make_babyai,
        config=Path(__file__).with_name("config.yaml"),
        description=(
            "BabyAI-Text on minigrid: the agent's view in words, six commands, minigrid's bot "
            f"as expert. Seen levels {', '.join(DEFAULT_SEEN)}; held out to test_unseen "
            f"{', '.join(DEFAULT_UNSEEN)}. Levels, easiest first: "
            + ", ".join(level.name for level in LADDER) + "."
        ),
    )
