"""Leaderboard rows from runs: compatibility checks, seed pooling, cost, flags, provenance.

One row is one method configuration (method, preset, model); several runs of it with different
seeds pool into that row. The success interval is the harness's own (``arena.core.storage.stats``): tasks
are the unit of sampling, each task's success averaged over its seeds, a Wilson interval over the
tasks. Pooled seeds thus narrow the per-task noise without passing for extra tasks, and a row of
one run shows exactly the numbers of that run's results.json.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from math import comb
from pathlib import Path
from typing import Any

from arena.core.contract.results import PhaseCost, Summary
from arena.core.contract.settings import Settings
from arena.core.execution.experience_controls import ExperienceSettings
from arena.core.storage import stats
from arena.core.storage.metrics import BF16_AUTOCAST
from arena.report.runs import PRIMARY_VARIANT, ReportError, Run

#: Config keys that may differ between the runs pooled into one row (everything else must match):
#: seeds, and what changes how fast a run goes but not what it computes (how many episodes share
#: a batch, whether prompt states are reused: both exact up to float rounding).
POOLABLE_CONFIG_KEYS = frozenset({"run.seeds", "run.root", "learn.seed", "eval.concurrency",
                                  "llm.prefix_cache", "llm.prefix_cache_entries",
                                  "llm.prefix_cache_tokens",
                                  # how the warm start was named (a recipe, or its built folder
                                  # beside a board): the base itself is the protocol field below
                                  "llm.warmstart"})
#: Config sections that may differ too: where episodes ran changes no result.
POOLABLE_CONFIG_SECTIONS = ("executor.",)
#: Keys added after runs were made, with the value those runs had in effect: a run from before
#: ``solver.layout`` existed laid its prompts out as ``window``.
CONFIG_KEYS_ADDED = {"solver.layout": "window", "solver.admissible_turns": "full",
                     "solver.mode": "choose", "solver.reasoning_max_tokens": 64,
                     "solver.end_at_context_limit": False, "solver.stop_after_action": False,
                     "solver.action_parser": "admissible",
                     "eval.source_pool": "train"}


def _compared(key: str) -> bool:
    return key not in POOLABLE_CONFIG_KEYS and not key.startswith(POOLABLE_CONFIG_SECTIONS)


def compared_config(run: Run) -> dict[str, Any]:
    """A run's config as dotted keys, without the poolable ones, keys added since filled in."""
    config = {**CONFIG_KEYS_ADDED, **_flatten(run.config)}
    return {key: value for key, value in config.items() if _compared(key)}


#: The protocol field naming the test splits a run played (``arena compare --split`` sets it aside).
SPLITS_FIELD = "eval.splits"

SORT_KEYS = ("success", "test_seen", "test_unseen", "progress", "learn_cost", "method")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config as dotted keys (``eval.max_steps``), the names messages use."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


#: The protocol field naming a run's warm-start base: every method on a board starts from one.
WARMSTART_FIELD = "llm.warmstart"
#: Its value for runs on the model as shipped (every run made before warm starts existed).
NO_WARMSTART = "none"
#: The protocol field of a second learning phase (``run.continue_from``): the digest it began from.
CONTINUED_FIELD = "learn.continued_from"
#: What a protocol field a run leaves out means, where it means a value (named in messages).
ABSENT_AS = {WARMSTART_FIELD: NO_WARMSTART}


#: The ``eval.experience`` settings an experiment's arm records, with the protocol's values
#: (a field at its protocol value is left out, as on runs that never record it).
EXPERIENCE_FIELDS: dict[str, Any] = ExperienceSettings().describe()


def warmstart_of(run: Run) -> str:
    """``recipe@adapter-digest`` of the run's warm-start base, or ``none``."""
    warm = run.model.get("warmstart")
    if not warm:
        return NO_WARMSTART
    return f"{warm.get('recipe')}@{str(warm.get('adapter_sha256'))[:12]}"


def protocol_of(run: Run) -> dict[str, Any]:
    """The fields two runs must share to be ranked in one table (flat, named as in messages)."""
    results = run.results
    provenance = results.provenance
    config = run.config
    evaluation = config.get("eval", {})
    # The step limit actually used (eval.max_steps may be null: the environment's own limit).
    max_steps = results.protocol.max_steps
    # Not the results schema's version: it names a file format, and version 2 changed no figure
    # a version 1 file holds (arena/core/contract/results.py), so runs of Arena 0.1 and 0.2 rank together.
    fields: dict[str, Any] = {
        "env_version": provenance.env_version,
        SPLITS_FIELD: list(results.splits),
        "eval.max_steps": max_steps,
        "eval.max_invalid_actions": evaluation.get("max_invalid_actions"),
        "track": results.track,
        "limited": results.limited,
        "eval.limit": evaluation.get("limit"),
        # Which train tasks a method could consult at test time (runs before it: train).
        "eval.source_pool": evaluation.get("source_pool", "train"),
    }
    salt = results.protocol.eval_salt or "public"  # the kind and the draw's digest
    if salt != "public":  # absent otherwise, so boards made before keep their files
        fields["eval.salt"] = salt  # runs of two salts played two different test sets
    warmstart = warmstart_of(run)
    if warmstart != NO_WARMSTART:  # absent otherwise, so boards made before keep their files
        fields[WARMSTART_FIELD] = warmstart
    # A second learning phase (run.continue_from): it learned twice, so it ranks apart.
    continued = results.learn.continued_from
    if continued:
        fields[CONTINUED_FIELD] = continued.get("digest")
    # An experiment's arm (arena experiment): what it changed about the learned experience.
    for name, value in sorted((results.protocol.experience or {}).items()):
        if name in EXPERIENCE_FIELDS and value != EXPERIENCE_FIELDS[name]:
            fields[f"eval.experience.{name}"] = value
    for name, value in sorted(results.protocol.env.items()):
        fields[f"env.{name}"] = value
    for split, digest in sorted(provenance.split_hashes.items()):
        fields[f"split_hashes.{split}"] = digest
    return fields


#: The protocol field of a memory reset (``arena evaluate --state RUN eval.experience.source=none``).
RESET_FIELD = "eval.experience.source"


def is_memory_reset(run: Run) -> bool:
    """A learned state evaluated again with no experience shown (its experience source ``none``,
    nothing else of ``eval.experience`` changed) by ``arena evaluate``: the papers' control for a
    memory method, a row of its own beside the row whose state it reset."""
    experience = {name: value for name, value in (run.results.protocol.experience or {}).items()
                  if name in EXPERIENCE_FIELDS and value != EXPERIENCE_FIELDS[name]}
    return experience == {"source": "none"} and evaluated_from(run) is not None


def evaluated_from(run: Run) -> dict[str, Any] | None:
    """Where ``arena evaluate`` took the run's learned state from (``provenance.evaluated_from``)."""
    made_from = (run.results.provenance.model_extra or {}).get("evaluated_from")
    return made_from if isinstance(made_from, dict) else None


def table_protocol(run: Run) -> dict[str, Any]:
    """:func:`protocol_of` as a table compares it: a memory reset's empty experience is what makes
    it a reset row, not a protocol of its own."""
    fields = protocol_of(run)
    if is_memory_reset(run):
        fields.pop(RESET_FIELD, None)
    return fields


def _show(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64:
        return value[:12]  # a digest
    return str(value)


def differing_fields(runs: list[Run], ignore: Sequence[str] = (),
                     protocol: Callable[[Run], dict[str, Any]] = protocol_of) -> dict[str, dict[str, list[str]]]:
    """Protocol fields (but those in ``ignore``) on which the runs disagree: field -> shown
    value -> run labels. ``protocol``: a run's fields (a table's: :func:`table_protocol`)."""
    protocols = [(run.label, protocol(run)) for run in runs]
    names = sorted({name for _, fields in protocols for name in fields} - set(ignore))
    differing: dict[str, dict[str, list[str]]] = {}
    for name in names:
        by_value: dict[str, list[str]] = defaultdict(list)
        for label, fields in protocols:
            by_value[_show(fields.get(name, ABSENT_AS.get(name, "(absent)")))].append(label)
        if len(by_value) > 1:
            differing[name] = dict(by_value)
    return differing


def describe_differences(differing: dict[str, dict[str, list[str]]]) -> str:
    parts = []
    for name, by_value in differing.items():
        values = "; ".join(f"{value} in {', '.join(labels)}" for value, labels in by_value.items())
        parts.append(f"{name} differs: {values}")
    return "\n".join(parts)


def check_compatible(runs: list[Run], allow_mixed: bool, what: str = "one table",
                     ignore: Sequence[str] = (),
                     protocol: Callable[[Run], dict[str, Any]] = protocol_of) -> list[str]:
    """Names of the differing protocol fields (but those in ``ignore``); raises unless ``allow_mixed``."""
    differing = differing_fields(runs, ignore, protocol)
    if differing and not allow_mixed:
        raise ReportError(
            f"These runs were not evaluated under the same protocol, so they cannot share {what}:\n"
            f"{describe_differences(differing)}\n"
            "Rerun them under one protocol, or pass --allow-mixed to show them anyway "
            "(rows are then flagged with the differing fields)."
        )
    return sorted(differing)


# -- rows -------------------------------------------------------------------------------------


def row_label(method: str, preset: str | None, *, reset: bool) -> str:
    """A row's name as a board prints it: ``grpo (cpu)``, ``rag [memory reset]``."""
    return method + (f" ({preset})" if preset else "") + (" [memory reset]" if reset else "")


@dataclass
class Row:
    """One method configuration on one environment, pooled over its runs' seeds."""

    method: str
    preset: str | None
    model: str
    env: str
    track: str
    runs: list[Run]
    splits: dict[str, dict[str, Any]]
    variants: dict[str, dict[str, dict[str, Any]]]
    cost: dict[str, Any]
    flags: list[str]
    provenance: dict[str, Any]
    valid: bool
    protocol: dict[str, Any]
    learning_curves: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    #: ``arena verify``'s state of the row (:func:`row_verification`); None on a table none of
    #: whose runs was verified, so boards made before verification keep their files.
    verification: dict[str, Any] | None = None
    #: A memory reset row (:func:`is_memory_reset`): the digests of the learned states its runs
    #: evaluated with no experience shown; None for every other row.
    reset_of: list[str] | None = None
    #: split -> k -> pass^k over the row's seeds (:func:`pass_k`); empty for a row of one seed.
    pass_k: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def isolation(self) -> dict[str, Any]:
        """How the row's methods ran (:func:`row_isolation`)."""
        return row_isolation(self.runs)

    @property
    def name(self) -> str:
        return row_label(self.method, self.preset, reset=self.reset_of is not None)

    @property
    def learned_digests(self) -> set[str]:
        """The learned-state digests of the row's runs (what a memory reset names)."""
        return {digest for run in self.runs if (digest := run.results.state.digest_before_eval)}

    @property
    def seeds(self) -> list[int]:
        return sorted(seed for run in self.runs for seed in run.seeds)

    def success(self, split: str) -> float | None:
        summary = self.splits.get(split)
        return None if summary is None else float(summary["success_rate"])

    def mean_over_splits(self, metric: str) -> float:
        values = [float(s[metric]) for s in self.splits.values()]
        return sum(values) / len(values) if values else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method, "preset": self.preset, "model": self.model, "env": self.env,
            "track": self.track, "valid": self.valid, "seeds": self.seeds,
            "runs": [run.label for run in self.runs], "splits": self.splits,
            "variants": self.variants, "cost": self.cost, "flags": self.flags,
            "provenance": self.provenance, "protocol": self.protocol,
            "learning_curves": self.learning_curves, "isolation": self.isolation,
            **({} if self.verification is None else {"verification": self.verification}),
            # Only where they hold something, so boards made before keep their files.
            **({} if self.reset_of is None else {"reset_of": self.reset_of}),
            **({"pass_k": self.pass_k} if self.pass_k else {}),
        }


#: A row's isolation: every run's method in a worker process of its own (``run.isolation=process``),
#: every run in Arena's process, runs from before Arena recorded it (they ran in Arena's process),
#: or a row that pools runs of two of these.
ISOLATED, IN_PROCESS, UNKNOWN_ISOLATION, MIXED_ISOLATION = "process", "in_process", "unknown", "mixed"


def row_isolation(runs: list[Run]) -> dict[str, Any]:
    """The row's isolation mode (``process``, ``in_process``, ``unknown`` or ``mixed``) and each
    run's (results.json's ``provenance.isolation.mode``)."""
    modes = {run.label: run.isolation for run in runs}
    kinds = set(modes.values())
    return {"mode": kinds.pop() if len(kinds) == 1 else MIXED_ISOLATION, "runs": modes}


def unisolated_rows(tables: list[Table]) -> list[tuple[Row, list[str]]]:
    """Each row with a run whose method did not run isolated, and those runs' labels."""
    found = []
    for table in tables:
        for row in table.rows:
            runs = [label for label, mode in row.isolation["runs"].items() if mode != ISOLATED]
            if runs:
                found.append((row, runs))
    return found


#: A row's dtype where no run of it called the model (the random policy), or where the backend
#: records none (a remote or fake model).
NO_MODEL_CALL = "no model call"
NO_DTYPE = "dtype not recorded"
#: Why a row never pools runs of two dtypes, and what to do: said where pooling is refused.
DTYPE_ADVICE = (
    "llm.dtype=auto resolves per machine (bfloat16 where the CPU computes it natively, float32 "
    "elsewhere), and the two round near-tied greedy choices differently (docs/numerics.md)"
)


def dtypes_of(runs: Iterable[Run]) -> dict[str, list[str]]:
    """dtype -> labels of the runs whose model ran in it (runs that record none left out)."""
    by_dtype: dict[str, list[str]] = defaultdict(list)
    for run in runs:
        if run.model_dtype is not None:
            by_dtype[run.model_dtype].append(run.label)
    return dict(by_dtype)


def _check_poolable(runs: list[Run], name: str) -> None:
    """Runs pooled into one row must differ only in seeds, and never repeat a seed. The config
    is compared as written and the model's dtype as it resolved: ``auto`` is no guarantee."""
    by_dtype = dtypes_of(runs)
    if len(by_dtype) > 1:
        shown = "; ".join(f"{dtype} in {', '.join(labels)}" for dtype, labels in sorted(by_dtype.items()))
        raise ReportError(
            f"The runs of row '{name}' ran the model in different dtypes ({shown}): {DTYPE_ADVICE}. "
            "One row pools runs that differ only in their seeds: rerun one side with llm.dtype set "
            "to the other's, or build separate boards for them."
        )
    first = runs[0]
    reference = compared_config(first)
    for other in runs[1:]:
        config = compared_config(other)
        for key in sorted(set(reference) | set(config)):
            if reference.get(key) != config.get(key):
                raise ReportError(
                    f"Runs {first.label} and {other.label} of row '{name}' differ in config "
                    f"{key} ({reference.get(key)!r} vs {config.get(key)!r}); one row pools runs "
                    "that differ only in their seeds. Build separate boards for them."
                )
    owner: dict[int, str] = {}
    for run in runs:
        for seed in run.seeds:
            if seed in owner:
                raise ReportError(
                    f"Seed {seed} of row '{name}' is in both {owner[seed]} and {run.label}; "
                    "a seed counts once. Leave one of them out."
                )
            owner[seed] = run.label


def board_summary(summary: Summary) -> dict[str, Any]:
    """A summary as a board's row holds it: its keys as results.json has them, less its
    ``variants`` (the row holds those apart, under ``variants``)."""
    return summary.model_dump(mode="json", exclude_unset=True, exclude={"variants"})


def pooled_splits(runs: list[Run], variant: str = PRIMARY_VARIANT) -> dict[str, dict[str, Any]]:
    """Per-split summaries (with per-type ones) over every run's episodes of ``variant``."""
    if len(runs) == 1 and variant == PRIMARY_VARIANT:
        return {split: board_summary(summary) for split, summary in runs[0].results.splits.items()}
    splits = runs[0].eval_splits
    records = [r for run in runs for r in run.evaluated(variant)]
    pooled = {}
    for split in splits:
        in_split = [r for r in records if r.split == split]
        if in_split:
            pooled[split] = board_summary(stats.summarise_split(in_split))
    return pooled


def _pooled_variants(runs: list[Run]) -> dict[str, dict[str, dict[str, Any]]]:
    """split -> variant -> summary, for the test-split variants (e.g. ``without_skill``)."""
    names = sorted({v for run in runs for v in run.variants()})
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for name in names:
        if len(runs) == 1:
            for split, summary in runs[0].results.splits.items():
                if name in (summary.variants or {}):
                    out[split][name] = board_summary((summary.variants or {})[name])
            continue
        for split, pooled in pooled_splits(runs, name).items():
            out[split][name] = pooled
    return dict(out)


def _device(run: Run) -> str:
    """GPU when the model ran on CUDA, else CPU: what the run's wall time was spent on."""
    device = str(run.model.get("device", ""))
    if device:
        return "GPU" if device.startswith("cuda") else "CPU"
    machine = run.results.provenance.machine
    return "GPU" if machine.get("cuda") and run.model_id != "arena/fake" else "CPU"


def _extra_test_episodes(run: Run) -> int:
    """Test-time episodes beyond one per (task, seed): helper and variant episodes."""
    played = run.results.cost.evaluate.episodes
    primary = sum(s.n_episodes for s in run.results.splits.values())
    return max(0, played - primary)


def _extra_episode_kinds(run: Run) -> list[str]:
    kinds = set(run.variants())
    for record in run.episodes or []:
        if record.phase == "evaluate" and record.variant != PRIMARY_VARIANT:
            kinds.add(record.variant.split("/", 1)[0])
    return sorted(kinds)


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def row_cost(runs: list[Run]) -> dict[str, Any]:
    """Cost of one run of the row (mean over its runs): what one learning of the method costs."""
    def phase(run: Run, name: str) -> PhaseCost:
        return run.results.cost.learn if name == "learn" else run.results.cost.evaluate

    method_sizes: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for key, value in run.results.state.method.items():
            if isinstance(value, (int, float)):
                method_sizes[key].append(float(value))
    devices = sorted({_device(run) for run in runs})
    return {
        "per": "run (mean over the row's runs)",
        "learn_episodes": _mean(phase(r, "learn").episodes for r in runs),
        "learn_env_steps": _mean(phase(r, "learn").env_steps for r in runs),
        "learn_tokens": _mean(phase(r, "learn").tokens_in + phase(r, "learn").tokens_out for r in runs),
        "learn_gradient_steps": _mean(r.results.learn.used.get("gradient_steps", 0) or 0 for r in runs),
        "eval_tokens": _mean(phase(r, "evaluate").tokens_in + phase(r, "evaluate").tokens_out for r in runs),
        "learn_hours": _mean(phase(r, "learn").wall_s / 3600 for r in runs),
        "eval_hours": _mean(phase(r, "evaluate").wall_s / 3600 for r in runs),
        "device": "+".join(devices),
        "memory_items": _mean(r.results.state.memory_items for r in runs),
        "memory_bytes": _mean(r.results.state.memory_bytes for r in runs),
        "method_state": {k: _mean(v) for k, v in sorted(method_sizes.items())},
        "extra_test_episodes": _mean(_extra_test_episodes(r) for r in runs),
    }


def row_flags(runs: list[Run], mixed: dict[str, Any]) -> list[str]:
    flags = []
    limits = sorted({Settings.of(r.config).eval.limit for r in runs if r.results.limited}, key=str)
    if limits:
        flags.append(f"limited (eval.limit={', '.join(map(str, limits))})")
    if any(r.results.learn.used_valid_split for r in runs):
        flags.append("learned on valid")
    extra = sum(_extra_test_episodes(r) for r in runs)
    if extra:
        kinds = sorted({k for r in runs for k in _extra_episode_kinds(r)})
        flags.append(f"test-time extra episodes: {extra}" + (f" ({', '.join(kinds)})" if kinds else ""))
    if any(r.results.track == "online" for r in runs):
        flags.append("online track")
    invalid = [r for r in runs if not r.results.valid]
    for run in invalid:
        reason = (run.results.violations or ["protocol violation"])[0]
        flags.append(f"INVALID {run.label}: {reason}")
    errored = [r.label for r in runs if r.episodes is not None and r.evaluated()
               and all(e.status == "error" for e in r.evaluated())]
    if errored:
        flags.append(f"every test episode errored: {', '.join(errored)}")
    repaired = [f"{r.label} ({len(r.results.record.damaged_lines)} lines)" for r in runs
                if r.results.record is not None and r.results.record.damaged_lines]
    if repaired:
        flags.append(f"record repaired, damaged lines moved aside and replayed: {', '.join(repaired)}")
    moved = [f"{r.label} (after {', '.join(str(m.episodes) for m in r.results.record.moves)} episodes)"
             for r in runs if r.results.record is not None and r.results.record.moves]
    if moved:  # the lines before a move are checked by their hashes, not their signatures
        flags.append(f"moved to another machine's record key while running: {', '.join(moved)}")
    unchained = [r.label for r in runs if not r.chained]
    if unchained:
        flags.append(f"record not chained (made before Arena chained its records): {', '.join(unchained)}")
    for name, value in mixed.items():
        flags.append(f"mixed: {name}={_show(value)}")
    machines = sorted({_machine(session) for run in runs for session in _sessions(run)})
    if len(machines) > 1:  # float32 kernels round differently by instruction set (docs/numerics.md)
        flags.append(f"ran on {len(machines)} machines: {'; '.join(machines)}")
    precisions = {run.label: update_precisions(run) for run in runs}
    if len(set().union(*precisions.values())) > 1:  # one run, or the row's seeds, trained two ways
        flags.append("policy updates in mixed precision: " + "; ".join(
            f"{label} ({' and '.join(sorted(kinds))})" for label, kinds in precisions.items() if kinds))
    for run in runs:
        learned_at = sorted({str(s.get("git_sha") or s.get("arena_version"))[:12]
                             for s in _sessions(run, "learn")})
        if len(learned_at) > 1:
            flags.append(f"learning spans commits: {run.label} ({', '.join(learned_at)})")
    return flags


def _sessions(run: Run, phase: str | None = None) -> list[dict[str, Any]]:
    """The sessions of a run's phases (``provenance.phases``; none for runs made before it)."""
    phases = run.results.provenance.phases or {}
    return [s for name, sessions in phases.items() if phase in (None, name) for s in sessions]


def _machine(session: dict[str, Any]) -> str:
    cpu = session.get("cpu") or {}
    isa = "+".join(cpu.get("isa") or []) or "unknown instruction set"
    return f"{cpu.get('model', 'unknown CPU')} ({isa})" + (f", {session['gpu']}" if session.get("gpu") else "")


def _short(values: Iterable[Any]) -> list[str]:
    return sorted({_show(v) if v is not None else "unknown" for v in values})


def row_provenance(runs: list[Run]) -> dict[str, Any]:
    provenances = [r.results.provenance for r in runs]
    return {
        "arena_version": _short(p.arena_version for p in provenances),
        "git_sha": sorted({str(p.git_sha)[:12] + ("-dirty" if str(p.git_sha).endswith("-dirty") else "")
                           for p in provenances}),
        "model": _short(p.model.get("id") for p in provenances),
        "dtype": sorted({r.model_dtype or (NO_DTYPE if r.called_model else NO_MODEL_CALL) for r in runs}),
        "weights_sha256": _short(p.model.get("weights_sha256") for p in provenances),
        # Where each phase ran, and at which commit (runs made before Arena recorded it add nothing).
        **({"machines": machines} if (machines := sorted({_machine(s) for r in runs for s in _sessions(r)})) else {}),
        **({"phase_commits": commits} if (commits := phase_commits(runs)) else {}),
        **({"updates": updates} if (updates := sorted({u for r in runs for u in update_precisions(r)})) else {}),
        "seeds": sorted(seed for r in runs for seed in r.seeds),
        "runs": [r.label for r in runs],
    }


def update_precisions(run: Run) -> set[str]:
    """How the run's policy updates computed (its trainer's ``bf16_autocast`` metric: "bf16
    autocast" or "float32"; none for a run that trained no policy, or was made before Arena
    logged it). ``precision: auto`` resolves by device, so two machines can train one config in
    two precisions, a far larger difference than float32 kernels' rounding."""
    return {"bf16 autocast" if entry["metrics"][BF16_AUTOCAST] else "float32" for entry in run.metrics
            if entry["phase"] == "learn" and BF16_AUTOCAST in entry["metrics"]}


def phase_commits(runs: list[Run]) -> dict[str, list[str]]:
    """Phase -> the commits its sessions ran at (12 digits), over the row's runs: a reader sees
    where a row's learning and evaluation ran different code."""
    commits: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        for phase, sessions in (run.results.provenance.phases or {}).items():
            commits[phase].update(str(s.get("git_sha") or s.get("arena_version"))[:12] for s in sessions)
    return {phase: sorted(shas) for phase, shas in commits.items()}


def learning_curves(run: Run) -> dict[str, list[list[float]]]:
    """What the run logged of its learning (``metrics.jsonl``: its success and reward figures per
    step), else a rolling success of its learning episodes."""
    curves: dict[str, list[list[float]]] = {}
    for entry in run.metrics:
        if entry["phase"] != "learn":
            continue
        for name, metric in sorted(entry["metrics"].items()):
            if ("success" in name or "reward" in name) and not isinstance(metric, bool):
                curves.setdefault(f"{run.method}: {name}", []).append([float(entry["step"]), float(metric)])
    if curves:
        return curves
    learned = run.learn_episodes()
    if not learned:
        return {}
    window = max(1, len(learned) // 10)
    rolling = trailing_mean([1.0 if r.success else 0.0 for r in learned], window)
    return {f"learn success (rolling mean of {window})": [[float(i + 1), y] for i, y in enumerate(rolling)]}


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Each value's mean with the ``window - 1`` before it (fewer at the start)."""
    return [_mean(values[max(0, i + 1 - window):i + 1]) for i in range(len(values))]


def task_wins(runs: list[Run], variant: str = PRIMARY_VARIANT) -> dict[str, dict[str, list[bool]]]:
    """split -> task -> the successes of its test episodes of ``variant`` over the runs' seeds:
    what pass^k and the board's paired comparisons (arena.report.learning) are computed from."""
    wins: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for record in run.evaluated(variant):
            wins[record.split][record.task_id].append(bool(record.success))
    return {split: dict(tasks) for split, tasks in wins.items()}


def pass_k(runs: list[Run]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """tau-bench's reliability over the runs' seeds, per split: a task of n seeds with c successes
    gives pass^k = C(c, k) / C(n, k) (k seeds drawn without replacement all succeed), averaged over
    tasks, for k = 1..n; pass^1 is the success rate, pass^n the share of tasks won on every seed.
    Empty below two seeds or without episodes; a split where a task lacks one primary episode per
    seed has none, and a flag (the second value) says so."""
    n = sum(len(run.seeds) for run in runs)
    if n < 2 or any(run.episodes is None for run in runs):
        return {}, []
    reliability, flags = {}, []
    for split, tasks in task_wins(runs).items():
        uneven = sorted({len(outcomes) for outcomes in tasks.values()} - {n})
        if uneven:
            counts = ", ".join(map(str, uneven))
            flags.append(f"no pass^k on {split}: tasks with {counts} episodes, not one per seed ({n})")
            continue
        wins = [sum(outcomes) for outcomes in tasks.values()]
        reliability[split] = {str(k): round(sum(comb(c, k) for c in wins) / comb(n, k) / len(wins), 4)
                              for k in range(1, n + 1)}
    return reliability, flags


def build_row(runs: list[Run], mixed: dict[str, Any]) -> Row:
    first = runs[0]
    reset = is_memory_reset(first)
    name = f"{row_label(first.method, first.preset, reset=reset)} / {first.model_id}"
    _check_poolable(runs, name)
    runs = sorted(runs, key=lambda r: (min(r.seeds, default=0), r.label))
    protocol = protocol_of(first)
    reliability, unreliable = pass_k(runs)
    return Row(
        method=first.method, preset=first.preset, model=first.model_id, env=first.env,
        track=first.results.track, runs=runs,
        splits=pooled_splits(runs), variants=_pooled_variants(runs),
        cost=row_cost(runs), flags=row_flags(runs, mixed) + unreliable, provenance=row_provenance(runs),
        valid=all(r.results.valid for r in runs), protocol=protocol,
        learning_curves={r.label: c for r in runs if (c := learning_curves(r))},
        reset_of=sorted({str(digest) for r in runs if (digest := (evaluated_from(r) or {}).get("digest_before_eval"))})
        if reset else None,
        pass_k=reliability,
    )


def reset_source(rows: list[Row], reset: Row) -> Row | None:
    """The row whose learned states the memory reset row ``reset`` evaluated: one of the same
    method, preset and model holding every state it names; None where no row of the table does."""
    if not reset.reset_of:
        return None
    for row in rows:
        if (row.reset_of is None and (row.method, row.preset, row.model) == (reset.method, reset.preset, reset.model)
                and set(reset.reset_of) <= row.learned_digests):
            return row
    return None


def flag_unmatched_resets(rows: list[Row]) -> None:
    """A memory reset whose learned states no row of the table holds is still shown, but it is
    paired with nothing: its row says so."""
    for row in rows:
        if row.reset_of is not None and reset_source(rows, row) is None:
            sources = sorted({Path(str((evaluated_from(run) or {}).get("run"))).name for run in row.runs})
            row.flags.append(f"memory reset of {', '.join(sources)}, whose learned state no row of this "
                             "table holds: compared with no row")


VERIFIED, UNVERIFIED, NOT_VERIFIED = "verified", "unverified", "not verified"


def row_verification(runs: list[Run]) -> dict[str, Any]:
    """The row's state under ``arena verify``: ``unverified`` if a replay of any of its runs
    differed (or its record failed), ``verified`` if every run replayed exactly, else ``not
    verified`` (never checked, or its learned state could not be restored); with each run's."""
    states = {run.label: run.verification_status for run in runs}
    if UNVERIFIED in states.values():
        status = UNVERIFIED
    elif all(state == VERIFIED for state in states.values()):
        status = VERIFIED
    else:
        status = NOT_VERIFIED
    return {"status": status, "runs": states}


def flag_mixed_dtypes(rows: list[Row]) -> None:
    """Rows of one table may differ in dtype (they are different configurations), but a reader
    comparing them must see it: each row then names its own."""
    own = [sorted(dtypes_of(row.runs)) for row in rows]  # one each at most: rows never mix
    dtypes = sorted({dtype for row_dtypes in own for dtype in row_dtypes})
    if len(dtypes) < 2:
        return
    for row, row_dtypes in zip(rows, own):
        if row_dtypes:
            row.flags.append(f"model in {', '.join(row_dtypes)} (this table mixes {' and '.join(dtypes)})")


# -- tables -----------------------------------------------------------------------------------


@dataclass
class Table:
    """All rows of one environment."""

    env: str
    rows: list[Row]
    mixed_fields: list[str]
    protocol: dict[str, Any]  # the fields every row shares
    sort: str

    @property
    def splits(self) -> list[str]:
        names: list[str] = []
        for row in self.rows:
            names.extend(s for s in row.splits if s not in names)
        return names

    @property
    def task_types(self) -> dict[str, list[str]]:
        types: dict[str, set[str]] = defaultdict(set)
        for row in self.rows:
            for split, summary in row.splits.items():
                types[split].update(summary.get("by_task_type", {}))
        return {split: sorted(types[split]) for split in self.splits}

    def to_json(self) -> dict[str, Any]:
        return {"env": self.env, "sort": self.sort, "mixed_fields": self.mixed_fields,
                "protocol": self.protocol, "rows": [row.to_json() for row in self.rows]}


def sort_rows(rows: list[Row], sort: str) -> list[Row]:
    """Best first by ``sort``; invalid rows always last (they are shown, never ranked)."""
    if sort not in SORT_KEYS:
        raise ReportError(f"Unknown sort '{sort}'. Choose one of: {', '.join(SORT_KEYS)}.")

    def key(row: Row) -> tuple:
        if sort == "method":
            score: float = 0.0
        elif sort == "learn_cost":
            score = float(row.cost["learn_tokens"])
        elif sort == "progress":
            score = -row.mean_over_splits("progress_rate")
        elif sort == "success":
            score = -row.mean_over_splits("success_rate")
        else:
            value = row.success(sort)
            score = 1.0 if value is None else -value
        return (not row.valid, score, row.method, row.preset or "", row.model)

    return sorted(rows, key=key)


def build_tables(runs: list[Run], allow_mixed: bool = False, sort: str = "success") -> list[Table]:
    """One table per environment; refuses incompatible runs in one table unless ``allow_mixed``."""
    if not runs:
        raise ReportError("No runs given: pass one or more run directories.")
    if sort not in SORT_KEYS:
        raise ReportError(f"Unknown sort '{sort}'. Choose one of: {', '.join(SORT_KEYS)}.")
    for run in runs:
        arm = run.results.experiment
        if arm:  # its experience was replaced, poisoned or played elsewhere: not the method's row
            raise ReportError(f"{run.path} is the arm '{arm.get('arm')}' of `arena experiment {arm.get('name')}`: "
                              "an arm is never ranked with runs. Give the experiment's folder (the "
                              f"board shows it as a section), {run.path.parent}, instead.")
    by_env: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_env[run.env].append(run)
    tables = []
    for env, env_runs in sorted(by_env.items()):
        mixed_fields = check_compatible(env_runs, allow_mixed, what=f"the {env} table", protocol=table_protocol)
        groups: dict[tuple, list[Run]] = defaultdict(list)
        for run in env_runs:
            protocol = table_protocol(run)
            mixed_key = tuple((name, _show(protocol.get(name))) for name in mixed_fields)
            # A memory reset never pools with the runs it reset: a row of its own.
            groups[(run.method, run.preset or "", run.model_id, mixed_key, is_memory_reset(run))].append(run)
        rows = [build_row(group, {name: table_protocol(group[0]).get(name) for name in mixed_fields})
                for group in groups.values()]
        flag_mixed_dtypes(rows)
        flag_unmatched_resets(rows)
        if any(run.verification is not None for run in env_runs):
            for row in rows:
                row.verification = row_verification(row.runs)
        shared = {k: v for k, v in table_protocol(env_runs[0]).items() if k not in mixed_fields}
        tables.append(Table(env=env, rows=sort_rows(rows, sort), mixed_fields=mixed_fields,
                            protocol=shared, sort=sort))
    return tables
