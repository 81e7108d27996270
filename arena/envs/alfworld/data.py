"""ALFWorld's game files: where they live, what is there, and installing them from archives.

Nothing here needs the ``alfworld`` package: listing tasks, checking and installing data work
on a machine without it, so a missing install and missing data are told apart clearly.

The layout is ALFWorld's own, so an existing ALFWorld data folder (``$ALFWORLD_DATA``) works
as it is: ``<data>/json_2.1.1/<split>/<task folder>/<trial>/game.tw-pddl``, where the task
folder's name starts with the task type (``pick_heat_then_place_in_recep-Apple-None-DiningTable-26``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from arena.envs.alfworld_tasks import SEEN_TASK_TYPES, TASK_TYPES, UNSEEN_TASK_TYPES

#: Folder of the game release inside a data folder (ALFWorld's name for it).
RELEASE = "json_2.1.1"
#: ALFWorld's own splits: train, in-distribution rooms, out-of-distribution rooms.
ALFWORLD_SPLITS = ("train", "valid_seen", "valid_unseen")
GAME_FILE = "game.tw-pddl"
ARCHIVES = {split: f"{split}.tar.xz" for split in ALFWORLD_SPLITS}
#: Checksums of the archives Arena was tested with (the project's offline copy of the
#: json_2.1.1 games). ``arena data alfworld --checksums FILE`` trusts other archives explicitly.
PINNED_SHA256 = {
    "train.tar.xz": "b7300b66aa6d7cd639cb1e4515d410a35fbd5d5543c63bd7d931c4f64e556ac3",
    "valid_seen.tar.xz": "3dafe8edc7d11a23736eadff68e0edfe2e0a462379b37fac89294d36925fd084",
    "valid_unseen.tar.xz": "ace4d158913427c986b0b03b3e7442246840c433b0d80fbc023c021ee803f214",
}
#: Games per split in the json_2.1.1 release (only reported when a folder differs).
EXPECTED_GAMES = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}

# The six types (TASK_TYPES) and Evolving-RL's seen/unseen split, shared with the household world.
SEEN_TYPES = SEEN_TASK_TYPES
UNSEEN_TYPES = UNSEEN_TASK_TYPES

INSTALL_HINT = (
    "Install the games with: arena data alfworld --from PATH_OR_URL (a folder or URL holding "
    + ", ".join(ARCHIVES.values())
    + ")"
)
# The goal sentence sits in the game's grammar, itself a JSON string inside the JSON file.
_GOAL = re.compile(r"Your task is to: (.*?)\\?\"")


class AlfworldDataError(FileNotFoundError, ValueError):
    """ALFWorld's games are missing, incomplete or fail verification; the message says the fix.
    (A ValueError too: the command line reports those as user errors, without a traceback.)"""


@dataclass(frozen=True)
class Game:
    """One game file of one ALFWorld split."""

    alfworld_split: str
    task_folder: str  # e.g. pick_heat_then_place_in_recep-Apple-None-DiningTable-26
    trial: str  # e.g. trial_T20190907_060234_011675
    goal: str  # e.g. "heat some apple and put it in diningtable."

    @property
    def task_type(self) -> str:
        return task_type_of(self.task_folder)

    @property
    def relative_path(self) -> str:
        """Path below the data folder, with forward slashes (stable across machines)."""
        return f"{RELEASE}/{self.alfworld_split}/{self.task_folder}/{self.trial}/{GAME_FILE}"

    @property
    def game_id(self) -> str:
        return f"{self.alfworld_split}/{self.task_folder}/{self.trial}"


def task_type_of(task_folder: str) -> str:
    """The task type is the first ``-``-separated part of the task folder's name."""
    task_type = task_folder.split("-", 1)[0]
    if task_type not in TASK_TYPES:
        raise AlfworldDataError(
            f"Game folder '{task_folder}' does not start with an ALFWorld task type "
            f"({', '.join(TASK_TYPES)}); is this an ALFWorld json_2.1.1 data folder?"
        )
    return task_type


# -- where the data is ------------------------------------------------------------------------


def user_data_dir() -> Path:
    """Arena's per-user data folder for ALFWorld (XDG: ``$XDG_DATA_HOME/arena/alfworld``)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "arena" / "alfworld"


#: What :func:`resolve_data_dir` says when neither the config nor ``$ALFWORLD_DATA`` chose.
DEFAULT_SOURCE = "default"


def _origin(source: str) -> str:
    if source == DEFAULT_SOURCE:
        return "the default folder; set env.data_dir or $ALFWORLD_DATA to use another"
    return f"set by {source}"


def resolve_data_dir(configured: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """The data folder and where that choice came from: the config's ``env.data_dir``, then
    ``$ALFWORLD_DATA`` (ALFWorld's own variable), then the user data folder."""
    if configured not in (None, ""):
        return Path(os.path.expandvars(str(configured))).expanduser(), "env.data_dir"
    from_env = os.environ.get("ALFWORLD_DATA")
    if from_env:
        return Path(from_env).expanduser(), "$ALFWORLD_DATA"
    return user_data_dir(), DEFAULT_SOURCE


def split_dir(root: Path, alfworld_split: str) -> Path:
    return Path(root) / RELEASE / alfworld_split


def count_games(root: Path, alfworld_split: str) -> int:
    folder = split_dir(root, alfworld_split)
    return sum(1 for _ in folder.glob(f"*/*/{GAME_FILE}")) if folder.is_dir() else 0


def data_status(root: Path) -> dict[str, int]:
    """Games found per ALFWorld split (0 = missing)."""
    return {split: count_games(root, split) for split in ALFWORLD_SPLITS}


def require_data(root: Path, splits: Iterable[str] = ALFWORLD_SPLITS, source: str = "") -> None:
    """Raise :class:`AlfworldDataError` naming every missing split and the command that fixes it."""
    status = data_status(root)
    missing = [split for split in splits if status[split] == 0]
    if not missing:
        return
    present = [f"{split}: {n} games" for split, n in status.items() if n]
    origin = f" ({_origin(source)})" if source else ""
    raise AlfworldDataError(
        f"ALFWorld games not found: {root}{origin} has no "
        + ", ".join(f"{RELEASE}/{split}/" for split in missing)
        + (f" (present: {'; '.join(present)})" if present else "")
        + f". {INSTALL_HINT}."
    )


def read_goal(path: Path) -> str:
    """The task sentence of a game ("put some book on sidetable."), read without parsing JSON."""
    with open(path, encoding="utf-8") as handle:
        match = _GOAL.search(handle.read())
    if match is None:
        raise AlfworldDataError(f"{path} holds no 'Your task is to:' sentence; not an ALFWorld game?")
    return match.group(1)


def scan_games(root: Path, alfworld_split: str) -> list[Game]:
    """Every game of one ALFWorld split, sorted by task folder and trial (a stable order)."""
    folder = split_dir(root, alfworld_split)
    games = []
    for path in sorted(folder.glob(f"*/*/{GAME_FILE}")):
        task_folder, trial = path.parent.parent.name, path.parent.name
        task_type_of(task_folder)  # fail on a foreign folder now, not mid-run
        games.append(Game(alfworld_split, task_folder, trial, read_goal(path)))
    return games


# -- installing from archives ---------------------------------------------------------------


@dataclass
class InstalledSplit:
    split: str
    archive: str
    sha256: str
    games: int


def parse_checksums(text: str) -> dict[str, str]:
    """``sha256sum`` output (``HASH  NAME`` per line) -> {name: hash}."""
    sums = {}
    for line in text.splitlines():
        parts = line.strip().split()
        if len(parts) == 2:
            sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


def _is_url(source: str) -> bool:
    return urllib.parse.urlparse(source).scheme in ("http", "https", "file", "ftp")


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch(source: str, name: str, workdir: Path) -> Path:
    """The archive ``name`` of a folder or base URL, as a local file (downloaded if need be)."""
    if not _is_url(source):
        path = Path(source).expanduser() / name
        if not path.is_file():
            raise AlfworldDataError(
                f"{name} not found in {source}: expected {', '.join(ARCHIVES.values())} there."
            )
        return path
    url = source.rstrip("/") + "/" + name
    target = workdir / name
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(target, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except OSError as exc:  # URLError, HTTPError and file:// misses are all OSErrors
        raise AlfworldDataError(f"Could not download {url}: {exc}") from exc
    return target


def _extract_split(archive: Path, split: str, workdir: Path) -> Path:
    """Unpack one split's archive below ``workdir``; every member must lie in that split."""
    prefix = f"{RELEASE}/{split}/"
    with tarfile.open(archive, mode="r:*") as tar:
        strays = [m.name for m in tar.getmembers()
                  if not (m.name.rstrip("/") + "/").startswith(prefix) and m.name.rstrip("/") != RELEASE]
        if strays:
            raise AlfworldDataError(
                f"{archive.name} holds files outside {prefix} (e.g. {strays[0]}); "
                f"it is not the ALFWorld {split} archive."
            )
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuses links, devices, escapes
            tar.extractall(workdir, filter="data")
        else:
            unsafe = [m.name for m in tar.getmembers()
                      if not (m.isfile() or m.isdir()) or ".." in Path(m.name).parts]
            if unsafe:
                raise AlfworldDataError(f"{archive.name} holds links or unsafe paths (e.g. {unsafe[0]}).")
            tar.extractall(workdir)
    return workdir / RELEASE / split


def install(
    source: str,
    dest: Path,
    *,
    splits: Iterable[str] = ALFWORLD_SPLITS,
    checksums: Mapping[str, str] | None = None,
    force: bool = False,
    log: Callable[[str], None] = lambda message: None,
) -> list[InstalledSplit]:
    """Verify and unpack the archives of ``splits`` from a folder or base URL into ``dest``.

    Every archive is checked against ``checksums`` (default: :data:`PINNED_SHA256`) before
    anything is unpacked, and each split appears in ``dest`` only once it is complete, so an
    interrupted or refused install never leaves a half-filled split behind.
    """
    expected = dict(PINNED_SHA256 if checksums is None else checksums)
    splits = list(splits)
    unknown = [s for s in splits if s not in ALFWORLD_SPLITS]
    if unknown:
        raise AlfworldDataError(f"Unknown ALFWorld split(s) {unknown}; splits: {', '.join(ALFWORLD_SPLITS)}")
    dest = Path(dest).expanduser()
    todo = [s for s in splits if force or count_games(dest, s) == 0]
    for split in splits:
        if split not in todo:
            log(f"{split}: already installed ({count_games(dest, split)} games); --force replaces it")
    if not todo:
        return []
    dest.mkdir(parents=True, exist_ok=True)
    installed = []
    with tempfile.TemporaryDirectory(prefix=".arena-alfworld-", dir=dest) as tmp:
        workdir = Path(tmp)
        archives = {}
        for split in todo:  # fetch and verify all before unpacking any
            name = ARCHIVES[split]
            if name not in expected:
                raise AlfworldDataError(f"No checksum given for {name}; add it to the checksums file.")
            path = _fetch(source, name, workdir)
            actual = _sha256_of(path)
            if actual != expected[name].lower():
                raise AlfworldDataError(
                    f"Checksum mismatch for {name} from {source}: sha256 {actual}, expected "
                    f"{expected[name]}. The archive is damaged or another release; nothing was "
                    "installed. Pass --checksums FILE to trust a different release on purpose."
                )
            archives[split] = (path, actual)
            log(f"{split}: {name} verified (sha256 {actual[:12]}...)")
        for split, (path, digest) in archives.items():
            unpacked = _extract_split(path, split, workdir / f"unpack-{split}")
            games = sum(1 for _ in unpacked.glob(f"*/*/{GAME_FILE}"))
            if games == 0:
                raise AlfworldDataError(f"{path.name} holds no {GAME_FILE} files below {RELEASE}/{split}/.")
            target = split_dir(dest, split)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            os.replace(unpacked, target)
            installed.append(InstalledSplit(split, path.name, digest, games))
            note = "" if games == EXPECTED_GAMES[split] else f" (the json_2.1.1 release has {EXPECTED_GAMES[split]})"
            log(f"{split}: {games} games installed in {target}{note}")
    _write_manifest(dest, installed, source)
    return installed


MANIFEST = "arena-alfworld.json"


def _write_manifest(dest: Path, installed: list[InstalledSplit], source: str) -> None:
    """Record which archive each split came from (what ``arena data alfworld`` shows)."""
    path = dest / MANIFEST
    manifest = json.loads(path.read_text()) if path.is_file() else {}
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for item in installed:
        manifest[item.split] = {
            "archive": item.archive, "sha256": item.sha256, "games": item.games,
            "source": source, "installed": when,
        }
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def describe(root: Path, source: str) -> tuple[str, bool]:
    """A human summary of a data folder, and whether every split is present."""
    status = data_status(root)
    manifest_path = Path(root) / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    lines = [f"ALFWorld data folder: {root} ({_origin(source)})"]
    for split, games in status.items():
        if games == 0:
            lines.append(f"  {split:<13} missing")
            continue
        note = "" if games == EXPECTED_GAMES[split] else f" (json_2.1.1 has {EXPECTED_GAMES[split]})"
        origin = manifest.get(split, {})
        verified = f", verified {origin['archive']}" if origin else ""
        lines.append(f"  {split:<13} {games} games{note}{verified}")
    complete = all(status.values())
    if not complete:
        lines.append(INSTALL_HINT + ".")
    return "\n".join(lines), complete
