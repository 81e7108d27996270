"""Registers the household world through Arena's ``register_envs`` hook, like any plugin."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import arena
from arena.envs.household.environment import HouseholdEnvironment


def make_household(cfg: Mapping[str, Any]) -> HouseholdEnvironment:
    """Build the environment from the ``env`` config section (other keys there are ignored)."""
    defaults = HouseholdEnvironment()
    return HouseholdEnvironment(
        seed=int(cfg.get("seed", defaults.seed)),
        n_train=int(cfg.get("n_train", defaults.sizes["train"])),
        n_valid=int(cfg.get("n_valid", defaults.sizes["valid"])),
        n_test=int(cfg.get("n_test", defaults.sizes["test_seen"])),
        level=str(cfg.get("level", defaults.level)),
        dialect=str(cfg.get("dialect", defaults.dialect)),
    )


@arena.hookimpl
def register_envs(register: Callable[..., None]) -> None:
    register(
        "household",
        make_household,
        config=Path(__file__).with_name("config.yaml"),
        description=(
            "Embedded ALFWorld-like household world: seeded rooms, ALFWorld's commands and "
            "replies, six task types (pick_two and look_at held out to test_unseen), an expert."
        ),
    )
