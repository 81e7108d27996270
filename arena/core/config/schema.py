"""Checks of a composed run config before anything is created: unknown keys and bad values.

Every key a user sets (a ``key=value`` override or a ``--config`` file) must exist in the
defaults the run composes (the harness's YAML, the environment's, the backend's, the method's
and its preset: every plugin declares its keys in its own YAML), or sit under a key whose default
is ``null`` or ``{}`` (a free-form section, e.g. ``method.teacher.llm``). A misspelt key is an
error with a did-you-mean. The harness's own keys also have types and ranges (:data:`RULES`);
the environment, backend and method check theirs when they are built.

OmegaConf's structured configs would check types too, but every plugin's YAML would then need a
dataclass beside it; this keeps the YAML the single declaration and checks against it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from arena.core.contract.settings import SOURCES
from arena.core.storage.trackers import TRACKER_NAMES


class ConfigValueError(ValueError):
    """A config key has a value outside what it accepts; the message names key and values."""


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; a leaf is any non-mapping value or an empty mapping."""
    if isinstance(data, DictConfig):
        data = OmegaConf.to_container(data, resolve=False)
    flat: dict[str, Any] = {}
    if isinstance(data, dict) and (data or not prefix):
        for key, value in data.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    flat[prefix[:-1]] = data
    return flat


#: Sections whose keys their own builder checks (the embedder's options depend on its name).
OWN_CHECKS = ("embedder",)


def unknown_keys(user: Any, defaults: Any, free_sections: tuple[str, ...] = ()) -> list[str]:
    """Messages for the keys of ``user`` that ``defaults`` does not declare (keys under
    ``free_sections`` are not checked: e.g. the ``method`` section of a plugin without YAML)."""
    known = flatten(defaults)
    free = {key for key, value in known.items() if value is None or value == {}}
    sections = {key.rsplit(".", i)[0] for key in known for i in range(1, key.count(".") + 1)}
    messages = []
    for key in flatten(user):
        if key in known or key in sections:
            continue
        if any(key.startswith(prefix + ".") for prefix in (*free, *OWN_CHECKS, *free_sections)):
            continue
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
        if not close:  # the right name in the wrong section: seeds -> run.seeds
            last = key.rsplit(".", 1)[-1]
            close = sorted(k for k in known if k.rsplit(".", 1)[-1] == last)[:1]
        hint = f" Did you mean '{close[0]}'?" if close else ""
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        siblings = sorted(k.rsplit(".", 1)[1] for k in known if k.rsplit(".", 1)[0] == parent and "." in k)
        listed = f" Keys of '{parent}': {', '.join(siblings)}." if parent and siblings and not close else ""
        messages.append(f"Unknown config key '{key}'.{hint}{listed}")
    return messages


def _kind(value: Any) -> str | None:
    """The kind of a declared default that a user's value must keep (None: any)."""
    if value is None or isinstance(value, (bool, str)):
        return None if value is None else "a single value"  # 'auto' | true | false keys exist
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return None


def _is_kind(value: Any, kind: str) -> bool:
    return {"a single value": lambda v: not isinstance(v, (list, dict)),
            "a number": _number,
            "a list": lambda v: isinstance(v, list),
            "a mapping": lambda v: isinstance(v, dict)}[kind](value)


def kind_mismatches(user: Any, defaults: Any) -> list[str]:
    """Messages for the keys of ``user`` whose values are not of their declared default's kind
    (``null`` is always accepted; the harness's own keys are left to :data:`RULES`)."""
    known = flatten(defaults)
    messages = []
    for key, value in flatten(user).items():
        if key in RULES or key not in known or value is None:
            continue
        kind = _kind(known[key])
        if kind is not None and not _is_kind(value, kind):
            messages.append(f"{key}={value!r} is not {kind} (its default is {known[key]!r}); "
                            f"set {key}=<{kind}>.")
    return messages


@dataclass(frozen=True)
class Rule:
    """What one harness key accepts."""

    check: Callable[[Any], bool]
    accepts: str  # in words, for the message
    choices: tuple[str, ...] = ()  # named values, for a did-you-mean


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(float(value)))


def integer(low: int, high: int, nullable: bool = False) -> Rule:
    words = f"an integer from {low} to {high}" + (" (or null)" if nullable else "")
    return Rule(lambda v: (nullable and v is None) or (_integer(v) and low <= v <= high), words)


def number(low: float, high: float, low_open: bool = False) -> Rule:
    bracket = "(" if low_open else "["
    return Rule(lambda v: _number(v) and (low < v if low_open else low <= v) and v <= high,
                f"a number in {bracket}{low}, {high}]")


def choice(*values: str) -> Rule:
    return Rule(lambda v: v in values, "one of " + ", ".join(values), values)


def boolean() -> Rule:
    return Rule(lambda v: isinstance(v, bool), "true or false")


def text() -> Rule:
    return Rule(lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string")


def int_list(low: int, high: int) -> Rule:
    return Rule(lambda v: isinstance(v, list) and bool(v) and all(_integer(x) and low <= x <= high for x in v),
                f"a non-empty list of integers from {low} to {high}, e.g. [0,1,2]")


def split_list(*splits: str) -> Rule:
    return Rule(lambda v: isinstance(v, list) and bool(v) and all(x in splits for x in v),
                f"a non-empty list of {', '.join(splits)}")


#: Far beyond any episode of either environment, near enough to refuse a typo'd 10**20.
MAX_STEPS = 10_000
BIG = 10**12
RULES: dict[str, Rule] = {
    "run.seeds": int_list(0, 2**31 - 1),
    "run.track": choice("frozen", "online"),
    "run.root": text(),
    "run.isolation": choice("in_process", "process"),
    "run.isolation_limits.hook_seconds": Rule(
        lambda v: v is None or (_number(v) and 0 < float(v) <= BIG), "null or a number of seconds > 0"),
    "run.isolation_limits.memory_mb": integer(64, BIG, nullable=True),
    "run.isolation_limits.landlock": boolean(),
    "run.continue_from": Rule(lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
                              "null or the folder of a finished run of the same method"),
    "learn.budget.episodes": integer(0, BIG, nullable=True),
    "learn.budget.env_steps": integer(0, BIG, nullable=True),
    "learn.budget.tokens": integer(0, BIG, nullable=True),
    "learn.budget.gradient_steps": integer(0, BIG, nullable=True),
    "learn.split": choice("train", "valid"),
    "learn.seed": integer(0, 2**31 - 1),
    "learn.max_steps": integer(1, MAX_STEPS, nullable=True),
    "learn.sampling.temperature": number(0.0, 10.0),
    "learn.sampling.top_p": number(0.0, 1.0, low_open=True),
    "eval.splits": split_list("test_seen", "test_unseen"),
    "eval.limit": integer(1, BIG, nullable=True),
    "eval.max_steps": integer(1, MAX_STEPS, nullable=True),
    "eval.source_pool": choice("train", "all_types"),
    "eval.salt": Rule(lambda v: isinstance(v, str) and len(v) >= 1, "auto, public, secret or a board's own string"),
    "eval.experience.source": choice(*SOURCES),
    "eval.experience.poison": Rule(lambda v: _number(v) and 0.0 <= float(v) < 1.0, "a share in [0, 1)"),
    "eval.max_invalid_actions": integer(1, MAX_STEPS),
    "eval.concurrency": integer(1, 1024),
    "eval.sampling.temperature": number(0.0, 10.0),
    "eval.sampling.top_p": number(0.0, 1.0, low_open=True),
    "solver.layout": choice("window", "transcript"),
    "solver.history": integer(0, MAX_STEPS),
    "solver.show_admissible": boolean(),
    "solver.admissible_turns": choice("full", "changes"),
    "solver.mode": choice("choose", "react"),
    "solver.reasoning_max_tokens": integer(1, 32_768),
    "solver.end_at_context_limit": boolean(),
    "solver.stop_after_action": boolean(),
    "solver.action_parser": choice("admissible", "first_tag"),
    "solver.max_experiences": integer(0, 1_000),
    "solver.max_experience_chars": integer(1, BIG, nullable=True),
    "llm.backend": text(),
    "embedder.name": text(),
    "store.collection": Rule(lambda v: isinstance(v, str) and 3 <= len(v) <= 63,
                             "a name of 3 to 63 characters"),
    "env.name": text(),
    "logging.trackers": Rule(lambda v: isinstance(v, list) and all(x in TRACKER_NAMES for x in v)
                             and len(set(v)) == len(v),
                             "a list of distinct trackers from " + ", ".join(TRACKER_NAMES), TRACKER_NAMES),
    "logging.project": text(),
}


def bad_values(cfg: DictConfig) -> list[str]:
    """Messages for the harness keys of ``cfg`` whose values :data:`RULES` refuse."""
    messages = []
    for key, rule in RULES.items():
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=True)
        except Exception:  # any unresolvable value is reported the same way
            messages.append(f"{key} has no value; set {key}=<{rule.accepts}>.")
            continue
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        if not rule.check(value):
            close = difflib.get_close_matches(str(value), rule.choices, n=1, cutoff=0.6)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            messages.append(f"{key}={value!r} is not {rule.accepts}.{hint} Set {key}=<{rule.accepts}>.")
    return messages
