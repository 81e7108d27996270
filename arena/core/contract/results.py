"""results.json, typed: the versioned schema every run's results are validated against when
written (``arena run``) and read (``show``, ``compare``, ``leaderboard``).

The models are pydantic's, so the schema is one definition with two uses: validation here and
``docs/results.schema.json`` (written by :func:`json_schema`, checked against the models by a
test) for readers in other languages. Sections whose keys belong to a plugin (the environment's
protocol fields, a method's state sizes, a backend's model description) stay open mappings;
everything the harness writes is closed: a misspelt or unknown key is an error.

Version 2 (Arena 0.2) added nothing a version 1 file lacks except what Arena 0.1 already wrote
in its later releases (``record``, ``protocol.source_pool``, ``provenance.resumed_by``), so both
versions read with the same models, those keys optional.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
#: The committed JSON Schema (regenerate with ``python -m arena.core.contract.results``).
#: The protocol's primary variant of a test episode; the others (e.g. ``without_skill``) are
#: summarised apart, under their split's ``variants``.
PRIMARY_VARIANT = "default"
SCHEMA_FILE = Path(__file__).resolve().parents[3] / "docs" / "results.schema.json"


class ResultsError(ValueError):
    """A results.json that does not match the schema; the message names the file and field."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


Rate = Field(ge=0.0, le=1.0)
Track = Literal["frozen", "online"]
SourcePool = Literal["train", "all_types"]


class Summary(_Closed):
    """Success and more over one split, one task type or one variant."""

    n_tasks: int = Field(ge=0)
    n_episodes: int = Field(ge=0)
    success_rate: float = Rate
    ci95: tuple[float, float]
    progress_rate: float = Rate
    valid_action_rate: float = Rate
    mean_steps: float = Field(ge=0.0)
    status: dict[str, int]
    by_task_type: dict[str, Summary] | None = None
    variants: dict[str, Summary] | None = None


class ProtocolFields(_Closed):
    """What a leaderboard holds equal between the runs it ranks together."""

    max_steps: int = Field(ge=1)
    max_invalid_actions: int = Field(ge=1)
    limit: int | None
    splits: list[str]
    env: dict[str, Any] = Field(default_factory=dict)  # the environment's own (e.g. level)
    source_pool: SourcePool | None = None
    #: Where the test layouts came from (``eval.salt``): ``public``, or ``secret:``/``board:`` and a
    #: digest of the salt (absent in runs before salts: public).
    eval_salt: str | None = None
    #: ``eval.experience`` where it is not the protocol's (an experiment's arm), else absent.
    experience: dict[str, Any] | None = None


class SolverFields(_Closed):
    layout: str
    admissible_turns: str
    mode: str | None = None  # absent in results of Arena 0.1 before the ReAct solver


Budgets = dict[Literal["episodes", "env_steps", "tokens", "gradient_steps"], int | None]


class Learning(_Closed):
    split: str
    splits_used: list[str]
    used_valid_split: bool
    budget: Budgets
    used: dict[Literal["episodes", "env_steps", "tokens", "gradient_steps"], int]
    #: A second learning phase (``run.continue_from``): the run and learned-state digest it
    #: started from, and what that run's learning used. Absent for a run that learned from nothing.
    continued_from: dict[str, Any] | None = None


class PhaseCost(_Closed):
    episodes: int = Field(ge=0)
    copied_episodes: int = Field(default=0, ge=0)
    env_steps: int = Field(ge=0)
    llm_calls: int = Field(ge=0)
    tokens_in: int = Field(ge=0)
    tokens_out: int = Field(ge=0)
    wall_s: float = Field(ge=0.0)


class Cost(_Closed):
    learn: PhaseCost
    evaluate: PhaseCost


class StateFields(_Closed):
    digest_before_eval: str | None
    digest_after_eval: str | None
    memory_items: int = Field(ge=0)
    memory_bytes: int = Field(ge=0)
    method: dict[str, Any]  # the method's own sizes (state_size hook)


class Provenance(BaseModel):
    """Where the numbers came from. Open: ``provenance.collect`` may add facts. The fields are
    declared in the order the harness writes them, so a file reads and writes back unchanged."""

    model_config = ConfigDict(extra="allow")

    arena_version: str
    git_sha: str | None
    packages: dict[str, str | None]
    machine: dict[str, Any]
    #: How the method ran: ``mode`` (``process`` or ``in_process``), and a worker's sandbox and
    #: restarts (absent in runs before Arena recorded it).
    isolation: dict[str, Any] | None = None
    env_version: str
    split_hashes: dict[str, str]
    model: dict[str, Any]
    #: Versions that resumed this run after the one that started it (--allow-version-change).
    resumed_by: list[dict[str, Any]] = Field(default_factory=list)
    #: Each phase's sessions: commit, CPU model and instruction set (GPU), so a row whose learning
    #: spans commits or machines says so (absent in runs before Arena recorded it).
    phases: dict[str, list[dict[str, Any]]] | None = None
    embedder: dict[str, Any]
    config: dict[str, Any]


class RecordMove(_Closed):
    """The run was resumed on another machine (``arena run --resume DIR --move-here``): the
    record's lines up to ``after`` are signed by a key this machine does not hold, so they are
    checked by their hashes alone; the lines after it carry ``to_key_id``'s MACs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    from_key_id: str | None
    to_key_id: str | None
    #: The chain's head when it moved (the hash of its last line; GENESIS for an empty record).
    after: str
    #: Episode lines on record when it moved.
    episodes: int
    at: str


def signed_after(moves: Sequence[RecordMove]) -> str | None:
    """The chain hash after which the record key in use signs the lines: the last move's point,
    None where the run never moved (its one key signs every line)."""
    return moves[-1].after if moves else None


class Record(_Closed):
    """The chain of episodes.jsonl as the run left it (``arena.core.storage.integrity``)."""

    episodes: int = Field(ge=0)
    head: str
    key_id: str | None
    damaged_lines: list[Any] = Field(default_factory=list)
    breaks: list[Any] = Field(default_factory=list)
    #: The run's moves to another machine (``--resume DIR --move-here``): each names the key that
    #: signed the lines before it, the line it moved after (``after``, a chain hash) and when; a
    #: reader holding ``key_id`` checks MACs only after the last move.
    moves: list[RecordMove] = Field(default_factory=list)


class Results(_Closed):
    """One run's results.json."""

    schema_version: int
    method: str
    env: str
    track: Track
    valid: bool
    violations: list[str]
    seeds: list[int]
    limited: bool
    protocol: ProtocolFields
    solver: SolverFields
    splits: dict[str, Summary]
    learn: Learning
    cost: Cost
    state: StateFields
    provenance: Provenance
    record: Record | None = None
    #: An experiment's arm (``arena experiment``): its name, arm, source run and what changed.
    experiment: dict[str, Any] | None = None
    #: What the method exports (its ``export`` hook): item counts by kind, or None: nothing.
    exported: dict[str, int] | None = None
    started: str | None
    finished: str

    def to_json(self) -> dict[str, Any]:
        """results.json's object: every key that was set, none that was not (an optional key a
        run never wrote stays absent), so a file reads and writes back as it was."""
        return self.model_dump(mode="json", exclude_unset=True)

    def with_violations(self, added: list[str]) -> Results:
        """These results with ``added`` violations too, and so invalid (what a report shows of a
        run whose record lists violations its results.json does not)."""
        return self.model_copy(update={"valid": False, "violations": [*self.violations, *added]})


def validate(data: Any, where: str = "results.json") -> Results:
    """``data`` as :class:`Results`, or a :class:`ResultsError` naming ``where`` and each field."""
    if not isinstance(data, dict):
        raise ResultsError(f"{where} is not an Arena results file (a JSON object is expected).")
    version = data.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise ResultsError(f"{where} has schema_version {version!r}; this Arena reads versions "
                           f"{', '.join(map(str, READABLE_VERSIONS))}. Use the Arena that wrote it.")
    try:
        return Results.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
                             for error in exc.errors()[:5])
        more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
        raise ResultsError(f"{where} does not match the results schema: {problems}{more}.") from exc


def json_schema() -> dict[str, Any]:
    """The JSON Schema of results.json (what ``docs/results.schema.json`` holds)."""
    schema = Results.model_json_schema()
    schema["$id"] = "https://arena.invalid/results.schema.json"
    schema["title"] = f"Arena results.json (schema_version {SCHEMA_VERSION})"
    return schema


def render_schema() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(render_schema())
    print(f"wrote {SCHEMA_FILE}")
