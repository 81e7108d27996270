"""Executors: where the environments of a run's episodes live (``executor.name``).

``local`` (the default) keeps them in the harness process, or in the environment's own worker
processes where it has them (an environment's ``env.workers``). ``ray`` puts them in Ray actors, on
this machine or across a cluster (``executor.ray.address``), so that a slow environment scales
past one machine's cores.

The harness process still drives every episode (its threads run ``retrieve -> solve -> extract
-> update``) and still owns the model; only the environment's state and its ``reset``/``step``
move to the actors. The model goes further out the same way a run already allows: serve it
(vLLM's OpenAI server on the cluster) and set ``llm.backend=openai``. Because an episode's
environment is deterministic given its task and the model's calls do not change, a run gives
the same episodes, step for step, under either executor (a test checks this).

Ray actors speak the same request protocol as worker processes
(:func:`arena.core.execution.env_workers.serve_request`) and plug into the same pool
(:class:`~arena.core.execution.env_workers.ProcessEnvironment`): least-loaded placement, an episode kept
in the actor that opened it, a dead or hung actor replaced, recycling.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import warnings
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from arena.core.config.registry import UnknownNameError, did_you_mean
from arena.core.contract.env import Environment, Episode
from arena.core.contract.settings import Settings
from arena.core.execution.env_workers import (
    EnvWorkerError,
    ProcessEnvironment,
    close_all,
    serve_request,
    unwrap_reply,
)

EXECUTORS = ("local", "ray")

RAY_MISSING = (
    "executor.name=ray needs Ray: pip install 'arena[ray]' (ray==2.60.0 on this machine and on "
    "every node of the cluster), or use executor.name=local."
)


def build_environment(registry: Any, cfg: DictConfig, settings: Settings) -> Environment:
    """The run's environment (its section of ``cfg``) under the configured executor."""
    name = settings.executor.name
    entry = registry.get(settings.env.name)
    if name == "local":
        return entry.factory(cfg.env)
    if name == "ray":
        env_cfg = in_process_config(cfg.env)
        ray = settings.executor.ray
        return RayEnvironment(
            entry.factory(env_cfg),
            # the plugin's own factory, pickled by reference: an actor imports the environment's
            # module alone, not every plugin (and torch with them)
            functools.partial(entry.factory, env_cfg),
            actors=ray.actors or settings.eval.concurrency,
            address=ray.address,
            num_cpus=ray.num_cpus,
            actor_cpus=ray.actor_cpus,
            call_timeout_s=ray.call_timeout_s,
            recycle_after=env_cfg.get("recycle_workers_after"),
        )
    raise UnknownNameError(did_you_mean("executor", name, list(EXECUTORS))
                           + " (set executor.name)")


def in_process_config(env_cfg: DictConfig) -> DictConfig:
    """The environment's config for one actor: an environment with worker processes of its own
    (``workers``) plays in-process there, since the actors are its workers."""
    cfg = OmegaConf.create(OmegaConf.to_container(env_cfg, resolve=True))
    assert isinstance(cfg, DictConfig)
    if "workers" in cfg:
        cfg.workers = 0
    return cfg


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(RAY_MISSING) from exc
    return ray


class EnvironmentActor:
    """The body of one Ray actor: an environment and its open episodes (wrapped by
    ``ray.remote`` at run time, so that this module imports without Ray)."""

    def __init__(self, factory: Callable[[], Environment]) -> None:
        self.episodes: dict[int, Episode] = {}
        self.env: Environment | None = None
        self.start_error: tuple[str, str, str] | None = None
        try:
            self.env = factory()
        except BaseException as exc:  # reported by ready(), with the actor's traceback
            import traceback

            self.start_error = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())

    def ready(self) -> tuple[Any, ...]:
        if self.start_error is not None:
            return self.start_error
        return ("ok", (os.getpid(), socket.gethostname()))

    def handle(self, op: str, episode_id: int, argument: Any) -> tuple[Any, ...]:
        assert self.env is not None, "ready() reports a failed start before any request"
        return serve_request(self.env, self.episodes, op, episode_id, argument)

    def shutdown(self) -> None:
        if self.env is not None:
            close_all(self.env, self.episodes)


class _RayWorker:
    """One environment actor behind the worker interface the pool uses (``call``, ``alive``,
    ``stop``...). Calls to one actor run one at a time (Ray's default for an actor)."""

    def __init__(self, actor_class: Any, factory: Callable[[], Environment], index: int,
                 start_timeout_s: float) -> None:
        self._ray = _import_ray()
        self.index = index
        self.open_episodes = 0
        self.opened = 0
        self.pid: int | None = None
        self.node: str | None = None
        self._dead = False
        self._start_timeout_s = start_timeout_s
        self.actor = actor_class.remote(factory)

    def wait_ready(self) -> None:
        self.pid, self.node = self._get(self.actor.ready.remote(), self._start_timeout_s, "start")

    def alive(self) -> bool:
        return not self._dead

    def call(self, op: str, episode_id: int, argument: Any, timeout_s: float | None) -> Any:
        if self._dead:
            raise EnvWorkerError(f"environment actor {self.index} is not running")
        return self._get(self.actor.handle.remote(op, episode_id, argument), timeout_s, op)

    def _get(self, ref: Any, timeout_s: float | None, op: str) -> Any:
        exceptions = self._ray.exceptions
        try:
            reply = self._ray.get(ref, timeout=timeout_s)
        except exceptions.GetTimeoutError as exc:
            self.kill()
            if op == "start":
                raise EnvWorkerError(
                    f"environment actor {self.index} did not start within {timeout_s:.0f} s: "
                    "Ray may have no free CPUs for it (each takes executor.ray.actor_cpus; "
                    "lower executor.ray.actors or add nodes), or building the environment is slow."
                ) from exc
            raise EnvWorkerError(
                f"environment actor {self.index} did not answer '{op}' within {timeout_s:.0f} s; "
                "it was stopped (its episodes end with an error) and will be replaced. Raise "
                "executor.ray.call_timeout_s if the environment is just slow."
            ) from exc
        except exceptions.RayError as exc:  # the actor died, or Ray lost the call
            self.kill()
            cause = str(exc).strip().splitlines()
            raise EnvWorkerError(
                f"environment actor {self.index} died during '{op}' ({type(exc).__name__}: "
                f"{cause[0][:300] if cause else 'no detail'}); its episodes end with an error "
                "and it will be replaced."
            ) from exc
        return unwrap_reply(reply, self.index)

    def stop(self, timeout_s: float = 5.0) -> None:
        if not self._dead:
            try:
                self._ray.get(self.actor.shutdown.remote(), timeout=timeout_s)
            except Exception:
                pass  # dead, stuck or Ray already down: killed below either way
        self.kill()

    def kill(self) -> None:
        if not self._dead:
            self._dead = True
            try:
                self._ray.kill(self.actor, no_restart=True)
            except Exception:  # already gone
                pass


class RayEnvironment(ProcessEnvironment):
    """Any environment, with its episodes played in ``actors`` Ray actors.

    ``local`` answers for the task lists; ``factory()`` builds the environment inside each actor
    (cloudpickled to the node that runs it, which must have Arena and the environment's
    packages installed). Ray starts on the first episode: a local Ray of ``num_cpus`` CPUs, or a
    connection to the running cluster at ``address`` (e.g. ``"auto"`` or ``"ray://head:10001"``).
    Each actor reserves ``actor_cpus`` CPUs, so Ray places them where cores are free.
    """

    _ray_lock = threading.Lock()

    def __init__(
        self,
        local: Environment,
        factory: Callable[[], Environment],
        *,
        actors: int,
        address: str | None = None,
        num_cpus: int | None = None,
        actor_cpus: float = 1.0,
        start_timeout_s: float = 300.0,
        call_timeout_s: float | None = 600.0,
        recycle_after: int | None = None,
    ) -> None:
        _import_ray()  # fail at set-up, with the install hint, not at the first episode
        super().__init__(local, factory, workers=actors, start_timeout_s=start_timeout_s,
                         call_timeout_s=call_timeout_s, recycle_after=recycle_after)
        self.address = address
        self.num_cpus = num_cpus
        self.actor_cpus = actor_cpus
        self._actor_class: Any = None
        self._started_ray = False

    def _ensure_ray(self) -> Any:
        ray = _import_ray()
        with self._ray_lock:
            if not ray.is_initialized():
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                options: dict[str, Any] = {
                    "include_dashboard": False,
                    "logging_level": logging.WARNING,
                    "log_to_driver": False,
                }
                if self.address:
                    ray.init(address=self.address, **options)
                else:
                    ray.init(num_cpus=self.num_cpus, **options)
                self._started_ray = True
            if self._actor_class is None:
                self._actor_class = ray.remote(num_cpus=self.actor_cpus)(EnvironmentActor)
                self._fit_to_cluster(ray)
        return ray

    def _fit_to_cluster(self, ray: Any) -> None:
        """Fewer actors when the cluster cannot place them all: an actor waiting for CPUs would
        stall its episodes until the start timeout."""
        cpus = float(ray.cluster_resources().get("CPU", 0))
        room = int(cpus // self.actor_cpus) if self.actor_cpus > 0 else self.workers
        if 1 <= room < self.workers:
            warnings.warn(
                f"Ray has {cpus:g} CPUs, room for {room} environment actors of "
                f"{self.actor_cpus:g} CPU each, not {self.workers}: using {room}. Set "
                "executor.ray.actors (or actor_cpus) to choose.", stacklevel=3)
            self.workers = room

    def _start_missing(self) -> None:
        self._ensure_ray()  # first: it may lower the number of actors to start
        super()._start_missing()

    def _new_worker(self, index: int) -> _RayWorker:  # type: ignore[override]
        return _RayWorker(self._actor_class, self.factory, index, self._start_timeout_s)

    def worker_nodes(self) -> list[str | None]:
        """Hosts of the actors that take new episodes (for diagnostics and tests)."""
        return [getattr(worker, "node", None) for worker in self._pool]

    def close(self) -> None:
        """Stop the actors, and the local Ray if this environment started it."""
        super().close()
        if self._started_ray:
            ray = _import_ray()
            if ray.is_initialized():
                ray.shutdown()
            self._started_ray = False
            self._actor_class = None
