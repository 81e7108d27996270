"""The run directory: config, episode records, trajectories, state checkpoints and results.

Episode records are appended and fsynced one line at a time, so a run killed at any point loses
at most the episode in flight; ``--resume`` reads them back and skips every finished episode.
Each record is chained to the one before it and signed with this machine's record key
(``arena.core.storage.integrity``): ``--resume`` refuses a record that was changed. The harness's
violations are lines of the same chain (``violations.jsonl``): a resumed run takes them from
there, and a state.json that lists others is itself a violation.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from arena.core.contract.results import RecordMove, Results, ResultsError, signed_after
from arena.core.contract.results import validate as validate_results
from arena.core.contract.types import EpisodeResult, RolloutTokens, Trajectory
from arena.core.storage import integrity
from arena.core.storage.files import RunDirError, read_json, write_json_atomic
from arena.core.storage.journal import disk_full_point, no_space
from arena.core.storage.ledger import STATE, Ledger

EPISODES = "episodes.jsonl"
#: The harness's violations, chained with the episode lines (``arena.core.storage.integrity``).
VIOLATIONS = "violations.jsonl"
TRAJECTORIES = "trajectories.jsonl"
CONFIG = "config.yaml"
RESULTS = "results.json"
#: Where ``--repair`` puts the lines of episodes.jsonl that were not records.
DAMAGED = "episodes.damaged.jsonl"
ROLLOUTS = "rollouts"


def new_run_dir(root: Path | str, method: str, env: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{stamp}-{method}-{env}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path(root) / f"{stamp}-{method}-{env}-{suffix}"
    return path


def parsed_lines(data: bytes) -> tuple[list[tuple[int, bytes, dict[str, Any] | None]], bytes]:
    """Each complete line of a JSONL file as (number, bytes, record or None when it is not a
    JSON object), and the torn tail after the last newline (empty if none)."""
    *complete, torn = data.split(b"\n")
    lines = []
    for number, raw in enumerate(complete, start=1):
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        lines.append((number, raw, record if isinstance(record, dict) else None))
    return lines, torn


def read_jsonl(path: Path, repair: bool = True) -> list[dict[str, Any]]:
    """Every line of a JSONL record. Only a torn last line (no newline: killed mid-write) is
    treated as lost: it is cut off the file, unless ``repair`` is False (readers that must never
    change a run, e.g. reports). A damaged line anywhere else stops with a :class:`RunDirError`
    naming the file and the line, and the file is left as it is: no good record is dropped."""
    if not path.exists():
        return []
    data = path.read_bytes()
    lines, torn = parsed_lines(data)
    records: list[dict[str, Any]] = []
    for number, _, record in lines:
        if record is None:
            raise RunDirError(
                f"{path}, line {number} is damaged (not a JSON record); nothing was changed. "
                "Restore the file from a copy, or start a new run: a record with a hole cannot "
                "be resumed or reported.")
        records.append(record)
    if torn and repair:
        with path.open("r+b") as handle:
            handle.truncate(len(data) - len(torn))
    return records


#: The lock file ``arena run`` holds (an OS lock, released when its process ends however it ends).
LOCK = "run.lock"


class RunLock:
    """An exclusive ``flock`` on ``run.lock`` for the life of one ``arena run``, with the holder's
    PID written inside, so that a second process on the same directory is refused by name and
    ``arena show`` can tell a running run from an interrupted one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if not self.path.parent.is_dir():
            raise RunDirError(f"{self.path.parent} is not a folder: nothing to lock.")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = running_pid(self.path.parent)
            raise RunDirError(
                f"{self.path.parent} is in use by another arena run (PID {holder or 'unknown'}). "
                "Wait for it to finish, or stop that process first."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing releases the lock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def running_pid(path: Path | str) -> int | None:
    """The PID of the ``arena run`` holding this run directory now, or None if none does."""
    lock = Path(path) / LOCK
    if not lock.is_file():
        return None
    fd = os.open(lock, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = lock.read_text().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def record_disagreement(recorded: list[str], listed: list[str], where: str) -> str | None:
    """The violation to add where ``listed`` (state.json's or results.json's list) differs
    from the violations on record; None where they agree (as sets: a list has no repeats)."""
    missing = [m for m in recorded if m not in listed]
    extra = [m for m in listed if m not in recorded]
    if not missing and not extra:
        return None
    parts = []
    if missing:
        parts.append(f"lacks {len(missing)} the signed record holds (e.g. {missing[0][:160]!r})")
    if extra:
        parts.append(f"lists {len(extra)} the record does not (e.g. {extra[0][:160]!r})")
    return (f"The violations of {where} disagree with the run's signed record of violations "
            f"({VIOLATIONS}): it {' and '.join(parts)}. A violation cannot be erased; the file was "
            "edited, or the run was stopped between the two writes.")


def unfinished_message(path: Path | str) -> str:
    """What to tell a user who asks for the results of a run that has none yet."""
    pid = running_pid(path)
    if pid is not None:
        return (f"{path} is still running (arena run, PID {pid}): it has no {RESULTS} yet. Its "
                f"progress is in that process's output; look again when it has finished.")
    return (f"{path} was interrupted before it finished (no {RESULTS}). Finish it with "
            f"`arena run --resume {path}`.")


def read_results(run: Path, what: str = "its results") -> Results:
    """``run``'s results.json, checked against the schema; a :class:`RunDirError` names the file
    and what is wrong with it."""
    path = run / RESULTS
    try:
        return validate_results(read_json(path, what), str(path))
    except ResultsError as exc:
        raise RunDirError(str(exc)) from exc


def run_status(path: Path | str) -> str:
    """``finished``, ``running`` (a process holds it) or ``interrupted`` (resumable)."""
    path = Path(path)
    if (path / RESULTS).is_file():
        return "finished"
    return "running" if running_pid(path) is not None else "interrupted"


class RunDir:
    """Reads and writes one run's files. Thread-safe for concurrent episode records."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        #: The run's state (state.json): read and written through its events only.
        self.ledger = Ledger(self.path)
        self._lock = threading.Lock()
        self._episodes: dict[tuple, EpisodeResult] = {}
        self._head = integrity.GENESIS  # the chain hash of the last line (episode or violation)
        #: Whether ``_head`` is the record's: a new run's, or a resumed one's once its record
        #: was read (:meth:`load_episodes`). Until then a violation waits in ``_unsealed``.
        self._head_known = False
        self._unsealed: list[str] = []
        self._key: bytes | None = None  # the record key, made on first write (readers need none)
        self._key_loaded = False

    # -- creation and resume ------------------------------------------------------------------

    def create(self, cfg: DictConfig, continued_from: dict[str, Any] | None = None) -> None:
        """Write the run's config and its first state (with the run it continues, if any: one
        write, so a run killed while it was being made has all of it or is no run yet)."""
        if self.ledger.exists() or any((self.path / name).exists() for name in (CONFIG, EPISODES, RESULTS)):
            raise RunDirError(
                f"{self.path} already holds a run. Resume it with `arena run --resume {self.path}` "
                "or choose another --out."
            )
        self.path.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, self.path / CONFIG)
        self._head_known = True  # a new record: it starts at GENESIS
        self.write_first_state(continued_from)

    def write_first_state(self, continued_from: dict[str, Any] | None = None) -> None:
        """The run's first state: what --resume and the end of the run check (the config as
        written, the signing key) and the run it continues. Written after the config; a run
        killed between the two has a config and no state, and ``--resume`` writes it then."""
        self.ledger.create(config_sha256=integrity.file_sha256(self.path / CONFIG),
                           record_key_id=integrity.key_id(self._signing_key()), continued_from=continued_from)

    def was_made(self) -> bool:
        """Its first state was written (see :meth:`write_first_state`)."""
        return self.ledger.exists()

    def load_config(self) -> DictConfig:
        path = self.path / CONFIG
        if not path.is_file():
            raise RunDirError(
                f"{self.path} is not an Arena run directory (no {CONFIG}). Pass the folder that "
                "`arena run` printed, e.g. runs/20261129-080000-base-<env>."
            )
        try:
            cfg = OmegaConf.load(path)
        except Exception as exc:
            raise RunDirError(f"{path} cannot be read ({str(exc).splitlines()[0]}); the run's config "
                              "is damaged. Restore it, or start a new run.") from exc
        if not isinstance(cfg, DictConfig) or "method" not in cfg or "name" not in cfg.get("method", {}):
            raise RunDirError(f"{path} holds no run config (it is empty or damaged). Restore it, or "
                              "start a new run.")
        return cfg

    def count_episodes(self) -> int:
        """Finished episodes on disk, read without changing anything (safe on a live run)."""
        path = self.path / EPISODES
        if not path.exists():
            return 0
        return sum(1 for line in path.read_bytes().splitlines(keepends=True) if line.endswith(b"\n"))

    def load_episodes(self, repair: bool = False) -> list[EpisodeResult]:
        """Finished episodes recorded so far (used by --resume), after checking their chain and
        signatures: a changed record is refused, naming its first bad line. ``repair`` first
        moves damaged lines aside (:meth:`move_damaged_lines`)."""
        if repair:
            self.move_damaged_lines()
        try:
            lines = read_jsonl(self.path / EPISODES)
        except RunDirError as exc:
            raise RunDirError(f"{exc} If learning had finished, `arena run --resume {self.path} "
                              "--repair` moves damaged lines aside and plays those episodes again.") from exc
        # Whatever state.json says: where this machine has a key, every line since the run last
        # moved here (--move-here; all lines if it never moved) must carry its MAC (a run started
        # on another machine, or rewritten by a forger, is refused).
        try:
            report = self._check_chain(lines, self._signing_key())
        except integrity.RecordError as exc:
            raise RunDirError(f"{exc} Start a new run; this one cannot be resumed here (a run "
                              "resumes on the machine whose key signed it; `arena run --resume "
                              f"{self.path} --move-here` continues a run moved from another machine, "
                              "and results.json then says so).") from exc
        if lines and not report.chained:
            raise RunDirError(f"{self.path / EPISODES} was written before records were chained "
                              "(an older Arena); finish it with that version or start a new run.")
        records = [EpisodeResult.from_dict(r) for r in lines]
        self._drop_orphan_trajectories({r.key for r in records})
        with self._lock:
            self._episodes = {r.key: r for r in records}
            self._head = report.head
            self._head_known = True
            waiting, self._unsealed = self._unsealed, []
            for message in waiting:  # violations found before the record was read: sealed now
                self._seal_violation(message)
        return records

    # -- violations ---------------------------------------------------------------------------

    def violations_on_record(self) -> tuple[list[str], list[str]]:
        """The violations a resumed run starts from: (those in the signed record, those to
        record now). The record (``violations.jsonl``, each line's hash and MAC checked here,
        its links with the episodes by :meth:`load_episodes`) is the truth; state.json's list
        only adds: an entry the record lacks (a run from before violations were recorded) is
        kept, and any disagreement between the two is a violation of its own, since only an
        edit (or a run killed between the two writes, already invalid) makes them differ."""
        path = self.path / VIOLATIONS
        try:
            lines = read_jsonl(path)
        except RunDirError as exc:
            raise RunDirError(f"{exc} The run's violations cannot be read: start a new run.") from exc
        key = self._signing_key()
        recorded: list[str] = []
        for number, line in enumerate(lines, start=1):
            try:
                integrity.check_line(line, f"{path}, line {number}", key)
            except integrity.RecordError as exc:
                raise RunDirError(f"{exc} Start a new run; this one cannot be resumed (a run "
                                  "resumes only on the machine that started it).") from exc
            message = line.get(integrity.VIOLATION)
            if isinstance(message, str) and message not in recorded:
                recorded.append(message)
        listed = self.ledger.read().violations
        extra = [m for m in dict.fromkeys(listed) if m not in recorded]
        disagreement = record_disagreement(recorded, listed, STATE)
        return recorded, extra + ([disagreement] if disagreement else [])

    def record_violation(self, message: str, messages: list[str]) -> None:
        """Sign ``message`` into the record, then list ``messages`` (all so far) in state.json:
        the record first, so state.json never lists one the record lacks."""
        with self._lock:
            if not self._head_known and not (self.path / EPISODES).exists() \
                    and not (self.path / VIOLATIONS).exists():
                self._head_known = True  # nothing recorded yet: the chain starts here
            if self._head_known:
                self._seal_violation(message)
            else:
                self._unsealed.append(message)
        self.ledger.violations(messages)

    def _seal_violation(self, message: str) -> None:
        """Append ``message``'s line to the chain (the caller holds the lock)."""
        sealed = integrity.seal_violation(message, self._head, self._signing_key())
        self._append(VIOLATIONS, sealed)
        self._head = sealed[integrity.CHAIN]["hash"]

    def move_damaged_lines(self) -> int:
        """Move the lines of episodes.jsonl that are not JSON records to episodes.damaged.jsonl
        (with their line numbers); every good line stays, as written. Only once learning has
        finished: a damaged learning record cannot be told from a step not yet taken, and taking
        it again could apply an update twice. The good line after each hole is recorded as a
        break of the chain (``record_breaks``), checked by its own hash and MAC; boards flag the
        run as repaired. Returns the number of lines moved."""
        path = self.path / EPISODES
        if not path.exists():
            return 0
        lines, torn = parsed_lines(path.read_bytes())
        good, breaks, after_hole = [], [], False
        damaged: list[dict[str, Any]] = []
        for number, raw, record in lines:
            if record is None:
                damaged.append({"line": number, "bytes": raw.decode("utf-8", "replace")})
                after_hole = True
                continue
            if after_hole and isinstance(record.get(integrity.CHAIN), dict):
                breaks.append(record[integrity.CHAIN].get("hash"))
            after_hole = False
            good.append(raw)
        if not damaged:
            return 0
        # A violation recorded right after a damaged line links to it: a break too.
        chains = [record[integrity.CHAIN] for _, _, record in lines
                  if record is not None and isinstance(record.get(integrity.CHAIN), dict)]
        violations = [line[integrity.CHAIN] for line in read_jsonl(self.path / VIOLATIONS)
                      if isinstance(line.get(integrity.CHAIN), dict)]
        known = {integrity.GENESIS, *(chain.get("hash") for chain in chains + violations)}
        breaks += [chain.get("hash") for chain in violations if chain.get("prev") not in known]
        if not self.ledger.read().learn_done:
            raise RunDirError(
                f"{path} has damaged lines ({', '.join(str(d['line']) for d in damaged)}) from before "
                "learning finished; a lost learning step cannot be repaired without risking its update "
                "twice. Restore the file from a copy, or start a new run.")
        with (self.path / DAMAGED).open("a") as handle:
            for entry in damaged:
                handle.write(json.dumps(entry) + "\n")
        tmp = path.with_suffix(".jsonl.repair")
        tmp.write_bytes(b"".join(line + b"\n" for line in good) + torn)
        os.replace(tmp, path)
        self.ledger.repaired(breaks, [d["line"] for d in damaged])
        return len(damaged)

    @property
    def head(self) -> str:
        """The chain hash of the last line, episode or violation (results.json records it)."""
        return self._head

    def record_key_id(self) -> str | None:
        return integrity.key_id(self._signing_key())

    def _check_chain(self, lines: list[dict[str, Any]], key: bytes | None) -> integrity.ChainReport:
        """The chain of ``lines`` (episodes.jsonl) and violations.jsonl, with ``key``'s MACs on
        the lines since the run last moved (all lines if it never did; none without a key)."""
        state = self.ledger.read()
        return integrity.verify(lines, self.path / EPISODES, key=key, expected_key_id=integrity.key_id(key),
                                breaks=set(state.record_breaks), violations=read_jsonl(self.path / VIOLATIONS),
                                violations_path=self.path / VIOLATIONS,
                                macs_after=signed_after(state.record_moves))

    def signed_elsewhere(self) -> str | None:
        """The key that signs the run's record, where this machine has another one (the run was
        started, or last moved, on another machine); None where this machine's key signs it or
        either key is unknown."""
        recorded, here = self.ledger.read().record_key_id, self.record_key_id()
        return recorded if recorded is not None and here is not None and recorded != here else None

    def move_here(self, recorded: str) -> RecordMove:
        """Go on signing the run's record with this machine's key (``--resume --move-here``)
        where ``recorded`` (:meth:`signed_elsewhere`) signed it so far: the chain as it stands
        is checked by its hashes (the MACs of another key cannot be), and the move is recorded,
        so results.json and the board say which lines this key signed."""
        try:
            report = self._check_chain(read_jsonl(self.path / EPISODES), key=None)
        except integrity.RecordError as exc:
            raise RunDirError(f"{exc} A damaged record cannot be moved; start a new run.") from exc
        move = RecordMove(from_key_id=recorded, to_key_id=self.record_key_id(), after=report.head,
                          episodes=report.lines, at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self.ledger.moved(move)
        return move

    def _signing_key(self) -> bytes | None:
        """This machine's record key, read (or made) once, when the run first writes or checks
        its record; None where none can be made."""
        if not self._key_loaded:
            self._key, self._key_loaded = integrity.record_key(), True
        return self._key

    def config_changed(self) -> bool:
        """config.yaml differs from the one the run started with (state.json's hash of it)."""
        written = self.ledger.read().config_sha256
        return written is not None and integrity.file_sha256(self.path / CONFIG) != written

    def _drop_orphan_trajectories(self, keys: set[tuple]) -> None:
        """Keep only trajectories of recorded episodes (one killed between the two writes)."""
        path = self.path / TRAJECTORIES
        lines = read_jsonl(path)
        kept = [line for line in lines if tuple(line["key"]) in keys]
        if len(kept) != len(lines):
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in kept))
            os.replace(tmp, path)

    # -- episodes -----------------------------------------------------------------------------

    def finished(self, key: tuple) -> EpisodeResult | None:
        return self._episodes.get(key)

    def episodes(self) -> list[EpisodeResult]:
        with self._lock:
            return list(self._episodes.values())

    def load_trajectory(self, key: tuple) -> Trajectory | None:
        """The recorded trajectory of one episode (a scan of the file: for resume paths only)."""
        path = self.path / TRAJECTORIES
        if not path.exists():
            return None
        wanted = list(key)
        with self._lock, path.open() as handle:
            for line in handle:
                data = json.loads(line)
                if data.pop("key") == wanted:
                    return Trajectory.from_dict(data)
        return None

    # -- rollout tokens (RL methods) ----------------------------------------------------------

    def _rollout_path(self, key: tuple) -> Path:
        name = hashlib.sha1(json.dumps(list(key)).encode()).hexdigest()[:24]
        return self.path / ROLLOUTS / f"{name}.npz"

    def save_rollouts(self, key: tuple, trajectory: Trajectory) -> None:
        """Write the exact tokens and log-probs of every model decision of an episode, so an
        RL method resumed mid-iteration trains on the episodes it already played instead of
        playing them again. Written atomically, before the episode's record."""
        steps = [i for i, step in enumerate(trajectory.steps) if step.rollout is not None]
        rollouts = [trajectory.steps[i].rollout for i in steps]
        arrays = {"steps": np.asarray(steps, dtype=np.int32)}
        for field_name, dtype in (("prompt_token_ids", np.int32), ("token_ids", np.int32),
                                  ("logprobs", np.float32)):
            values = [getattr(r, field_name) for r in rollouts]
            arrays[field_name] = np.asarray([v for row in values for v in row], dtype=dtype)
            arrays[f"{field_name}_lengths"] = np.asarray([len(row) for row in values], dtype=np.int64)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy's stub reads **kwds as allow_pickle
        path = self._rollout_path(key)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as handle:
            handle.write(buffer.getvalue())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    def attach_rollouts(self, key: tuple, trajectory: Trajectory) -> bool:
        """Put the saved rollout tokens back on a reloaded trajectory's steps; False if none."""
        path = self._rollout_path(key)
        if not path.exists():
            return False
        with np.load(path) as data:
            columns = {}
            for field_name in ("prompt_token_ids", "token_ids", "logprobs"):
                bounds = np.cumsum(data[f"{field_name}_lengths"])[:-1]
                columns[field_name] = [part.tolist() for part in np.split(data[field_name], bounds)]
            for n, index in enumerate(data["steps"].tolist()):
                trajectory.steps[index].rollout = RolloutTokens(
                    columns["prompt_token_ids"][n],
                    columns["token_ids"][n],
                    [float(x) for x in columns["logprobs"][n]],
                )
        return True

    def discard_rollouts(self) -> None:
        """Delete every saved rollout (once an RL iteration's update is checkpointed)."""
        shutil.rmtree(self.path / ROLLOUTS, ignore_errors=True)

    def record(self, result: EpisodeResult, trajectory: Trajectory) -> None:
        """Append one finished episode (trajectory first, so a record never lacks its steps)."""
        with self._lock:
            if result.key in self._episodes:
                raise RunDirError(f"Episode {result.key} was recorded twice; this is a bug.")
            line = self._append(TRAJECTORIES, {"key": list(result.key), **trajectory.to_dict()})
            sealed = integrity.seal(result.to_dict(), self._head, line, self._signing_key())
            self._append(EPISODES, sealed)
            self._head = sealed[integrity.CHAIN]["hash"]
            self._episodes[result.key] = result

    def _append(self, name: str, record: dict[str, Any]) -> bytes:
        """Append one line; returns its bytes (without the newline)."""
        line = json.dumps(record, sort_keys=True)
        with (self.path / name).open("a") as handle:
            if disk_full_point(name):  # a test's full disk: the line stops half way
                handle.write(line[: len(line) // 2])
                handle.flush()
                raise no_space(name)
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return line.encode()

    # -- state checkpoints and results --------------------------------------------------------

    def write_results(self, results: Results) -> Path:
        path = self.path / RESULTS
        write_json_atomic(path, results.to_json())
        return path

    def lock(self) -> RunLock:
        """The run's lock, to hold while this process writes the directory."""
        return RunLock(self.path / LOCK)

    def read_results(self) -> Results:
        if not (self.path / RESULTS).exists():
            raise RunDirError(unfinished_message(self.path))
        return read_results(self.path, "the run's results")
