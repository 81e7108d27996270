"""The harness's own config sections, typed: one settings object per section, built once.

The YAML (``arena/core/configs/defaults.yaml``) stays the one list of the harness's keys and their
defaults, and :mod:`arena.core.config.schema` checks the values a user sets (ranges, choices); these
dataclasses say each key's type, so the harness reads ``settings.eval.concurrency`` as an int
instead of casting ``int(cfg.eval.concurrency)`` at every use. A default here is only for a key
that configs written by an earlier Arena lack (a resumed or reported old run); a test holds each
such default equal to the YAML's.

Sections a plugin owns (``env``, ``llm``, ``embedder``, ``method``) are typed by their plugin;
only the harness's keys of them (their names) are here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf

from arena.core.contract.method_config import typed_config

S = TypeVar("S", bound="Section")


class Section:
    """A typed config section: :meth:`from_config` types one as configured."""

    @classmethod
    def from_config(cls: type[S], section: DictConfig | Mapping[str, Any] | None) -> S:
        """``section`` (of a composed or stored config; None: absent, every default) typed:
        keys another version wrote are left out (composing refuses unknown keys), ``"3"``
        becomes 3 for an int, ``"abc"`` is refused."""
        return typed_config(section or {}, cls, prefix="", ignore=(), others=True)


@dataclass
class Sampling(Section):
    temperature: float = 0.0
    top_p: float = 1.0

    def as_mapping(self) -> dict[str, float]:
        """The decoding settings as the solver and ``EpisodeRequest.sampling`` take them."""
        return {"temperature": self.temperature, "top_p": self.top_p}


@dataclass
class IsolationLimits(Section):
    hook_seconds: float | None = None
    memory_mb: int | None = None
    landlock: bool = True


@dataclass
class RunSettings(Section):
    seeds: list[int]
    root: str
    track: str
    isolation: str = "in_process"  # absent before process isolation
    isolation_limits: IsolationLimits = field(default_factory=IsolationLimits)
    continue_from: str | None = None


@dataclass
class LearningBudget(Section):
    episodes: int | None = None
    env_steps: int | None = None
    tokens: int | None = None
    gradient_steps: int | None = None

    def limits(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)


@dataclass
class LearnSettings(Section):
    budget: LearningBudget
    split: str
    seed: int
    max_steps: int | None = None
    sampling: Sampling = field(default_factory=Sampling)


#: Whose experience an evaluation episode is given (``eval.experience.source``).
OWN, OTHER_TYPE, NONE = "own", "other_type", "none"
SOURCES = (OWN, OTHER_TYPE, NONE)


@dataclass
class ExperienceSettings(Section):
    """``eval.experience`` (:mod:`arena.core.execution.experience_controls`): the protocol's default is the
    method's own experience and no poison."""

    source: str = "own"
    poison: float = 0.0

    def is_protocol(self) -> bool:
        return self.source == "own" and self.poison == 0.0

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "poison": self.poison}


@dataclass
class EvalSettings(Section):
    splits: list[str]
    limit: int | None
    max_invalid_actions: int
    concurrency: int
    salt: str = "auto"  # absent before salts
    max_steps: int | None = None
    source_pool: str = "train"  # absent before the source pool
    experience: ExperienceSettings = field(default_factory=ExperienceSettings)
    sampling: Sampling = field(default_factory=Sampling)


@dataclass
class SolverSettings(Section):
    layout: str = "window"
    history: int = 2
    show_admissible: bool = True
    admissible_turns: str = "full"
    reasoning_max_tokens: int = 64
    max_experiences: int = 4
    max_experience_chars: int | None = 800
    mode: str = "choose"  # absent before the ReAct solver
    end_at_context_limit: bool = False  # absent before Evolving-RL's episode ends
    stop_after_action: bool = False
    action_parser: str = "admissible"


@dataclass
class StoreSettings(Section):
    collection: str = "experiences"


@dataclass
class LoggingSettings(Section):
    trackers: list[str] = field(default_factory=list)
    project: str = "arena"


@dataclass
class RaySettings(Section):
    address: str | None = None
    num_cpus: int | None = None
    actors: int | None = None
    actor_cpus: float = 1.0
    call_timeout_s: float = 600.0


@dataclass
class ExecutorSettings(Section):
    name: str = "local"
    ray: RaySettings = field(default_factory=RaySettings)


@dataclass
class Named(Section):
    """The harness's one key of a plugin's section (``env``, ``method``): which plugin."""

    name: str


@dataclass
class EmbedderChoice(Section):
    name: str = "minilm"


@dataclass
class BackendChoice(Section):
    """``llm.backend``; the backend plugin types the rest of the ``llm`` section."""

    backend: str


@dataclass
class Settings:
    """Every harness section of a composed (or stored) run config."""

    run: RunSettings
    learn: LearnSettings
    eval: EvalSettings
    solver: SolverSettings
    env: Named
    method: Named
    llm: BackendChoice
    embedder: EmbedderChoice
    store: StoreSettings = field(default_factory=StoreSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    executor: ExecutorSettings = field(default_factory=ExecutorSettings)

    @classmethod
    def of(cls, cfg: DictConfig | ListConfig | Mapping[str, Any]) -> Settings:
        """The settings of ``cfg`` (values already checked by :mod:`arena.core.config.schema` when
        composed); keys of a plugin's section other than its name are left to the plugin."""
        plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, (DictConfig, ListConfig)) else cfg
        if not isinstance(plain, Mapping):
            raise TypeError(f"A run's config is a mapping of sections, not {type(plain).__name__}.")
        return cls(run=RunSettings.from_config(plain.get("run")),
                   learn=LearnSettings.from_config(plain.get("learn")),
                   eval=EvalSettings.from_config(plain.get("eval")),
                   solver=SolverSettings.from_config(plain.get("solver")),
                   env=Named.from_config(plain.get("env")), method=Named.from_config(plain.get("method")),
                   llm=BackendChoice.from_config(plain.get("llm")),
                   embedder=EmbedderChoice.from_config(plain.get("embedder")),
                   store=StoreSettings.from_config(plain.get("store")),
                   logging=LoggingSettings.from_config(plain.get("logging")),
                   executor=ExecutorSettings.from_config(plain.get("executor")))

