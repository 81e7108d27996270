"""``llm.warmstart: auto``: the warm-start base committed beside a board (``leaderboards/<board>/base/``)
whose manifest names this run's world and base model, so that the default run starts from it.

Nothing is built here: a world and model with no committed base run the model as shipped
(``llm.warmstart`` null in the run's config.yaml). ``ARENA_WARM_BASES`` (folders separated by
``:``) searches other folders of built bases instead, each holding ``<name>/manifest.json``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import arena

#: The checkout's boards; a base is the ``base/`` folder of one (absent from a wheel install).
BOARDS = Path(__file__).resolve().parents[2] / "leaderboards"
SEARCH_VARIABLE = "ARENA_WARM_BASES"


def candidate_folders() -> list[Path]:
    """Every built base on the search path: ``ARENA_WARM_BASES``'s folders, else the boards'."""
    listed = os.environ.get(SEARCH_VARIABLE)
    if listed is not None:
        return sorted(path.parent for root in listed.split(":") if root
                      for path in Path(root).glob("*/manifest.json"))
    return sorted(path.parent for path in BOARDS.glob("*/base/manifest.json"))


@functools.cache
def model_digest(model: str) -> str | None:
    """The base-model identity a warm start's manifest records (``base_weights_sha256``) for
    ``llm.model``; None for the tiny test model, which no base is built on, and for a model that
    is not installed (the backend says how to install it when the run builds it)."""
    from arena.backends.embedded import packaged_gguf
    from arena.core.config.compose import ConfigError
    from arena.core.host.cache import file_sha256
    from arena.warmstart.build import base_weights_digest

    if model == "embedded":
        try:
            return file_sha256(packaged_gguf())
        except (ModuleNotFoundError, FileNotFoundError):
            return None
    folder = Path(model).expanduser()
    try:
        return base_weights_digest(folder) if folder.is_dir() else None
    except ConfigError:  # no weights there: the backend names the fix when the run builds it
        return None


def matching(env: Mapping[str, Any], digest: str, folders: list[Path]) -> list[Path]:
    """The bases built on this model whose world (every key of the manifest's ``env``) is the run's."""
    found = []
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        world = manifest.get("env") or {}
        if manifest.get("base_weights_sha256") == digest and world and \
                all(env.get(key) == value for key, value in world.items()):
            found.append(folder)
    return found


@arena.hookimpl
def warm_start_for(env: Mapping[str, Any], llm: Mapping[str, Any]) -> str | None:
    if llm.get("backend") != "transformers":
        return None
    folders = candidate_folders()
    digest = model_digest(str(llm.get("model"))) if folders else None
    if digest is None:
        return None
    found = matching(env, digest, folders)
    if len(found) > 1:
        from arena.core.config.compose import ConfigError

        raise ConfigError(
            f"llm.warmstart=auto: {len(found)} built bases fit this world and model "
            f"({', '.join(map(str, found))}); name one with llm.warmstart=FOLDER.")
    return str(found[0]) if found else None
