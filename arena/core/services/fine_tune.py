"""``run.fine_tune``: supervised fine-tunes of the served model, made and kept by the harness.

A method hands the harness prompt -> completion rows and its SFT settings (plain data, so an
isolated method does it from its worker); the harness trains the model it serves
(:func:`arena.core.rl.sft.train_sft`), serves the result and keeps the update in the method's
folder as a numbered series (``fine-tune-00001/``: the LoRA adapter or the full weights, then
``fine-tune.json``, written last: the fine-tune is kept once it exists). Every session restores
the kept fine-tunes, in order, before the method is built (:meth:`FineTunes.restore`), so a
resumed, continued or re-evaluated run serves the fine-tuned weights without the method
remembering them, and an isolated method's rebuilt worker finds them served (the model never
left the harness).

Exactly once: a kill after a fine-tune is kept and before the method's state counts it makes the
method ask for it again. The first fine-tune a session asks for that repeats the newest one this
run kept (same rows, settings and seed) is that rerun: its recorded metrics are returned and
nothing is trained again. A continued run's copies are marked inherited (:func:`mark_inherited`):
they are restored, never taken for a rerun.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from arena.core.contract.llm import TrainableBackend
from arena.core.storage.files import read_json, write_json_atomic
from arena.core.storage.journal import crash_point
from arena.core.storage.method_state import Checkpoints

#: The series' prefix in the method's folder: ``fine-tune-00001``, ``fine-tune-00002``, ...
PREFIX = "fine-tune"
#: A kept fine-tune's record, in its folder: its key, its metrics, whether it was inherited.
RECORD = "fine-tune.json"
#: What ``settings`` must name (``arena.core.rl.sft.train_sft``'s required keys).
REQUIRED = ("steps", "batch_size", "lr")


def fine_tune_key(rows: list[dict[str, Any]], settings: dict[str, Any], seed: int) -> str:
    """What tells a fine-tune's rerun from another fine-tune: its rows, settings and seed."""
    try:
        text = json.dumps({"rows": rows, "settings": settings, "seed": seed}, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"run.fine_tune takes plain data: rows of prompt/completion dicts "
                        f"(arena.rl.sft.example) and a settings mapping; {exc}") from exc
    return hashlib.sha256(text.encode()).hexdigest()


def checked(rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> tuple[list[dict[str, Any]],
                                                                                 dict[str, Any]]:
    """``rows`` and ``settings`` as plain data, refused (naming the fix) where SFT cannot use them."""
    from arena.core.rl.trainer import plain_data  # here: the trainer's module imports torch

    plain_rows = plain_data(list(rows))
    if not plain_rows or not all(isinstance(row, dict) for row in plain_rows):
        raise ValueError("run.fine_tune needs at least one row, each a prompt/completion dict "
                         "(arena.rl.sft.example(prompt, completion)).")
    plain_settings = plain_data(settings)
    missing = [key for key in REQUIRED if key not in plain_settings]
    if missing:
        raise ValueError(f"run.fine_tune's settings name no {', '.join(missing)}: pass the method's SFT "
                         f"section with {', '.join(REQUIRED)} (and lora, max_length, ... as "
                         "arena.rl.sft.train_sft reads them).")
    return plain_rows, plain_settings


class FineTunes:
    """The served model's fine-tunes kept in the method's folder (see the module docstring)."""

    def __init__(self, method_folder: Path) -> None:
        self.series = Checkpoints(method_folder, PREFIX)
        #: The newest fine-tune this run kept, restored this session: the one a rerun repeats.
        self._rerun: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def kept(self) -> list[tuple[Path, dict[str, Any]]]:
        """(folder, record) of each kept fine-tune, oldest first."""
        if not self.series.folder.is_dir():
            return []
        folders = sorted(path for path in self.series.folder.glob(f"{PREFIX}-*")
                         if path.name.rsplit("-", 1)[1].isdigit())
        return [(folder, read_json(folder / RECORD, "a fine-tune's record"))
                for folder in folders if (folder / RECORD).is_file()]

    def restore(self, backend: Callable[[], TrainableBackend]) -> int:
        """Apply every kept fine-tune to the freshly loaded served model, in order (``backend``
        is asked for only if there is one); how many."""
        from arena.core.rl import sft

        kept = self.kept()
        if kept:
            served = backend()
            for folder, _ in kept:
                served.model = sft.restore(served.model, self.series.path(int(folder.name.rsplit("-", 1)[1])))
            served.mark_weights_changed()
        newest = kept[-1][1] if kept else None
        self._rerun = newest if newest is not None and not newest.get("inherited") else None
        return len(kept)

    def train(self, backend: TrainableBackend, rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any], *,
              seed: int, on_step: Callable[[int, int], object] | None = None) -> dict[str, float]:
        """Fine-tune ``backend``'s model on ``rows``, serve the result and keep it; its metrics."""
        from arena.core.rl import sft

        plain_rows, plain_settings = checked(rows, settings)
        key = fine_tune_key(plain_rows, plain_settings, seed)
        with self._lock:
            rerun, self._rerun = self._rerun, None
            if rerun is not None and rerun.get("key") == key:
                return {name: float(value) for name, value in rerun["metrics"].items()}
            kept = self.kept()
            number = int(kept[-1][0].name.rsplit("-", 1)[1]) + 1 if kept else 1
            folder = self.series.path(number)  # refused where it is a link out of the method's folder
            shutil.rmtree(folder, ignore_errors=True)  # what a kill mid-way left of it
            model, metrics = sft.train_sft(backend.model, backend.tokenizer, plain_rows, plain_settings, folder,
                                           seed, on_step=on_step)
            backend.model = model
            backend.mark_weights_changed()
            write_json_atomic(self.series.path(number) / RECORD, {"key": key, "metrics": metrics})
            crash_point("fine_tune.kept")  # kept, the method's state not yet saved
            return dict(metrics)


def mark_inherited(method_folder: Path) -> None:
    """A continued run's copies of its source's fine-tunes: restored, never a rerun of its own."""
    for folder, record in FineTunes(method_folder).kept():
        if not record.get("inherited"):
            write_json_atomic(folder / RECORD, {**record, "inherited": True})
