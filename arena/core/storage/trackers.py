"""Experiment trackers: the figures of ``metrics.jsonl`` sent, as they are logged, to TensorBoard,
Weights & Biases (offline), MLflow (a local file store) or trackio (its local database), each
through the tool's own library and writing under ``<run>/trackers/``. None of them needs the
network; each is an optional install (``pip install 'arena[trackers]'``).

A figure ``success`` of the learning phase is logged as ``learn/success`` at its step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

INSTALL_HINT = "pip install 'arena[trackers]'"
#: The package each tracker imports, for the install hint.
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}


class TrackerUnavailable(ImportError):
    """A tracker named in ``logging.trackers`` whose library is not installed."""


class Tracker(Protocol):
    def log(self, phase: str, step: int, metrics: Mapping[str, int | float | bool]) -> None: ...

    def close(self) -> None: ...


def _named(phase: str, metrics: Mapping[str, int | float | bool]) -> dict[str, float]:
    return {f"{phase}/{name}": float(value) for name, value in metrics.items()}


def _require(name: str) -> Any:
    import importlib

    module = "torch.utils.tensorboard" if name == "tensorboard" else name
    try:
        if name == "tensorboard":
            importlib.import_module("tensorboard")
        return importlib.import_module(module)
    except ImportError as exc:
        raise TrackerUnavailable(f"logging.trackers names {name}, but {PACKAGES[name]} is not installed: "
                                 f"{INSTALL_HINT} (or drop {name} from logging.trackers).") from exc


class TensorBoardTracker:
    def __init__(self, folder: Path, label: str, config: Mapping[str, Any], project: str) -> None:
        summary = _require("tensorboard")
        self._writer = summary.SummaryWriter(log_dir=str(folder / "tensorboard"))

    def log(self, phase: str, step: int, metrics: Mapping[str, int | float | bool]) -> None:
        for name, value in _named(phase, metrics).items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    def __init__(self, folder: Path, label: str, config: Mapping[str, Any], project: str) -> None:
        (folder / "wandb").mkdir(parents=True, exist_ok=True)
        for variable, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                              ("WANDB_DATA_DIR", "data")):  # the run's folder, not the home folder
            os.environ.setdefault(variable, str(folder / "wandb" / sub))
        wandb = _require("wandb")
        self._run = wandb.init(project=project, name=label, dir=str(folder / "wandb"), mode="offline",
                               config=dict(config), reinit="create_new")

    def log(self, phase: str, step: int, metrics: Mapping[str, int | float | bool]) -> None:
        # W&B's step must only grow; each phase keeps its own step as a metric of its own.
        self._run.log({**_named(phase, metrics), f"{phase}/step": step})

    def close(self) -> None:
        self._run.finish()


class MLflowTracker:
    def __init__(self, folder: Path, label: str, config: Mapping[str, Any], project: str) -> None:
        # MLflow's file store, in maintenance mode upstream, is opt-in since MLflow 3; its database
        # store would need SQLAlchemy and Alembic besides mlflow-skinny.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow = _require("mlflow")
        self._client = mlflow.MlflowClient(tracking_uri=(folder / "mlflow").resolve().as_uri())
        experiment = self._client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(project)
        self._run_id = self._client.create_run(experiment_id, run_name=label).info.run_id

    def log(self, phase: str, step: int, metrics: Mapping[str, int | float | bool]) -> None:
        for name, value in _named(phase, metrics).items():
            self._client.log_metric(self._run_id, name.replace("/", "."), value, step=step)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


class TrackioTracker:
    """trackio fixes its folder when first imported (``$TRACKIO_DIR``, else its cache in the home
    folder): in an ``arena run`` process that is ``<run>/trackers/trackio``, unless the user set
    ``TRACKIO_DIR`` or imported trackio before."""

    def __init__(self, folder: Path, label: str, config: Mapping[str, Any], project: str) -> None:
        os.environ.setdefault("TRACKIO_DIR", str(folder / "trackio"))
        self._trackio = _require("trackio")
        self._run = self._trackio.init(project=project, name=label, config=dict(config))

    def log(self, phase: str, step: int, metrics: Mapping[str, int | float | bool]) -> None:
        self._trackio.log(_named(phase, metrics), step=step)

    def close(self) -> None:
        self._trackio.finish()


MAKERS: dict[str, Callable[[Path, str, Mapping[str, Any], str], Tracker]] = {
    "tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MLflowTracker,
    "trackio": TrackioTracker}
#: The experiment trackers ``logging.trackers`` may name.
TRACKER_NAMES = tuple(MAKERS)


def make_trackers(names: list[str], folder: Path, label: str, config: Mapping[str, Any],
                  project: str) -> list[Tracker]:
    """The trackers ``names`` (``logging.trackers``), writing under ``folder``."""
    trackers: list[Tracker] = []
    try:
        for name in names:
            trackers.append(MAKERS[name](folder, label, config, project))
    except BaseException:
        for tracker in trackers:
            tracker.close()
        raise
    return trackers
