"""Environment worker processes: slow environments step outside the harness process.

The harness plays the episodes of a batch in threads (``eval.concurrency``) while the model
generates. An environment whose ``step`` is slow Python (tens of milliseconds) holds the GIL for
that time, so in-thread steps run one at a time and stall the threads that feed the model.
:class:`ProcessEnvironment` runs each episode inside one of N worker processes instead: a thread
waits on a pipe without holding the GIL, and N episodes step in parallel on N cores.

It works for any :class:`~arena.core.contract.env.Environment`: task lists come from a local instance
(cheap, no process needed), and each worker builds its own instance from a picklable factory
(e.g. ``functools.partial(MyEnvironment, data_dir=...)``) to play the episodes assigned to it.
Workers start on the first ``open`` (with the ``spawn`` method: the harness process has threads
and a model loaded, which ``fork`` would copy unsafely) and stop on ``close``.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from arena.core.contract.env import Environment, Episode, Instructions
from arena.core.contract.types import Observation, Task

#: Episode methods a worker runs on request (the :class:`Episode` interface).
_EPISODE_CALLS = ("reset", "step", "expert_action", "close")


class EnvWorkerError(RuntimeError):
    """A worker process failed: an exception in the environment (with the worker's traceback),
    or the worker died or hung (it is then replaced for later episodes)."""


# -- the worker process ---------------------------------------------------------------------


def _worker_main(conn: Connection, factory: Callable[[], Environment]) -> None:
    """Build the environment, then serve ``(op, episode_id, argument)`` requests until told to
    stop or the harness goes away."""
    # Ctrl-C reaches the whole process group; the harness decides, and stops its workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        env = factory()
    except BaseException as exc:  # report, so the harness can say why no worker started
        conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    conn.send(("ok", os.getpid()))
    episodes: dict[int, Episode] = {}
    while True:
        try:
            op, episode_id, argument = conn.recv()
        except (EOFError, OSError):  # the harness process ended
            break
        if op == "shutdown":
            break
        reply = serve_request(env, episodes, op, episode_id, argument)
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable result: nothing was written, say why instead
            conn.send(("error", f"cannot send the result of {op}: {type(exc).__name__}: {exc}",
                       traceback.format_exc()))
    close_all(env, episodes)


def serve_request(env: Environment, episodes: dict[int, Episode], op: str, episode_id: int,
                  argument: Any) -> tuple[Any, ...]:
    """Run one request against a worker's environment: ``("ok", result)``, or
    ``("error", message, traceback)`` so that the harness re-raises it with the worker's trace.
    Shared by worker processes and Ray actors (:mod:`arena.core.execution.executors`)."""
    try:
        if op == "open":
            episodes[episode_id] = env.open(argument)
            result: Any = None
        elif op == "close":
            episode = episodes.pop(episode_id, None)
            if episode is not None:
                episode.close()
            result = None
        elif op in _EPISODE_CALLS:
            method = getattr(episodes[episode_id], op)
            result = method() if argument is None else method(argument)
        else:
            raise ValueError(f"unknown worker request {op!r}")
    except BaseException as exc:
        return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    return ("ok", result)


def close_all(env: Environment, episodes: dict[int, Episode]) -> None:
    """A worker's last act: close its open episodes, then its environment."""
    for episode in episodes.values():
        try:
            episode.close()
        except Exception:
            pass
    episodes.clear()
    env.close()


def unwrap_reply(reply: tuple[Any, ...], worker_index: int) -> Any:
    """The result of a :func:`serve_request` reply, or its error raised as :class:`EnvWorkerError`."""
    if reply[0] == "ok":
        return reply[1]
    _, message, remote_traceback = reply
    raise EnvWorkerError(f"{message}\n--- in environment worker {worker_index} ---\n{remote_traceback}")


# -- the harness side -----------------------------------------------------------------------


class _Worker:
    """One worker process and its pipe; one request at a time (its lock)."""

    def __init__(self, context: Any, factory: Callable[[], Environment], index: int,
                 start_timeout_s: float) -> None:
        self.index = index
        self.lock = threading.Lock()
        self.open_episodes = 0
        self.opened = 0  # episodes ever opened here (for recycling)
        parent, child = context.Pipe(duplex=True)
        self.conn: Connection = parent
        self.process = context.Process(
            target=_worker_main, args=(child, factory), name=f"arena-env-worker-{index}", daemon=True
        )
        self.process.start()
        child.close()
        self.pid: int | None = None
        self._start_timeout_s = start_timeout_s

    def wait_ready(self) -> None:
        self.pid = self._receive(self._start_timeout_s, "start")

    def alive(self) -> bool:
        return self.process.is_alive() and not self.conn.closed

    def call(self, op: str, episode_id: int, argument: Any, timeout_s: float | None) -> Any:
        with self.lock:
            if not self.alive():
                raise EnvWorkerError(f"environment worker {self.index} is not running")
            try:
                self.conn.send((op, episode_id, argument))
            except (OSError, ValueError) as exc:
                self.kill()
                raise EnvWorkerError(f"environment worker {self.index} is gone ({exc})") from exc
            return self._receive(timeout_s, op)

    def _receive(self, timeout_s: float | None, op: str) -> Any:
        try:
            ready = self.conn.poll(timeout_s)
        except (OSError, EOFError):
            ready = True  # recv below reports the broken pipe
        if not ready:
            self.kill()
            raise EnvWorkerError(
                f"environment worker {self.index} did not answer '{op}' within {timeout_s:.0f} s; "
                "it was stopped (its episodes end with an error) and will be replaced."
            )
        try:
            reply = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.process.join(timeout=1)
            code = self.process.exitcode
            self.kill()
            raise EnvWorkerError(
                f"environment worker {self.index} died during '{op}' (exit code {code}); "
                "its episodes end with an error and it will be replaced."
            ) from exc
        return unwrap_reply(reply, self.index)

    def stop(self, timeout_s: float = 5.0) -> None:
        with self.lock:
            if self.alive():
                try:
                    self.conn.send(("shutdown", 0, None))
                except (OSError, ValueError):
                    pass
            self.process.join(timeout=timeout_s)
            self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()


class RemoteEpisode(Episode):
    """An episode that lives in a worker process; every call goes through the worker's pipe."""

    def __init__(self, owner: ProcessEnvironment, worker: _Worker, episode_id: int, task: Task) -> None:
        self.task = task
        self._owner = owner
        self._worker = worker
        self._episode_id = episode_id
        self._closed = False

    @property
    def worker_pid(self) -> int | None:
        """The process that plays this episode (for tests and diagnostics)."""
        return self._worker.pid

    def _call(self, op: str, argument: Any = None) -> Any:
        if self._closed:
            raise RuntimeError(f"episode of {self.task.task_id} is closed")
        return self._worker.call(op, self._episode_id, argument, self._owner.call_timeout_s)

    def reset(self) -> Observation:
        return self._call("reset")

    def step(self, action: str) -> Observation:
        return self._call("step", action)

    def expert_action(self) -> str | None:
        return self._call("expert_action")

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self._worker.alive():
                self._call("close")
        except EnvWorkerError:
            pass  # a dead worker took the episode with it
        finally:
            self._closed = True
            self._owner._released(self._worker)


class ProcessEnvironment(Environment):
    """Any environment, with its episodes played in ``workers`` worker processes.

    ``local`` answers for the task lists (and names the environment); ``factory()`` builds the
    environment inside each worker and must be picklable. An episode stays in the worker that
    opened it (its game state lives there); a new episode goes to the worker with the fewest
    open episodes. A worker that dies or hangs past ``call_timeout_s`` ends its episodes with
    :class:`EnvWorkerError` and is replaced on the next ``open``.

    ``recycle_after`` bounds the memory of environments that leak (native code that never frees
    a loaded game): a worker that has opened that many episodes takes no new ones, and stops
    once its last episode closes; a fresh process takes its place.
    """

    def __init__(
        self,
        local: Environment,
        factory: Callable[[], Environment],
        *,
        workers: int,
        start_method: str = "spawn",
        start_timeout_s: float = 300.0,
        call_timeout_s: float | None = 600.0,
        recycle_after: int | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if recycle_after is not None and recycle_after < 1:
            raise ValueError(f"recycle_after must be at least 1 (or None), got {recycle_after}")
        self.local = local
        self.name = local.name
        self.version = local.version
        self.max_steps = local.max_steps
        self.packages = local.packages
        self.factory = factory
        self.workers = int(workers)
        self.call_timeout_s = call_timeout_s
        self.recycle_after = recycle_after
        self._start_timeout_s = start_timeout_s
        self._context = multiprocessing.get_context(start_method)
        self._pool: list[_Worker] = []  # workers that take new episodes
        self._retiring: list[_Worker] = []  # recycled workers finishing their open episodes
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._started = itertools.count()
        self._finalizer = weakref.finalize(self, _stop_all, self._pool, self._retiring)

    # -- what the local instance answers --------------------------------------------------

    def draw_tests_with(self, salt: str) -> None:
        self.local.draw_tests_with(salt)  # tasks carry their layouts to the workers

    def split_names(self) -> list[str]:
        return self.local.split_names()

    def tasks(self, split: str) -> list[Task]:
        return self.local.tasks(split)

    def split_hash(self, split: str) -> str:
        return self.local.split_hash(split)

    def pool_tasks(self) -> list[Task]:
        return self.local.pool_tasks()

    def protocol_fields(self) -> dict[str, object]:
        return self.local.protocol_fields()

    def instructions(self) -> Instructions:
        return self.local.instructions()

    def __getattr__(self, name: str) -> Any:
        # Anything else of the wrapped environment (e.g. its own settings) reads through.
        if name in ("local", "_pool", "_retiring"):
            raise AttributeError(name)
        return getattr(self.local, name)

    # -- episodes in workers ----------------------------------------------------------------

    @property
    def started(self) -> bool:
        return bool(self._pool or self._retiring)

    def worker_pids(self) -> list[int | None]:
        """Processes of the workers that take new episodes."""
        return [worker.pid for worker in self._pool]

    def _new_worker(self, index: int) -> _Worker:
        """Start one worker (not yet ready); another executor overrides this alone."""
        return _Worker(self._context, self.factory, index, self._start_timeout_s)

    def _start_missing(self) -> None:
        """Start workers until the pool is full, replacing dead ones; all start in parallel."""
        # A dead worker's episodes already fail on their next call; drop it from the pool.
        self._pool[:] = [w for w in self._pool if w.alive()]
        new = [self._new_worker(next(self._started)) for _ in range(self.workers - len(self._pool))]
        try:
            for worker in new:
                worker.wait_ready()
        except EnvWorkerError as exc:
            for worker in new:
                worker.kill()
            raise EnvWorkerError(f"Environment worker failed to start: {exc}") from exc
        self._pool.extend(new)

    def open(self, task: Task) -> RemoteEpisode:
        with self._lock:
            if len(self._pool) < self.workers or not all(w.alive() for w in self._pool):
                self._start_missing()
            worker = min(self._pool, key=lambda w: (w.open_episodes, w.index))
            worker.open_episodes += 1
            worker.opened += 1
            if self.recycle_after is not None and worker.opened >= self.recycle_after:
                self._pool.remove(worker)  # the next open starts its replacement
                self._retiring.append(worker)
            episode_id = next(self._ids)
        try:
            worker.call("open", episode_id, task, self.call_timeout_s)
        except BaseException:
            self._released(worker)
            raise
        return RemoteEpisode(self, worker, episode_id, task)

    def _released(self, worker: _Worker) -> None:
        with self._lock:
            worker.open_episodes = max(0, worker.open_episodes - 1)
            done = worker in self._retiring and worker.open_episodes == 0
            if done:
                self._retiring.remove(worker)
        if done:
            worker.stop()

    def close(self) -> None:
        """Stop the workers (a later ``open`` starts new ones) and close the local instance."""
        with self._lock:
            _stop_all(self._pool, self._retiring)
        self.local.close()


def _stop_all(*pools: list[_Worker]) -> None:
    for pool in pools:
        for worker in pool:
            worker.stop()
        pool.clear()
