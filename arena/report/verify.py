"""``arena verify RUN_DIR``: re-play a finished run's frozen evaluation and compare.

A run's record says what its method did; this checks that the method, restored from the learned
state the run left on disk, does it again. The replay is a new run directory (a temporary folder)
holding the run's own config.yaml, its harness state at the end of learning (state.json without
what evaluation added), its store/ and method/ folders and its learning records (sealed again
with this machine's key); ``arena run --resume`` of that folder, in a fresh Python process, skips
learning (``learn_done``), builds the method anew from those files, checks that it hashes to the
digest learning ended with, and plays every planned (task, seed, variant) again. Every credited
episode of the run's episodes.jsonl is then compared with the replay's: outcome, steps, actions
and observations (a digest of the played episode), experiences shown.

Outcomes (:data:`VERIFIED`, :data:`UNVERIFIED`, :data:`UNVERIFIABLE`) are written to the run's
``verification.json``, beside the signed record and never inside it. docs/security.md says what
this stops and what it cannot.

A board's committed run keeps its small files only (no trajectories.jsonl, no learned state). It
re-verifies where it sits once its learned state (``store/``, ``method/``, kept by whoever made
the run) is put back beside them, or right away for a method that learns nothing: the replay must
hash to the ``digest_before_eval`` the committed state.json holds, and each episode's outcome is
compared (its actions and observations only where trajectories.jsonl was kept).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

import arena
from arena.core.contract.results import Results
from arena.core.contract.settings import Settings
from arena.core.contract.types import EpisodeResult, Task, Termination, Trajectory
from arena.core.execution.salt import SALT_FILE
from arena.core.host import provenance
from arena.core.protocol.continuation import LEARNED_STATE, links_in_learned_state
from arena.core.storage.ledger import Ledger
from arena.core.storage.rundir import (
    CONFIG,
    EPISODES,
    RESULTS,
    TRAJECTORIES,
    RunDir,
    RunDirError,
    read_json,
    read_jsonl,
    read_results,
)
from arena.report.runs import ReportError, load_run
from arena.report.verification import (
    EXIT_CODES,
    UNVERIFIABLE,
    UNVERIFIED,
    VERIFIED,
    VerifyError,
    write_verification,
)

#: The harness's message when a resumed method does not hash to the state learning ended with
#: (``Session._evaluate``): the learned state could not be restored.
NOT_RESTORED = "The method's state on resume differs from the state learning ended with"
#: Fields of an episode's record compared with the replay's (costs and clocks are not).
COMPARED_FIELDS = ("status", "success", "steps", "valid_actions", "reward", "progress",
                   "experience_ids", "copy_of")
#: Said where the run kept no trajectories.jsonl (a board's committed run).
OUTCOMES_ONLY = ("outcomes compared, not actions: the run keeps no trajectories.jsonl (a board's "
                 "committed run), so each episode's status, success, steps, valid actions, reward, "
                 "progress and experiences shown were compared, not what was played step by step")
#: At most this many differing episodes are listed in verification.json (all are counted).
MAX_LISTED = 200
EVALUATE = "evaluate"


@dataclass
class Verification:
    """What ``arena verify`` found; ``verification.json`` is :meth:`to_json`."""

    status: str
    reason: str
    compared: int = 0
    differing: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    replay: dict[str, Any] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return self.status == VERIFIED

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_json(self, record_head: str | None) -> dict[str, Any]:
        return {
            "verified": self.verified,
            "status": self.status,
            "reason": self.reason,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "arena_version": arena.__version__,
            "git_sha": provenance.git_sha(),
            # The record this verification is of: a board ignores it beside any other record.
            "record_head": record_head,
            "episodes_compared": self.compared,
            "episodes_differing": len(self.differing),
            "differing": self.differing[:MAX_LISTED],
            "notes": self.notes,
            "replay": self.replay,
        }


# -- building the replay ------------------------------------------------------------------------


def trajectories_by_key(path: Path) -> dict[tuple, dict[str, Any]]:
    return {tuple(line.pop("key")): line for line in read_jsonl(path / TRAJECTORIES, repair=False)}


def prepare_replay(run_path: Path, replay: Path, results: Results,
                   records: list[EpisodeResult], trajectories: dict[tuple, dict[str, Any]],
                   same_test_draw: bool = True) -> None:
    """A run directory at ``replay`` that ``arena run --resume`` continues from the end of the
    run's learning: its config, its harness state as learning left it, its learned state and
    its learning records (and its secret test draw, unless ``same_test_draw`` is False)."""
    state = Ledger(run_path).read()
    if not state.learn_done or not state.digest_before_eval:
        raise VerifyError(f"{Ledger(run_path).path} does not record the end of learning (learn_done and "
                          "the digest evaluation started from): there is no learned state to "
                          "replay from.")
    if results.track != "frozen":
        raise VerifyError(f"{run_path} ran the {results.track} track: its method updated after "
                          "each test episode, so its evaluation cannot be replayed from the state "
                          "learning ended with. Only frozen evaluations are verified.")
    linked = links_in_learned_state(run_path)
    if linked:
        raise VerifyError(f"{run_path}'s learned state holds symbolic links ({', '.join(linked[:3])}): a "
                          "learned state is the run's own files, and a copy would bring in what they "
                          "point to. Submit the run without links.")
    replay.mkdir(parents=True, exist_ok=True)
    shutil.copy2(run_path / CONFIG, replay / CONFIG)
    if same_test_draw and (run_path / SALT_FILE).is_file():  # the same secret test draw
        shutil.copy2(run_path / SALT_FILE, replay / SALT_FILE)
    # What evaluation added (or a repair, a resume) is not kept, nor the run's violations: they
    # belong to its own record (violations.jsonl), which the replay does not copy. A run that
    # poisoned nothing records no poison; a change of model still to rebase is planted (a
    # finished run's was rebased before it played).
    poisons = Settings.of(OmegaConf.load(run_path / CONFIG)).eval.experience.poison > 0
    Ledger(replay).made_from(state.learned_part(keep_poison=poisons))
    for name in LEARNED_STATE:
        if (run_path / name).is_dir():
            shutil.copytree(run_path / name, replay / name)
    directory = RunDir(replay)
    kept_trajectories = (run_path / TRAJECTORIES).is_file()
    for record in records:
        if record.phase == EVALUATE:
            continue
        trajectory = trajectories.get(record.key)
        if trajectory is None and kept_trajectories:
            raise VerifyError(f"{run_path / TRAJECTORIES} lacks the learning episode {record.key}.")
        directory.record(record, Trajectory.from_dict(trajectory) if trajectory is not None
                         else outcome_only(record, results.env))


def outcome_only(record: EpisodeResult, env: str) -> Trajectory:
    """A learning episode's trajectory where the run kept none (a board's committed run): its
    outcome without its steps. The replay resumes after learning, so no learning episode is
    played or read again; the record keeps its count and cost."""
    task = Task(task_id=record.task_id, env=env, split=record.split, task_type=record.task_type, goal="")
    return Trajectory(task=task, initial_observation="", status=Termination(record.status),
                      reward=record.reward, progress=record.progress,
                      experience_ids=list(record.experience_ids), error=record.error)


def _replay_in_subprocess(replay: Path) -> None:
    """``arena run --resume REPLAY`` in a fresh Python process (nothing of this one is reused)."""
    command = [sys.executable, "-m", "arena.report.verify", str(replay)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ})
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise VerifyError(f"The replay stopped (exit {done.returncode}) before its evaluation "
                          f"finished:\n{tail}")


def _replay_in_process(replay: Path, plugins: Any) -> None:
    """The replay as a fresh session of this process, with ``plugins`` (the test kit's methods
    registered in-process, which a fresh process would not have)."""
    from arena.core import protocol

    try:
        protocol.run(None, resume=replay, plugins=plugins, allow_version_change=True)
    except Exception as exc:
        raise VerifyError(f"The replay stopped before its evaluation finished: "
                          f"{type(exc).__name__}: {exc}") from exc


# -- comparing ---------------------------------------------------------------------------------


def played_digest(trajectory: dict[str, Any] | None) -> str | None:
    """What was played: first observation, every action with its reply, the outcome."""
    if trajectory is None:
        return None
    played = [trajectory.get("initial_observation"), trajectory.get("status"),
              [[s.get("action"), s.get("observation"), s.get("valid")] for s in trajectory.get("steps", [])]]
    return hashlib.sha256(json.dumps(played).encode()).hexdigest()


def _first_differing_step(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return None
    steps_a, steps_b = a.get("steps", []), b.get("steps", [])
    for index in range(max(len(steps_a), len(steps_b))):
        one = steps_a[index] if index < len(steps_a) else None
        two = steps_b[index] if index < len(steps_b) else None
        if one is None or two is None or [one.get("action"), one.get("observation")] != \
                [two.get("action"), two.get("observation")]:
            return {"step": index + 1,
                    "recorded_action": None if one is None else one.get("action"),
                    "replayed_action": None if two is None else two.get("action")}
    return None


def episode_name(key: tuple) -> str:
    _, split, task_id, seed, variant = key
    return f"{split}/{task_id} seed {seed}" + ("" if variant == "default" else f" ({variant})")


def compare_episodes(recorded: list[EpisodeResult], recorded_trajectories: dict[tuple, dict[str, Any]] | None,
                     replayed: list[EpisodeResult], replayed_trajectories: dict[tuple, dict[str, Any]],
                     ) -> tuple[int, list[dict[str, Any]]]:
    """(episodes compared, the differing ones): every evaluation episode of the run against the
    replay's of the same key, and every replayed key the run does not have. Without
    ``recorded_trajectories`` (a run that kept none) outcomes are compared, not the play."""
    ours = {r.key: r for r in recorded if r.phase == EVALUATE}
    theirs = {r.key: r for r in replayed if r.phase == EVALUATE}
    differing: list[dict[str, Any]] = []
    for key in sorted(set(ours) | set(theirs), key=lambda k: tuple(map(str, k))):
        entry: dict[str, Any] = {"episode": episode_name(key), "key": list(key)}
        if key not in theirs:
            differing.append({**entry, "difference": "not played by the replay"})
            continue
        if key not in ours:
            differing.append({**entry, "difference": "played by the replay, absent from the record"})
            continue
        a, b = ours[key].to_dict(), theirs[key].to_dict()
        fields = {name: [a.get(name), b.get(name)] for name in COMPARED_FIELDS if a.get(name) != b.get(name)}
        traj_a, traj_b = (recorded_trajectories or {}).get(key), replayed_trajectories.get(key)
        if recorded_trajectories is not None and played_digest(traj_a) != played_digest(traj_b):
            fields["played"] = [played_digest(traj_a), played_digest(traj_b)]
            step = _first_differing_step(traj_a, traj_b)
            if step is not None:
                entry["first_difference"] = step
        if fields:
            differing.append({**entry, "difference": "; ".join(sorted(fields)),
                              "recorded_vs_replayed": {k: v for k, v in fields.items() if k != "played"}})
    return len(ours), differing


def _dtype(results: Results) -> str | None:
    dtype = results.provenance.model.get("dtype")
    return None if dtype is None else str(dtype)


def dtype_notes(original: Results, replayed: Results) -> list[str]:
    """Why greedy choices may differ on replay: the model's dtype (docs/numerics.md)."""
    ran, now = _dtype(original), _dtype(replayed)
    notes = []
    if ran is not None and now is not None and ran != now:
        notes.append(f"the run's model ran in {ran}, the replay's in {now} (llm.dtype=auto resolves "
                     "per machine): replay on a machine where it resolves alike, or rerun with "
                     "llm.dtype=float32")
    elif ran is not None and ran != "float32":
        notes.append(f"the model ran in {ran}, which is not bit-reproducible: a near-tied greedy "
                     "choice may flip on replay (docs/numerics.md). Verification asks for exact "
                     "equality; runs meant to be verified set llm.dtype=float32")
    return notes


# -- the whole check ----------------------------------------------------------------------------


def verify_run(path: Path | str, *, plugins: Any = None, keep: Path | str | None = None,
               write: bool = True) -> Verification:
    """Verify the run at ``path``; writes its verification.json (unless ``write`` is False) and
    returns what was found. ``plugins``: replay in a fresh session of this process with these
    plugins (tests whose methods are registered in-process); by default the replay is a new
    Python process. ``keep``: the folder to replay into, kept afterwards (default: a temporary
    folder, removed)."""
    run_path = Path(path)
    if not (run_path / RESULTS).is_file():
        raise VerifyError(f"{run_path} has no {RESULTS}: only a finished run can be verified.")
    record_head = _recorded_head(run_path)
    try:
        run = load_run(run_path, verification=False)
    except ReportError as exc:  # the record was changed: nothing to replay against
        outcome = Verification(UNVERIFIED, f"The run's record fails its integrity check: {exc}")
        if write:
            write_verification(run_path, outcome.to_json(record_head))
        return outcome
    if run.record_problems:  # its violations were edited: the record is not what results say
        outcome = Verification(UNVERIFIED, f"The run's violations do not match its record: "
                               f"{run.record_problems[0]}")
        if write:
            write_verification(run_path, outcome.to_json(record_head))
        return outcome
    try:
        outcome = _verify(run_path, run.results, run.episodes or [], plugins, keep)
    except VerifyError as exc:
        outcome = Verification(UNVERIFIABLE, str(exc))
    if write:
        write_verification(run_path, outcome.to_json(record_head))
    return outcome


def _recorded_head(run_path: Path) -> str | None:
    """The head of the record results.json names, read before (and whether or not) the file
    passes the schema: a verdict on an edited run is tied to the record it names too."""
    try:
        record = read_json(run_path / RESULTS, "its results").get("record")
    except RunDirError as exc:
        raise VerifyError(str(exc)) from exc
    head = record.get("head") if isinstance(record, dict) else None
    return None if head is None else str(head)


def _verify(run_path: Path, results: Results, records: list[EpisodeResult], plugins: Any,
            keep: Path | str | None) -> Verification:
    if not records:
        raise VerifyError(f"{run_path} has no {EPISODES}: nothing to compare a replay with.")
    salt = results.protocol.eval_salt or "public"
    if salt.startswith("secret") and not (run_path / SALT_FILE).is_file():
        raise VerifyError(f"{run_path} was evaluated on a secret test draw ({salt}) whose salt is not "
                          f"here ({SALT_FILE} is never committed): verify it where it was made, or "
                          "evaluate its learned state anew with `arena evaluate --state`.")
    kept_trajectories = (run_path / TRAJECTORIES).is_file()
    trajectories = trajectories_by_key(run_path) if kept_trajectories else {}
    if keep is not None and Path(keep).exists():
        raise VerifyError(f"{keep} exists; the replay needs a new folder.")
    replay = Path(keep) if keep is not None else Path(tempfile.mkdtemp(prefix="arena-verify-")) / "replay"
    try:
        prepare_replay(run_path, replay, results, records, trajectories)
        if plugins is None:
            _replay_in_subprocess(replay)
        else:
            _replay_in_process(replay, plugins)
        replayed_results = read_results(replay, "the replay's results")
        not_restored = [v for v in replayed_results.violations if v.startswith(NOT_RESTORED)]
        if not_restored:
            absent = [name for name in LEARNED_STATE if not (run_path / name).is_dir()]
            where = (f" {run_path} has no {' or '.join(f'{name}/' for name in absent)}: a board keeps "
                     "only its runs' small files, so put back the learned state the run's maker kept "
                     "(it must hash to state.json's digest_before_eval) and verify again."
                     if absent else "")
            raise VerifyError(
                "The method's learned state could not be restored from the run directory: "
                f"{not_restored[0]} Its learned state is not (all) on disk (e.g. weights not saved, "
                "or a method that does not reload them when built), so its evaluation cannot be "
                f"replayed.{where}")
        replayed = [EpisodeResult.from_dict(r) for r in read_jsonl(replay / EPISODES, repair=False)]
        compared, differing = compare_episodes(records, trajectories if kept_trajectories else None,
                                               replayed, trajectories_by_key(replay))
        summary = {"arena_version": arena.__version__,
                   "run_arena_version": results.provenance.arena_version,
                   "valid": replayed_results.valid,
                   "violations": replayed_results.violations,
                   "dtype": _dtype(replayed_results),
                   "folder": str(replay) if keep is not None else None}
        made = {"arena_version": results.provenance.arena_version, "git_sha": results.provenance.git_sha}
        now = {"arena_version": arena.__version__, "git_sha": provenance.git_sha()}
        changed = [f"{k} {made[k]} -> {v}" for k, v in now.items() if made[k] not in (None, v)]
        versions = ([f"replayed by another Arena than the run's ({'; '.join(changed)}): a difference "
                     "may come from a change of Arena itself"] if changed else [])
        if not kept_trajectories:
            versions.append(OUTCOMES_ONLY)
            summary["compared"] = "outcomes"
        new_violations = [v for v in replayed_results.violations if v not in results.violations]
        if differing or new_violations:
            parts = []
            if differing:
                names = ", ".join(d["episode"] for d in differing[:5])
                parts.append(f"{len(differing)} of {compared} evaluation episodes differ on replay "
                             f"({names}{', ...' if len(differing) > 5 else ''})")
            if new_violations:
                parts.append(f"the replay broke the protocol: {new_violations[0]}")
            return Verification(UNVERIFIED, "; ".join(parts) + ".", compared, differing,
                                (dtype_notes(results, replayed_results) if differing else []) + versions,
                                summary)
        exactly = "exactly" if kept_trajectories else "with the same outcomes (no trajectories kept)"
        return Verification(VERIFIED, f"All {compared} evaluation episodes replay {exactly} from the "
                            "run's learned state.", compared, [], versions, summary)
    finally:
        if keep is None:
            shutil.rmtree(replay.parent, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """The replay's own process: ``python -m arena.report.verify REPLAY_DIR`` resumes it."""
    from arena.core import protocol

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m arena.report.verify REPLAY_DIR (arena verify runs it)", file=sys.stderr)
        return 2
    try:
        protocol.run(None, resume=args[0], allow_version_change=True)
    except (RunDirError, ValueError, KeyError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover - the replay's process
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    sys.exit(main())
