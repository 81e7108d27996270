"""Registers the real ALFWorld games through Arena's ``register_envs`` hook, like any plugin.

Importing this module needs neither ``alfworld`` nor its data: building the environment checks
both and says how to get what is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import arena
from arena.core.contract.env import Environment
from arena.envs.alfworld import data
from arena.envs.alfworld.environment import AlfworldEnvironment, engine, require_engine


def build_local(data_dir: str, split_scheme: str, max_steps: int) -> AlfworldEnvironment:
    """The in-process environment (also what each worker process builds; picklable by name)."""
    return AlfworldEnvironment(data_dir, split_scheme=split_scheme, max_steps=max_steps)


def build_worker(data_dir: str, split_scheme: str, max_steps: int) -> AlfworldEnvironment:
    """What each worker process builds: the environment, with TextWorld imported up front so
    that the import (about a second) happens while the worker starts, not in an episode."""
    engine()
    return build_local(data_dir, split_scheme, max_steps)


@dataclass
class AlfworldSettings:
    """The ``env`` section's keys (config.yaml); one left out takes this default."""

    data_dir: str | None = None
    split: str = "type"
    max_steps: int = 50
    workers: int = 0
    recycle_workers_after: int | None = 50


def make_alfworld(cfg: Mapping[str, Any]) -> Environment:
    """Build the environment from the ``env`` config section: check that alfworld is installed
    and every split's games are there, then wrap it in worker processes if ``workers`` > 0.
    Keys missing from ``cfg`` mean: default data folder, type split, 50 steps, in-process."""
    require_engine()
    typed = arena.typed_config(cfg, AlfworldSettings, prefix="env.", ignore=("name",))
    root, source = data.resolve_data_dir(typed.data_dir)
    data.require_data(root, source=source)
    settings: dict[str, Any] = {
        "data_dir": str(root.resolve()),  # workers see the same folder whatever their cwd/env
        "split_scheme": typed.split,
        "max_steps": typed.max_steps,
    }
    local = build_local(**settings)
    if typed.workers < 0:
        raise ValueError(f"env.workers must be 0 (in-process) or more, got {typed.workers}")
    if typed.workers == 0:
        return local
    from arena.core.execution.env_workers import ProcessEnvironment

    return ProcessEnvironment(
        local, functools.partial(build_worker, **settings), workers=typed.workers,
        recycle_after=typed.recycle_workers_after,
    )


@arena.hookimpl
def register_envs(register: Callable[..., None]) -> None:
    register("alfworld", make_alfworld, config=arena.plugin_files(__file__)["config"],
             description=(
                 "Real ALFWorld text games (TextWorld + ALFWorld wrappers, json_2.1.1); Evolving-RL's "
                 "type split by default; needs pip install 'arena[alfworld]' and `arena data alfworld`."))
