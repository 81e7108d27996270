"""``run.isolation: process``: the method's hooks run in a worker process of their own.

The worker holds the method and nothing of the harness: no environment, no test payloads, no
record, no run context. Its ``run`` is a :class:`~arena.core.isolation.rpc.Proxy` of the harness's, which
answers only the names of the public :class:`~arena.core.contract.run_api.Run` protocol (and of the
objects it hands out: the store, the LLM, the budget, ...); any other name is refused and
recorded as a violation. The model stays with the harness, which serves ``choose`` and
``generate``; episodes are played by the harness, which calls the method's policy back in the
worker. What the worker sends is built by :class:`~arena.core.isolation.rpc.SafeUnpickler`, so it can
carry data and the run's own types, never code.

A hook that overruns ``run.isolation_limits.hook_seconds`` or a worker that dies ends that
episode as an error: the worker is replaced by a new one, built from the method's saved state
as ``--resume`` builds it. A method trains the served model through ``run.trainer(...)``, whose
trainer stays with the harness, and fine-tunes it through ``run.fine_tune(rows, settings)``, which
the harness runs and keeps (restored by the harness when a run resumes; a rebuilt worker finds the
model as it was left); ``run.trainable_backend()`` (the model itself, for a method's own training
code) is not offered to a worker (:data:`WITHHELD` says so, with the fix).

Nothing secret crosses to the worker: it starts with an allow-listed environment
(:func:`worker_environment`, never the variable of ``eval.salt=env:NAME``), in PID and mount
namespaces of its own where the kernel lets ``unshare`` make them (:func:`namespace_command`), so
the harness's ``/proc`` entry (its environment, its command line) does not exist for it, and its
Landlock ruleset grants ``/proc`` of the worker alone. What it sends back is plain data: a
reference to one of its objects is accepted only as a policy or callback
(:data:`CALLABLE_PARAMETERS`, :data:`CALLABLE_FIELDS`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import multiprocessing.connection
import os
import pickle
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import types
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import pluggy
from omegaconf import DictConfig, ListConfig

from arena.core.contract.env import Episode, Instructions
from arena.core.contract.llm import LLMBackend
from arena.core.contract.run_api import BudgetView, EpisodeRequest, Run, Store, protocol_names
from arena.core.contract.settings import Settings
from arena.core.execution import salt
from arena.core.execution.budget import Budget
from arena.core.execution.context import RunContext
from arena.core.execution.views import EnvironmentView
from arena.core.isolation import rpc
from arena.core.services.batching import BatchingBackend
from arena.core.services.embedder import Embedder
from arena.core.services.progress import ProgressTask
from arena.core.services.run_services import GuardedStore
from arena.core.storage.method_state import Checkpoints, MethodState, OutsideFolder

#: The method hooks a worker serves (``register_*`` stay in the harness: they build nothing).
HOOKS = ("learn", "extract", "retrieve", "solve", "update", "episode_end", "state_digest", "state_size",
         "export", "evaluation_variants")
#: Modules whose classes the worker's data may build in the harness (plus numpy's arrays).
WORKER_DATA_MODULES = ("arena.core.contract.types", "arena.core.contract.llm", "arena.core.contract.run_api",
                       "arena.core.contract.errors", "arena.core.contract.settings", "arena.core.isolation.rpc",
                       "arena.core.execution.solver", "arena.core.rl.data")
#: Top-level packages whose objects the harness sends by value (plain data and configs).
HARNESS_DATA_PACKAGES = ("builtins", "collections", "typing", "omegaconf", "numpy")


#: Names of the ``Run`` protocol a worker is refused, with why and the fix (its message says them).
WITHHELD = {
    "RunContext.trainable_backend": (
        "run.trainable_backend() is the served model itself, which stays with the harness. Train it "
        "through run.fine_tune(rows, settings) (supervised) or run.trainer(settings) (policy updates), "
        "or run the method in Arena's process (run.isolation=in_process)."),
}

#: What the worker may use of the run's LLM (and of an auxiliary one).
LLM_NAMES = frozenset({"generate", "choose", "count_tokens", "describe", "name", "max_context", "usage",
                       "model_id"})

#: What the worker may use of each harness object it is handed, by the object's class.
OFFERED: tuple[tuple[type, frozenset[str]], ...] = (
    (RunContext, protocol_names(Run) - {"trainable_backend"}),
    (GuardedStore, protocol_names(Store)),
    (Budget, protocol_names(BudgetView)),
    # ``enter``/``leave``: a method's own threads (``arena.run_in_threads``) join the batches.
    (BatchingBackend, LLM_NAMES | {"enter", "leave"}),
    (LLMBackend, LLM_NAMES),
    (Embedder, frozenset({"embed", "similarity", "describe", "name", "dim"})),
    (EnvironmentView, frozenset({"name", "version", "max_steps", "instructions", "split_names", "tasks",
                                 "pool_tasks", "split_hash", "protocol_fields", "open", "close"})),
    (Episode, frozenset({"task", "reset", "step", "expert_action", "close"})),
    (MethodState, protocol_names(MethodState)),
    (Checkpoints, protocol_names(Checkpoints)),
    (ProgressTask, protocol_names(ProgressTask) | {"__enter__", "__exit__"}),
)
#: The same, for classes named by path: their modules import torch, which the harness loads only
#: when a run needs it.
OFFERED_BY_NAME: dict[str, frozenset[str]] = {
    "arena.core.rl.checkpointed.CheckpointedTrainer":
        frozenset({"resume", "update", "save", "serve", "trainable_parameters"}),
}


#: Where the worker may pass a callable of its own (a proxy in the harness): these arguments of
#: these methods of the harness's objects (class path and method name), by name or position.
CALLABLE_PARAMETERS: dict[str, frozenset[str]] = {
    "arena.core.execution.context.RunContext.play": frozenset({"on_done"}),
    "arena.core.rl.checkpointed.CheckpointedTrainer.update": frozenset({"progress"}),
}
#: ... and these fields of an argument (or of an item of a list argument) of any call.
CALLABLE_FIELDS: dict[type, frozenset[str]] = {EpisodeRequest: frozenset({"policy"})}


def harness_export(obj: Any) -> frozenset[str] | None:
    """How the harness sends ``obj`` to the worker: by reference with the names offered for its
    class, by value for plain data, or not at all (TypeError naming it)."""
    for klass, names in OFFERED:
        if isinstance(obj, klass):
            return names
    by_name = OFFERED_BY_NAME.get(f"{type(obj).__module__}.{type(obj).__qualname__}")
    if by_name is not None:
        return by_name
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        return None  # pickled by name: the worker imports the same code
    if isinstance(obj, (DictConfig, ListConfig, np.ndarray, np.generic, PurePath, enum.Enum, Instructions,
                        pickle.PickleBuffer)):
        return None
    module = type(obj).__module__
    if module.split(".")[0] in HARNESS_DATA_PACKAGES or module in WORKER_DATA_MODULES \
            or isinstance(obj, BaseException):
        return None
    raise TypeError(f"{type(obj).__module__}.{type(obj).__qualname__} is not handed to an isolated method "
                    "(run.isolation=process): only the Run protocol's objects and plain data are.")


#: Besides ``__call__``, what the harness calls on a worker's policy that has it: ``start(episode)``,
#: which hands a learning episode to a policy that reads it (an expert, a demonstration recorder).
POLICY_METHODS = ("start",)


def worker_export(obj: Any) -> frozenset[str] | None:
    """The worker's callables (policies, callbacks) go by reference; the rest by value."""
    if callable(obj) and not isinstance(obj, type) and not dataclasses.is_dataclass(obj) \
            and not isinstance(obj, BaseException):
        return frozenset({"__call__", *(name for name in POLICY_METHODS if callable(getattr(obj, name, None)))})
    return None


# -- the worker process -----------------------------------------------------------------------

class WorkerHost:
    """The worker's root object: builds the method against the harness's ``run`` and serves
    its hooks."""

    def __init__(self, factory: Callable[[Any], Any], sandbox: str) -> None:
        self.factory = factory
        self.sandbox = sandbox
        self.method: Any = None

    def build(self, run: Any) -> tuple[dict[str, dict[str, Any]], str]:
        """Build the method; return the hooks it implements (with their pluggy options) and the
        sandbox this process runs in."""
        self.method = self.factory(run)
        implemented = {}
        for name in HOOKS:
            function = getattr(self.method, name, None)
            options = getattr(function, "arena_impl", None)
            if function is not None and options is not None:
                implemented[name] = {"params": _parameters(function),
                                     "tryfirst": bool(options.get("tryfirst")),
                                     "trylast": bool(options.get("trylast"))}
        return implemented, self.sandbox

    def hook(self, name: str, kwargs: dict[str, Any]) -> Any:
        return getattr(self.method, name)(**kwargs)


def _parameters(function: Callable[..., Any]) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _portable_error(exc: BaseException) -> BaseException:
    """What the worker sends of an exception: the harness's own types as they are, any other
    type as a RemoteError (its class may not exist, or be allowed, in the harness)."""
    module = type(exc).__module__
    if module == "builtins" or module in WORKER_DATA_MODULES:
        return exc
    return rpc.portable(exc)


#: Folders of the system a Python process reads (libraries, certificates, time zones). Not
#: ``/proc/self``: resolved here it is the harness's own entry; the worker adds its own
#: (:func:`apply_sandbox`).
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/bin", "/etc", "/dev/urandom", "/dev/random",
               "/sys/devices/system/cpu")

#: The harness's environment variables a worker starts with: what Python needs to start and
#: import, the locale, and the thread counts of numeric libraries (an isolated run computes as one
#: in Arena's process does). Nothing else: no credential, no ``eval.salt=env:NAME``.
WORKER_ENVIRONMENT = frozenset({
    "PATH", "HOME", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME",
    "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH", "PYTHONWARNINGS", "PYTHONFAULTHANDLER", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "TOKENIZERS_PARALLELISM"})


def worker_environment(folder: str, withheld: frozenset[str] = frozenset()) -> dict[str, str]:
    """The environment a worker starts with: :data:`WORKER_ENVIRONMENT` and ``LC_*`` of the
    harness's, less ``withheld`` (the variable a board's salt is read from), and its caches and
    temporary files in its own ``folder``, offline."""
    kept = {name: value for name, value in os.environ.items()
            if (name in WORKER_ENVIRONMENT or name.startswith("LC_")) and name not in withheld}
    return {**kept, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TMPDIR": folder,
            "XDG_CACHE_HOME": folder, "MPLCONFIGDIR": folder}


def withheld_variables(cfg: Any) -> frozenset[str]:
    """The environment variables a run's config names as secret: ``eval.salt=env:NAME``'s."""
    try:
        mode = salt.mode_of(Settings.of(cfg))
    except Exception:  # not a run's config (a test's stand-in): nothing named
        return frozenset()
    return frozenset({mode[len("env:"):]}) if mode.startswith("env:") else frozenset()


#: ``unshare`` (util-linux) options for a worker of its own PID and mount namespaces, a fresh
#: ``/proc`` that shows only its processes, killed with ``unshare`` whatever ends it. Tried in
#: order: with a user namespace too (its root holds no capability outside), then without (root).
NAMESPACE_OPTIONS = (
    ("--user", "--map-root-user", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child"),
    ("--pid", "--mount", "--fork", "--mount-proc", "--kill-child"),
)


@functools.lru_cache(maxsize=1)
def namespace_command() -> tuple[tuple[str, ...], str]:
    """The command that starts a worker in namespaces of its own, and what it makes (``own
    user+pid+mount namespaces (unshare)``); ``()`` and why not where this system cannot make them
    (no ``unshare``, a kernel or container that refuses). Tried once per process."""
    unshare = shutil.which("unshare")
    if sys.platform != "linux" or unshare is None:
        return (), "no namespaces (util-linux unshare not found)"
    why = ""
    for options in NAMESPACE_OPTIONS:
        if os.geteuid() != 0 and "--user" not in options:
            continue
        try:
            done = subprocess.run([unshare, *options, "true"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = str(exc)
            continue
        if done.returncode == 0:
            users = "user+" if "--user" in options else ""
            return (unshare, *options), f"own {users}pid+mount namespaces (unshare)"
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return (), f"no namespaces ({why})"


def readable_roots(run_path: Path, roots: list[str]) -> list[str]:
    """The folders the worker may read: ``roots`` (Python's own and its import path), with the
    run directory cut out. A root that holds the run directory (an editable install's project
    folder holding ``runs/``) is replaced by its entries, except the one on the way to the run,
    level by level down to the run directory, of which nothing is readable (its ``method/``
    folder is granted on its own). An entry that is a link to the run directory or to a folder
    holding it (pytest's ``pytest-current``, a ``latest`` link beside the runs) is cut out as
    well: Landlock grants what a link points to."""
    run_path = run_path.resolve()

    def holds_the_run(path: Path) -> bool:
        target = path.resolve()
        return target == run_path or target in run_path.parents

    granted: list[str] = []
    for root in dict.fromkeys(str(Path(r).resolve()) for r in roots if r and Path(r).exists()):
        folder = Path(root)
        if not holds_the_run(folder):
            granted.append(root)
            continue
        while folder != run_path:
            toward = folder / run_path.relative_to(folder).parts[0]
            granted.extend(str(entry) for entry in folder.iterdir()
                           if entry != toward and not holds_the_run(entry))
            folder = toward
    return granted


def package_folders(*modules: str) -> list[str]:
    """The folders the top-level packages of ``modules`` import from: an editable install's
    source folder is not on the import path (a finder maps it), yet the worker imports from it."""
    folders = []
    for name in modules:
        top = sys.modules.get(name.split(".")[0])
        for folder in getattr(top, "__path__", None) or [os.path.dirname(getattr(top, "__file__", "") or "")]:
            if folder:
                folders.append(str(folder))
    return folders


def sandbox_plan(run_path: Path, method_folder: Path, worker_folder: str,
                 modules: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """What the worker's Landlock ruleset grants: read Python, its import path, the packages of
    Arena and of the method (``modules``) and the system folders; read and write its own folder
    and the method's folder; nothing else (not the run directory, its record, config or salt,
    nor other processes' /proc)."""
    roots = [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, *package_folders("arena", *modules),
             *SYSTEM_READ]
    return {"read": readable_roots(run_path, roots),
            "write": [worker_folder, str(method_folder), "/dev/null"]}


def apply_sandbox(plan: dict[str, list[str]] | None) -> str:
    """Lock this process out of everything ``plan`` does not grant, where Linux's Landlock is
    available (py-landlock); no network, no signals to processes outside. Returns what it did."""
    if not plan:
        return "none"
    try:
        from py_landlock import Landlock, get_abi_version
    except ImportError:
        return "none (py-landlock is not installed)"
    try:
        abi = int(get_abi_version())
    except Exception as exc:
        return f"none (Landlock unavailable: {exc})"
    from py_landlock import AccessFs

    # Landlock refuses a folder's rights (list, create, remove) on a file: files get file rights.
    read_file = AccessFs.READ_FILE | AccessFs.EXECUTE
    write_file = AccessFs.WRITE_FILE | AccessFs.TRUNCATE
    ruleset = Landlock(strict=False)
    # This process's /proc entry, resolved here: the plan was made in the harness, whose
    # /proc/self is the harness's.
    for path in filter(os.path.exists, [*plan["read"], f"/proc/{os.getpid()}"]):
        ruleset.add_path_rule(path, access=read_file | (AccessFs.READ_DIR if os.path.isdir(path) else 0))
    for path in filter(os.path.exists, plan["write"]):
        if os.path.isdir(path):
            ruleset.allow_read_write(path)
        else:
            ruleset.add_path_rule(path, access=read_file | write_file)
    ruleset.apply()
    return f"landlock ABI {abi}, /proc of its own process only"


def worker_main(fd: int) -> None:
    """The worker process's life: read what to build from the harness, then serve its calls
    until the harness closes the pipe (``python -m arena.core.isolation.worker FD``)."""
    if os.getpid() == 1:
        _serve_as_init(fd)  # returns in the worker only
    connection = multiprocessing.connection.Connection(fd)
    path, memory_mb, plan, namespaces = pickle.loads(connection.recv_bytes())
    sys.path[:] = [entry for entry in path if entry]  # the harness's, so the method imports as there
    namespaces = describe_namespaces(namespaces)  # before the sandbox, which hides /proc
    sandbox = "; ".join([apply_sandbox(plan), namespaces, "environment allow-listed"])
    factory = pickle.loads(connection.recv_bytes())
    if memory_mb:
        limit = int(memory_mb) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    channel = rpc.Channel(connection, "w", worker_export, trusted_modules=None,
                          portable_error=_portable_error)
    channel.offer_root(WorkerHost(factory, sandbox), frozenset({"build", "hook"}))
    channel.start()
    channel.wait_closed()


def _serve_as_init(fd: int) -> None:
    """Process 1 of the worker's own PID namespace: fork the worker, then reap (the method's
    orphaned children too) until it ends, and end as it did. The worker is thus not process 1
    (whose signals the kernel treats apart), and the one process it sees besides its own
    children, its parent, is outside its sandbox: it can neither read its /proc entry nor
    signal it."""
    worker = os.fork()
    if worker == 0:
        return
    os.close(fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == worker:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


def describe_namespaces(claimed: str) -> str:
    """What the harness started this process in, checked here: in a PID namespace of its own
    the worker's parent is the namespace's process 1, and ``/proc`` shows no process of the
    harness."""
    if claimed.startswith("no "):
        return claimed
    visible = {int(entry) for entry in os.listdir("/proc") if entry.isdigit()}
    if os.getppid() == 1 and visible <= {1, os.getpid()}:
        return claimed
    return f"no namespaces (asked for {claimed}, but process {os.getpid()} sees other processes)"


# -- the harness's side -----------------------------------------------------------------------

class IsolationError(RuntimeError):
    """The method's worker could not be started or answered wrongly."""


class Worker:
    """One worker process and the harness's end of its channel."""

    def __init__(self, method_name: str, factory: Callable[[Any], Any], on_refused: rpc.OnRefused,
                 memory_mb: int | None, sandbox: tuple[Path, Path] | None,
                 withheld: frozenset[str] = frozenset()) -> None:
        try:
            pickle.dumps(factory)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise IsolationError(
                f"Method '{method_name}' cannot run isolated (run.isolation=process): the worker imports "
                f"its factory by name, and {factory!r} is not importable by name ({exc}). Register a "
                "class or function defined at the top level of a module.") from None
        # A fresh interpreter on one end of a socket pair, in a folder of its own: it inherits
        # no object of the harness (multiprocessing's fork would copy them all).
        harness_end, worker_end = socket.socketpair()
        self.folder = tempfile.mkdtemp(prefix="arena-worker-")
        prefix, namespaces = namespace_command()
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "arena.core.isolation.worker", str(worker_end.fileno())],
            pass_fds=(worker_end.fileno(),), cwd=self.folder, env=worker_environment(self.folder, withheld),
            start_new_session=True)  # its own process group: a signal to its group never reaches the harness
        worker_end.close()
        connection = multiprocessing.connection.Connection(harness_end.detach())
        plan = None if sandbox is None else sandbox_plan(sandbox[0], sandbox[1], self.folder,
                                                         (getattr(factory, "__module__", "") or "arena",))
        connection.send_bytes(pickle.dumps(([os.path.abspath(p) if p else p for p in sys.path], memory_mb, plan,
                                            namespaces)))
        connection.send_bytes(pickle.dumps(factory))
        self.channel = rpc.Channel(connection, "h", harness_export, trusted_modules=WORKER_DATA_MODULES,
                                   on_refused=on_refused, callable_parameters=CALLABLE_PARAMETERS,
                                   callable_fields=CALLABLE_FIELDS, violations=(OutsideFolder,),
                                   withheld=WITHHELD, own_interrupts=True).start()

    def request(self, op: str, name: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                timeout: float | None = None) -> Any:
        return self.channel.request(rpc.ROOT, op, name, args, kwargs, timeout=timeout)

    def stop(self) -> None:
        self.channel.close("stopped by the harness")
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


class IsolatedMethod:
    """The harness's stand-in for a method that lives in a worker: the plugin registered under
    the method's name, one hook implementation per hook the method has, each a call to the
    worker. A dead or overrunning worker is replaced and the call raises
    :class:`~arena.core.isolation.rpc.RemoteError` (the episode is then an error, as any hook's failure)."""

    def __init__(self, run: Any, method_name: str, factory: Callable[[Any], Any], *,
                 on_refused: rpc.OnRefused, hook_seconds: float | None = None,
                 memory_mb: int | None = None, sandbox: tuple[Path, Path] | None = None) -> None:
        self.run = run
        self.method_name = method_name
        self.factory = factory
        #: (run directory, method folder) the worker is locked out of / into; None: no sandbox.
        self.sandbox_paths = sandbox
        #: What the worker reported of its sandbox (``landlock ABI 7, ...; own pid+mount namespaces
        #: (unshare); environment allow-listed``, each part ``none`` or ``no ...`` and why where not).
        self.sandbox = "none"
        #: Environment variables the config names as secret, never passed to a worker.
        self.withheld = withheld_variables(getattr(run, "cfg", None))
        self.hook_seconds = hook_seconds
        self.memory_mb = memory_mb
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self.restarts = 0
        self.worker, self.hooks = self._start()
        for name, spec in self.hooks.items():
            setattr(self, name, self._implementation(name, spec))

    def _start(self) -> tuple[Worker, dict[str, dict[str, Any]]]:
        worker = Worker(self.method_name, self.factory, self._on_refused, self.memory_mb, self.sandbox_paths,
                        self.withheld)
        try:
            hooks, self.sandbox = worker.request("call", "build", (self.run,))
        except rpc.ChannelClosed:
            worker.stop()
            raise IsolationError(
                f"The worker process of method '{self.method_name}' ended while the method was built "
                f"(exit status {worker.process.returncode}); its error is printed above.") from None
        except BaseException:
            worker.stop()
            raise
        if not isinstance(hooks, dict) or not set(hooks) <= set(HOOKS):
            worker.stop()
            raise IsolationError(f"The worker of method '{self.method_name}' answered {hooks!r} when built.")
        return worker, hooks

    def _implementation(self, name: str, spec: Mapping[str, Any]) -> Callable[..., Any]:
        params = hook_parameters(name, spec["params"], self.method_name)
        # The worker's ``run`` is the context it was built with (offered by its protocol's names),
        # whatever stand-in the harness hands its in-process hooks.
        call = named_forwarder(name, params, lambda kwargs: self.call_hook(
            name, {**kwargs, "run": self.run} if "run" in kwargs else kwargs))
        marker = pluggy.HookimplMarker("arena")
        return marker(tryfirst=bool(spec.get("tryfirst")), trylast=bool(spec.get("trylast")))(call)

    def call_hook(self, name: str, kwargs: dict[str, Any]) -> Any:
        worker = self.worker
        try:
            return worker.request("call", "hook", (name, kwargs), timeout=self.hook_seconds)
        except (rpc.ChannelClosed, rpc.CallTimeout) as exc:
            self._replace(worker)
            raise rpc.RemoteError(type(exc).__name__, f"method '{self.method_name}' hook {name}: {exc.message}; "
                                  "its worker was replaced") from None

    def _replace(self, dead: Worker) -> None:
        """A new worker, built as on ``--resume`` (once per dead one, whoever notices first)."""
        with self._lock:
            if self.worker is not dead:
                return
            dead.stop()
            self.worker, hooks = self._start()
            self.restarts += 1
            if set(hooks) != set(self.hooks):
                raise IsolationError(f"Method '{self.method_name}' implements other hooks when rebuilt.")

    def close(self) -> None:
        self.worker.stop()


def hook_parameters(hook: str, declared: Any, method_name: str) -> list[str]:
    """The argument names a worker says its ``hook`` takes, each one the hook specification's:
    the names come from another process, and become a function's parameters here."""
    from arena.core.contract import hookspecs

    allowed = list(inspect.signature(getattr(hookspecs, hook)).parameters)
    names = [str(p) for p in declared] if isinstance(declared, (list, tuple)) else None
    if names is None or not set(names) <= set(allowed) or len(set(names)) != len(names):
        raise IsolationError(f"The worker of method '{method_name}' declared the arguments {declared!r} for "
                             f"hook {hook}; a {hook} implementation takes some of {allowed}.")
    return names


def named_forwarder(name: str, params: list[str], forward: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """A function named ``name`` whose code declares ``params`` and that passes its arguments on
    to ``forward`` as one dict. pluggy learns which arguments an implementation takes from its
    code object (1.7 reads ``__code__.co_varnames``; earlier releases its signature), so the
    stand-in of a worker's hook must declare them for real; ``params`` are checked names of the
    hook specification (:func:`hook_parameters`), never free text."""
    if not all(p.isidentifier() for p in params):
        raise ValueError(f"not argument names: {params}")
    arguments = ", ".join(params)
    source = f"def {name}({arguments}):\n    return forward({{{', '.join(f'{p!r}: {p}' for p in params)}}})\n"
    namespace: dict[str, Any] = {"forward": forward}
    exec(compile(source, f"<arena isolated hook {name}>", "exec"), namespace)
    return namespace[name]


def refusal_recorder(violations: Any, method_name: str) -> rpc.OnRefused:
    """What the harness does when the worker asks for a name it is not offered, or sends what
    it is refused (a reference nested in data, a path outside its folder): a violation (the run
    is then invalid), as reaching past the run's views is in one process."""

    def refused(kind: str, name: str, why: str = "") -> None:
        if why:
            violations.refusal(f"Method '{method_name}' (isolated) {why}")
        else:
            violations.refusal(f"Method '{method_name}' (isolated) asked for {kind}.{name}, which is not "
                               "part of the plugin API.")

    return refused
