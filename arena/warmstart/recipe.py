"""A warm-start recipe: how the shared base is cloned from expert behaviour, declared in YAML.

The recipe is fixed before any test result is seen and is the same for every method on a board;
its digest (every field, canonical JSON) names the base in each run's provenance.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from arena.core.config.compose import ConfigError, load_yaml, to_plain
from arena.core.config.registry import did_you_mean

RECIPES_DIR = Path(__file__).with_name("recipes")


@dataclass(frozen=True)
class LoraShape:
    """The adapter trained on the frozen base weights (peft's LoraConfig fields)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str = "all-linear"


@dataclass(frozen=True)
class Recipe:
    """Behaviour cloning of the model on the environment's expert, train tasks only."""

    name: str
    #: The environment section the demonstrations are played in (``name`` plus its settings,
    #: e.g. ``level``), merged over that environment's own YAML defaults.
    env: dict[str, Any]
    #: Train tasks the expert plays, taken round-robin over task types in the split's order.
    demonstrations: int
    #: Passes over the demonstration steps (one example per step).
    epochs: float
    batch_size: int
    lr: float
    lr_scheduler: str = "constant"
    lora: LoraShape = field(default_factory=LoraShape)
    #: The standard solver's prompt settings the examples are rendered with (the ``solver``
    #: section's keys): the prompts every method's solver shows, so the base learns on them.
    prompt: dict[str, Any] = field(default_factory=dict)
    #: Tokens per example at most (prompt and action).
    max_length: int = 1024
    seed: int = 0

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of every field: two bases are the same recipe only if
        every field is."""
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], source: str) -> Recipe:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"Warm-start recipe {source} has unknown keys {unknown}; known: {sorted(known)}")
        missing = sorted(name for name in ("name", "env", "demonstrations", "epochs", "batch_size", "lr")
                         if name not in data)
        if missing:
            raise ConfigError(f"Warm-start recipe {source} lacks {missing}")
        lora = dict(data.get("lora") or {})
        lora_known = {f.name for f in fields(LoraShape)}
        if set(lora) - lora_known:
            raise ConfigError(f"Warm-start recipe {source}: unknown lora keys {sorted(set(lora) - lora_known)}")
        env = dict(data["env"])
        if "name" not in env:
            raise ConfigError(f"Warm-start recipe {source}: env needs a name (household, babyai, ...)")
        recipe = cls(
            name=str(data["name"]), env=env, demonstrations=int(data["demonstrations"]),
            epochs=float(data["epochs"]), batch_size=int(data["batch_size"]), lr=float(data["lr"]),
            lr_scheduler=str(data.get("lr_scheduler", "constant")),
            lora=LoraShape(r=int(lora.get("r", 16)), alpha=int(lora.get("alpha", 32)),
                           dropout=float(lora.get("dropout", 0.0)),
                           target_modules=str(lora.get("target_modules", "all-linear"))),
            prompt=dict(data.get("prompt") or {}), max_length=int(data.get("max_length", 1024)),
            seed=int(data.get("seed", 0)),
        )
        if recipe.demonstrations < 1 or recipe.epochs <= 0 or recipe.batch_size < 1 or recipe.lr <= 0:
            raise ConfigError(f"Warm-start recipe {source}: demonstrations, epochs, batch_size and lr "
                              "must be positive")
        return recipe


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES_DIR.glob("*.yaml"))


def load_recipe(name_or_path: str) -> Recipe:
    """A recipe by name (``arena/warmstart/recipes/NAME.yaml``) or from a YAML file."""
    path = Path(name_or_path).expanduser()
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = RECIPES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(did_you_mean("warm-start recipe", name_or_path, recipe_names())
                              + " (llm.warmstart takes a recipe name, a recipe .yaml file, or the "
                              "folder of a built warm start)")
    return Recipe.from_mapping(to_plain(load_yaml(path)), str(path))
