"""Before a session: the run's config resolved and its directory made, or the one to resume
checked (same method, same config, same Arena unless allowed), all under the run's lock."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from omegaconf import DictConfig

import arena
from arena.core.config.compose import compose
from arena.core.config.plugins import Plugins, get_plugins
from arena.core.contract.settings import Settings
from arena.core.host import provenance
from arena.core.protocol import continuation
from arena.core.storage.rundir import RunDir, RunDirError, RunLock, new_run_dir


@dataclass
class PreparedRun:
    cfg: DictConfig
    run_dir: RunDir
    resumed: bool
    #: Held from here until the run ends: no second process writes the same directory.
    lock: RunLock | None = None
    #: The directory did not exist before: a run that fails before its first episode removes it.
    created: bool = False
    #: ``--repair``: move damaged lines of episodes.jsonl aside before resuming.
    repair: bool = False
    #: The harness's sections of ``cfg``, typed once here for the whole session.
    settings: Settings = field(init=False)

    def __post_init__(self) -> None:
        self.settings = Settings.of(self.cfg)

    def discard(self) -> None:
        """Remove a new run's directory (nothing was recorded in it yet)."""
        if self.created and not self.resumed and not (self.run_dir.path / "episodes.jsonl").exists():
            shutil.rmtree(self.run_dir.path, ignore_errors=True)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


class PrepareOptions(TypedDict, total=False):
    """What :func:`prepare` takes besides the method and the environment (for :func:`~arena.core.
    protocol.session.run`, which hands them on)."""

    config_file: Path | str | None
    overrides: list[str] | None
    out: Path | str | None
    resume: Path | str | None
    plugins: Plugins | None
    preset: str | None
    allow_version_change: bool
    repair: bool
    move_here: bool


def prepare(
    method: str | None,
    env: str | None = None,
    config_file: Path | str | None = None,
    overrides: list[str] | None = None,
    out: Path | str | None = None,
    resume: Path | str | None = None,
    plugins: Plugins | None = None,
    preset: str | None = None,
    allow_version_change: bool = False,
    repair: bool = False,
    move_here: bool = False,
) -> PreparedRun:
    """Resolve the config and the run directory (a new one, or the one to resume)."""
    plugins = plugins or get_plugins()
    if resume is not None:
        run_dir = RunDir(resume)
        run_dir.load_config()  # is it a run directory at all?
        lock = run_dir.lock().acquire()  # a second process on this folder stops here
        try:
            prepared = _resumed(run_dir, lock, method, env, config_file, overrides, plugins, preset,
                                allow_version_change, move_here)
            prepared.repair = repair
            return prepared
        except BaseException:
            lock.release()
            raise
    if repair or move_here:
        raise ValueError(f"--{'repair' if repair else 'move-here'} applies to --resume RUN_DIR only.")
    if method is None:
        raise ValueError("Name a method with --method (see `arena plugins`).")
    cfg = compose(plugins, method, env, config_file, overrides, preset)
    path = Path(out) if out else new_run_dir(cfg.run.root, method, cfg.env.name)
    run_dir = RunDir(path)
    existed = run_dir.path.exists()
    try:
        run_dir.path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"Cannot create the run directory {path}: {exc.strerror or exc}. "
                          "Choose another --out.") from exc
    lock = run_dir.lock().acquire()
    try:
        run_dir.create(cfg, _learned_state_to_start_from(cfg, run_dir))
    except BaseException:
        lock.release()
        raise
    return PreparedRun(cfg, run_dir, resumed=False, lock=lock, created=not existed)


def _learned_state_to_start_from(cfg: DictConfig, run_dir: RunDir,
                                 remaking: bool = False) -> dict[str, Any] | None:
    """A continued run's learned state, copied into its folder first (a folder without it is no
    run yet), and what its first state records of it; None for a run that learns from nothing."""
    continued = continuation.source_of(cfg)
    if continued is None:
        return None
    started_from = continuation.check_source(continued, cfg, run_dir, remaking=remaking)
    continuation.seed_learned_state(continued, run_dir.path)
    return started_from


def _checkout_hint(started_sha: object, now_sha: str | None) -> str:
    """How to get the clean commit that started a run beside this checkout ("" where it was not
    one: an installed wheel, a modified checkout, or the same commit)."""
    if not isinstance(started_sha, str) or not started_sha or started_sha.endswith("-dirty") or started_sha == now_sha:
        return ""
    short = started_sha[:12]
    return f" (its commit {short}: `git worktree add --detach ../arena-{short} {short}`, then resume from there)"


def _resumed(run_dir: RunDir, lock: RunLock, method: str | None, env: str | None,
             config_file: Path | str | None, overrides: list[str] | None, plugins: Plugins,
             preset: str | None, allow_version_change: bool = False,
             move_here: bool = False) -> PreparedRun:
    """The checks of ``--resume`` (made while holding the run's lock)."""
    resume = run_dir.path
    cfg = run_dir.load_config()
    if not run_dir.was_made():  # killed between its config and its first state: nothing was played
        run_dir.write_first_state(_learned_state_to_start_from(cfg, run_dir, remaking=True))
    if method is not None and method != cfg.method.name:
        raise RunDirError(
            f"{resume} is a run of method '{cfg.method.name}', not '{method}'. "
            "Drop --method when resuming, or pass the right run directory."
        )
    if overrides or config_file or preset or env:
        raise RunDirError(
            "A resumed run keeps its saved config; drop --env, --preset, --config and "
            "key=value overrides, or start a new run."
        )
    if run_dir.config_changed():
        raise RunDirError(
            f"{run_dir.path / 'config.yaml'} was edited after the run started; a resumed run keeps "
            "the config it started with. Undo the edit, or start a new run with the new settings."
        )
    started = run_dir.ledger.read().provenance
    now = {"arena_version": arena.__version__, "git_sha": provenance.git_sha()}
    changed = {k: (started.get(k), v) for k, v in now.items() if k in started and started.get(k) != v}
    if changed:
        named = "; ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changed.items())
        if not allow_version_change:
            hint = _checkout_hint(started.get("git_sha"), now["git_sha"])
            raise RunDirError(
                f"{run_dir.path} was started by another Arena ({named}). Resume it with the version "
                f"that started it{hint}, or pass --allow-version-change (results.json then records it).")
        run_dir.ledger.resumed_by(now)
    plugins.methods.get(cfg.method.name)  # still installed?
    if (run_dir.path / "results.json").exists():
        raise RunDirError(f"{resume} already finished; see `arena show {resume}`.")
    signer = run_dir.signed_elsewhere()
    if signer is not None and not move_here:
        raise RunDirError(
            f"{resume} was started on another machine: its record is signed by key {signer}, this "
            f"machine's is {run_dir.record_key_id()}, so the lines on record cannot be checked "
            "against their signatures here. To go on here, checking them by their hashes only, "
            f"run `arena run --resume {resume} --move-here` (results.json and the board then say "
            "the run moved and after which line); or resume it on the machine that started it.")
    if signer is not None:
        run_dir.move_here(signer)
    return PreparedRun(cfg, run_dir, resumed=True, lock=lock)
