"""Registers the household world through Arena's ``register_envs`` hook, like any plugin."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import arena
from arena.envs.household.environment import HouseholdEnvironment


@dataclass
class HouseholdSettings:
    """The ``env`` section's keys (config.yaml); one left out is the world's own default."""

    seed: int | None = None
    n_train: int | None = None
    n_valid: int | None = None
    n_test: int | None = None
    level: str | None = None
    dialect: str | None = None


def make_household(cfg: Mapping[str, Any]) -> HouseholdEnvironment:
    """Build the environment from the ``env`` config section."""
    settings = arena.typed_config(cfg, HouseholdSettings, prefix="env.", ignore=("name",))
    return HouseholdEnvironment(**{key: value for key, value in dataclasses.asdict(settings).items()
                                   if value is not None})


@arena.hookimpl
def register_envs(register: Callable[..., None]) -> None:
    register("household", make_household, config=arena.plugin_files(__file__)["config"],
             description=(
                 "Embedded ALFWorld-like household world: seeded rooms, ALFWorld's commands and "
                 "replies, six task types (pick_two and look_at held out to test_unseen), an expert."))
