"""Calls both ways between two processes over one pipe: the harness and a method's worker.

Each side hands the other some of its objects by reference (the harness its run, store and LLM;
the worker the method's policies) and everything else by value (tasks, trajectories,
experiences). A call runs on the thread that waits for it: when the worker, serving a hook the
harness's episode thread called, calls back into the run, the call is served by that same
episode thread, so thread-bound state (the episode being played, its seed) is what it would
be in one process. Calls that start on a fresh thread of one side get a fresh thread on the
other.

The harness never unpickles what the worker sends with the full pickle machinery (that would
run any code the worker chose): :class:`SafeUnpickler` builds only the classes it allows, and
changes no object that existed before (a class, an enum member). What it builds is plain data at
every depth: a reference to one of the worker's objects (a live proxy, which could answer each
read differently) is accepted only where a callable is expected, as a call's argument named in
``callable_parameters`` or a field named in ``callable_fields`` (a policy); anywhere else the call
is refused and ``on_refused`` told.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import inspect
import io
import itertools
import os
import pickle
import queue
import socket
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Protocol

#: What travels by value from an untrusted side: plain data, numpy arrays, and the dataclasses
#: and enums of the modules listed (whole modules, checked by name, never imported on demand
#: for another name).
SAFE_BUILTINS = frozenset({"set", "frozenset", "slice", "complex", "range", "bytearray", "object",
                           "dict", "list"})
SAFE_CALLABLES = {
    ("copyreg", "_reconstructor"), ("copyreg", "__newobj__"),
    ("collections", "OrderedDict"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"), ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("random", "Random"),  # a generator's state, copied: the receiver's draws do not advance the sender's
}


#: The handle of the object each side offers first (:meth:`Channel.offer_root`).
ROOT = 0


class RemoteError(Exception):
    """An exception the other process raised whose type does not travel (shown with its
    traceback there)."""

    def __init__(self, kind: str, message: str, remote_traceback: str = "") -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.remote_traceback = kind, message, remote_traceback

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteError, (self.kind, self.message, self.remote_traceback))


class ChannelClosed(RemoteError):
    """The other process ended (it exited, was killed, or the pipe broke) while a call waited."""

    def __init__(self, message: str) -> None:
        super().__init__("ChannelClosed", message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ChannelClosed, (self.message,))


class CallTimeout(RemoteError):
    """A call got no answer within its time limit."""

    def __init__(self, message: str) -> None:
        super().__init__("CallTimeout", message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (CallTimeout, (self.message,))


class Refused(AttributeError):
    """A name the exporting side does not offer on an object it handed over."""


class OnRefused(Protocol):
    """Told of what the other side was refused: a name it asked for (``kind.name``), or, with
    ``why``, something else it sent (a reference nested in data, a path outside its folder)."""

    def __call__(self, kind: str, name: str, why: str = "") -> None: ...


class SafeUnpickler(pickle._Unpickler):
    """Builds only allowed classes: builtins' plain types, :data:`SAFE_CALLABLES`, and the
    classes defined in ``modules`` (e.g. ``arena.core.contract.types``). Anything else (``os.system``,
    a function of the harness) is refused before it runs.

    It is pickle's pure-Python unpickler, so that the operations that change an object already
    built can be checked: the C one sets attributes on whatever is on its stack, a class it was
    allowed to name included (``Trajectory.success = True`` for every trajectory of the
    harness). Here state goes only into objects this payload made, items only into lists, sets
    and dicts."""

    dispatch: ClassVar[dict[int, Callable[..., Any]]] = dict(pickle._Unpickler.dispatch)

    def __init__(self, data: io.BytesIO, modules: Iterable[str], persistent: Callable[[Any], Any]) -> None:
        super().__init__(data)
        self._modules = frozenset(modules)
        self._persistent = persistent

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and (name in SAFE_BUILTINS or _is_builtin_exception(name)):
            return super().find_class(module, name)
        if (module, name) in SAFE_CALLABLES or (module in self._modules and not name.startswith("_")):
            found = super().find_class(module, name)
            if module in self._modules and not _is_data_class(found, module):
                raise pickle.UnpicklingError(f"{module}.{name} may not be sent to this process: only "
                                             "dataclasses, enums and exceptions of that module may")
            return found
        raise pickle.UnpicklingError(f"{module}.{name} may not be sent to this process")

    def persistent_load(self, pid: Any) -> Any:
        return self._persistent(pid)

    def _target(self, depth: int, kinds: tuple[type, ...] | None = None) -> None:
        """Refuse to change ``self.stack[-depth]`` unless it is a fresh object (of ``kinds``)."""
        target = self.stack[-depth]  # type: ignore[attr-defined]
        if isinstance(target, _SHARED) or (kinds is not None and not isinstance(target, kinds)):
            raise pickle.UnpicklingError(f"a payload may not change a {type(target).__name__} "
                                         "it did not make")

    def _load_build(self) -> None:
        self._target(2)
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]

    def _load_append(self) -> None:
        self._target(2, (list,))
        pickle._Unpickler.load_append(self)  # type: ignore[attr-defined]

    def _load_appends(self) -> None:
        self._target_below_mark((list,))
        pickle._Unpickler.load_appends(self)  # type: ignore[attr-defined]

    def _load_setitem(self) -> None:
        self._target(3, (dict,))
        pickle._Unpickler.load_setitem(self)  # type: ignore[attr-defined]

    def _load_setitems(self) -> None:
        self._target_below_mark((dict,))
        pickle._Unpickler.load_setitems(self)  # type: ignore[attr-defined]

    def _load_additems(self) -> None:
        self._target_below_mark((set,))
        pickle._Unpickler.load_additems(self)  # type: ignore[attr-defined]

    def _target_below_mark(self, kinds: tuple[type, ...]) -> None:
        """The object under the last mark: pickle keeps the stack below a mark in metastack."""
        below = self.metastack[-1] if self.metastack else []  # type: ignore[attr-defined]
        if not below or isinstance(below[-1], _SHARED) or not isinstance(below[-1], kinds):
            raise pickle.UnpicklingError("a payload may add items only to a list, set or dict it made")

    dispatch[pickle.BUILD[0]] = _load_build
    dispatch[pickle.APPEND[0]] = _load_append
    dispatch[pickle.APPENDS[0]] = _load_appends
    dispatch[pickle.SETITEM[0]] = _load_setitem
    dispatch[pickle.SETITEMS[0]] = _load_setitems
    dispatch[pickle.ADDITEMS[0]] = _load_additems


#: What a payload finds but did not make (classes, functions, enum members, references): never
#: changed by it.
_SHARED: tuple[type, ...] = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
                             enum.Enum)


class _Reference:
    """A reference the other side sent, as unpickled by a side that does not trust it: inert
    until :meth:`Channel._accept_call` finds it where a reference may be and puts the object (a
    proxy, or this side's own) in its place."""

    __slots__ = ("pid",)

    def __init__(self, pid: tuple[Any, ...]) -> None:
        self.pid = pid


_SHARED += (_Reference,)
#: Values that hold nothing else.
_LEAVES: tuple[type, ...] = (str, bytes, bytearray, int, float, complex, bool, type(None), range, *_SHARED)


def _children(obj: Any) -> Iterator[tuple[Any, str, Any]]:
    """What ``obj`` holds, as (key, label, value): items, attributes, slots, an exception's
    arguments, an object array's items. Keys are what :meth:`Channel._accept_call` allows."""
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            yield ("key", key), f"[key {key!r}]", key
            yield key, f"[{key!r}]", value
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield index, f"[{index}]", value
    elif isinstance(obj, (set, frozenset)):
        for index, value in enumerate(obj):
            yield ("item", index), "{item}", value
    elif isinstance(obj, slice):
        yield "start", ".start", obj.start
        yield "stop", ".stop", obj.stop
        yield "step", ".step", obj.step
    if isinstance(obj, BaseException):
        yield "args", ".args", obj.args
        yield "__cause__", ".__cause__", obj.__cause__
        yield "__context__", ".__context__", obj.__context__
    if type(obj).__module__.split(".")[0] == "numpy":
        import numpy as np

        if isinstance(obj, np.ndarray) and obj.dtype.hasobject:
            yield "items", "[...]", obj.tolist()
        dtype = obj if isinstance(obj, np.dtype) else getattr(obj, "dtype", None)
        if isinstance(dtype, np.dtype) and dtype.metadata is not None:
            yield "metadata", ".dtype.metadata", dict(dtype.metadata)
        return
    for name, value in getattr(obj, "__dict__", {}).items():
        yield name, f".{name}", value
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                attribute = f"_{klass.__name__.lstrip('_')}{name}" if name.startswith("__") else name
                yield name, f".{name}", getattr(obj, attribute, None)


def references_in(value: Any) -> Iterator[tuple[Any, Any, str, _Reference]]:
    """Every reference in ``value`` at any depth: (holder, key, where, reference)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    seen: dict[int, Any] = {}  # holds what it saw: an id is not reused while the walk lasts
    while stack:
        obj, where = stack.pop()
        if isinstance(obj, _LEAVES) or id(obj) in seen:
            continue
        seen[id(obj)] = obj
        for key, label, child in _children(obj):
            if isinstance(child, _Reference):
                yield obj, key, where + label, child
            else:
                stack.append((child, where + label))


def _is_data_class(found: Any, module: str) -> bool:
    """A class defined in ``module`` that holds data only: a dataclass, an enum or an exception."""
    return isinstance(found, type) and found.__module__ == module and (
        dataclasses.is_dataclass(found) or issubclass(found, (enum.Enum, Exception)))


def _is_builtin_exception(name: str) -> bool:
    import builtins

    found = getattr(builtins, name, None)
    return isinstance(found, type) and issubclass(found, Exception)


class Proxy:
    """The other side's object: attribute reads and calls go through the channel. Only the
    names that side offers for it are answered (others raise :class:`Refused` there)."""

    __slots__ = ("_channel", "_handle", "_kind")

    def __init__(self, channel: Channel, handle: int, kind: str) -> None:
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_kind", kind)

    def __del__(self) -> None:
        """Tell the owner this reference is gone (it keeps the object while any is alive)."""
        try:
            self._channel.released.append(self._handle)
        except Exception:  # interpreter shutdown: nothing left to tell
            pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        channel = self._channel
        if (self._kind, name) in channel.methods:
            return Method(self, name)
        value = channel.request(self._handle, "get", name)
        if isinstance(value, MethodMarker):
            channel.methods.add((self._kind, name))
            return Method(self, name)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._channel.request(self._handle, "set", name, (value,))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.request(self._handle, "call", "", args, kwargs)

    def __enter__(self) -> Any:
        return self._channel.request(self._handle, "call", "__enter__")

    def __exit__(self, *exc: Any) -> Any:
        return self._channel.request(self._handle, "call", "__exit__", (None, None, None))

    def __repr__(self) -> str:
        return f"<{self._kind} in the other process>"


class Method:
    """A method of the other side's object, read once and called many times."""

    __slots__ = ("_channel", "_handle", "_name", "_owner")

    def __init__(self, owner: Proxy, name: str) -> None:
        self._owner = owner  # the proxy stays alive while its method may still be called
        self._channel, self._handle, self._name = owner._channel, owner._handle, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.request(self._handle, "call", self._name, args, kwargs)

    def __repr__(self) -> str:
        return f"<method {self._name} in the other process>"


class Channel:
    """One side of the pipe.

    ``export(obj)`` says how this side sends ``obj``: None for by value, or the names the other
    side may use on it (then it goes by reference). ``trusted_modules`` is None where the other
    side is trusted (the worker reading the harness), else the modules whose classes its data
    may build; then a reference to one of the other side's objects is accepted only as an
    argument named in ``callable_parameters`` (``module.Class.method`` -> parameter names, a
    base class's applying to its subclasses) or as a field named in ``callable_fields`` (class ->
    field names) of an argument or of an item of one; this side's own objects come back as
    arguments only, never inside data. ``on_refused`` is told of each name refused and each
    payload refused for what it holds (the harness records it); an exception of ``violations``
    raised by a call it served is told too (a path outside the method's folder). ``withheld``
    (``Class.name`` -> why, and the fix) says more of a name refused on purpose than that it is
    not offered. ``own_interrupts``: an exception that is not an ``Exception`` (Ctrl-C, SIGTERM's,
    ``SystemExit``) raised while serving belongs to this process and unwinds it, instead of going
    to the other side as the served call's error (the harness; the worker sends its method's).
    """

    def __init__(self, connection: Any, name: str, export: Callable[[Any], frozenset[str] | None],
                 trusted_modules: Iterable[str] | None = None,
                 on_refused: OnRefused | None = None,
                 portable_error: Callable[[BaseException], BaseException] = lambda exc: exc, *,
                 callable_parameters: Mapping[str, frozenset[str]] | None = None,
                 callable_fields: Mapping[type, frozenset[str]] | None = None,
                 violations: tuple[type[BaseException], ...] = (),
                 withheld: Mapping[str, str] | None = None, own_interrupts: bool = False) -> None:
        self._connection = connection
        self._own_interrupts = own_interrupts
        self._withheld = dict(withheld or {})
        self._callable_parameters = dict(callable_parameters or {})
        self._callable_fields = dict(callable_fields or {})
        self._violations = violations
        self._portable_error = portable_error
        self._ended = threading.Event()
        self.name = name
        self._export = export
        self._trusted_modules = None if trusted_modules is None else frozenset(trusted_modules)
        self._on_refused: OnRefused = on_refused or (lambda kind, attr, why="": None)
        self._send_lock = threading.Lock()
        #: handle -> [object, names offered, references the other side holds (None: the root)]
        self._objects: dict[int, list[Any]] = {}
        self._handles: dict[int, int] = {}  # id(object) -> handle (the object is kept alive)
        self._handle_lock = threading.Lock()
        self._inboxes: dict[str, queue.Queue[tuple[Any, ...]]] = {}
        self._counter = itertools.count(1)
        self._local = threading.local()
        #: (kind, name) pairs known to be methods on the other side: called without a read first.
        self.methods: set[tuple[str, str]] = set()
        #: Handles of the other side's objects whose proxies here died: told with the next frame.
        self.released: collections.deque[int] = collections.deque()
        self._closed: str | None = None
        self._reader = threading.Thread(target=self._read, name=f"rpc-{name}", daemon=True)

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> Channel:
        self._reader.start()
        return self

    def offer_root(self, obj: Any, names: frozenset[str]) -> None:
        """Offer ``obj`` as :data:`ROOT`, the object the other side starts from."""
        with self._handle_lock:
            self._handles[id(obj)] = ROOT
            self._objects[ROOT] = [obj, names, None]

    def wait_closed(self) -> None:
        self._ended.wait()

    def close(self, why: str = "closed") -> None:
        if self._closed is None:
            self._closed = why
        # Wake the reader first and let it end: a connection closed under a reader blocked in
        # recv frees its file descriptor while that recv still waits on the number, and the next
        # pipe or socket opened (a replacement worker's) can get the number and lose frames to it.
        self._shut_down()
        if self._reader.is_alive() and threading.current_thread() is not self._reader:
            self._reader.join(timeout=10)
        try:
            self._connection.close()
        except OSError:
            pass
        for inbox in list(self._inboxes.values()):
            inbox.put(("closed", why))
        self._ended.set()

    def _shut_down(self) -> None:
        """End both directions of the connection's socket (a reader blocked on it gets EOF) while
        its descriptor stays open; nothing where the connection is no socket."""
        try:
            with socket.socket(fileno=os.dup(self._connection.fileno())) as end:
                end.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass

    @property
    def closed(self) -> str | None:
        return self._closed

    # -- calling the other side ---------------------------------------------------------------

    def request(self, handle: int, op: str, name: str, args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Ask the other side; serve its calls back on this thread until the answer comes."""
        current: str | None = getattr(self._local, "chain", None)
        fresh = current is None
        chain = current if current is not None else f"{self.name}{next(self._counter)}"
        if fresh:
            self._local.chain = chain
            self._inboxes[chain] = queue.Queue()
        inbox = self._inboxes[chain]
        call_id = next(self._counter)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._send("call", chain, call_id, (handle, op, name, args, kwargs or {}))
            while True:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    message = inbox.get(timeout=wait)
                except queue.Empty:
                    raise CallTimeout(f"no answer to {name or op} within {timeout:g} s") from None
                if message[0] == "closed":
                    inbox.put(message)  # every waiter on this chain sees it
                    raise ChannelClosed(f"the other process ended ({message[1]})")
                if message[0] == "call":
                    self._serve(message)
                elif message[2] == call_id:
                    ok, value = self._payload(message[3], fallback=(False, None))
                    if self._trusted_modules is not None:
                        ok, value = self._accept_reply(ok, value, name or op)
                    if ok:
                        return value
                    raise value
        finally:
            if fresh:
                del self._inboxes[chain]
                self._local.chain = None

    # -- serving the other side's calls -------------------------------------------------------

    def _serve_fresh(self, message: tuple[Any, ...]) -> None:
        chain = message[1]
        self._local.chain = chain
        self._inboxes[chain] = queue.Queue()
        try:
            self._serve(message)
        finally:
            del self._inboxes[chain]
            self._local.chain = None

    def _serve(self, message: tuple[Any, ...]) -> None:
        _, chain, call_id, data = message
        try:
            handle, op, name, args, kwargs = self._payload(data)
            if self._trusted_modules is not None:
                args, kwargs = self._accept_call(handle, op, name, args, kwargs)
            value, ok = self._perform(handle, op, name, args, kwargs), True
        except BaseException as exc:
            if self._own_interrupts and not isinstance(exc, Exception):
                raise
            if isinstance(exc, self._violations):
                self._on_refused("", "", str(exc))
            value, ok = self._portable_error(exc), False
        try:
            self._send("reply", chain, call_id, (ok, value))
        except ChannelClosed:
            pass
        except Exception as exc:
            self._send("reply", chain, call_id, (False, self._portable_error(portable(exc))))

    def _perform(self, handle: int, op: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        obj, names, _ = self._objects[handle]
        kind = type(obj).__name__
        if op == "call" and not name:
            if "__call__" not in names:
                self._on_refused(kind, "__call__")
                raise Refused(f"{kind} is not offered as a callable")
            return obj(*args, **kwargs)
        if name not in names and op != "set":
            self._on_refused(kind, name)
            why = self._withheld.get(f"{kind}.{name}")
            if why:
                raise Refused(f"{kind}.{name} is not offered to the method's process: {why}")
            raise Refused(f"{kind}.{name} is not offered to the method's process; the names it "
                          f"may use are: {', '.join(sorted(n for n in names if not n.startswith('__')))}")
        if op == "get":
            value = getattr(obj, name)
            # A method of the object itself is called through its proxy, never sent (the worker
            # sends its other callables by reference, which an answer may not hold).
            own_method = getattr(value, "__self__", None) is obj
            if callable(value) and not isinstance(value, type) and (own_method or self._export(value) is None):
                return MethodMarker()
            return value
        if op == "set":  # the other side's objects are read, never changed, from here
            self._on_refused(kind, f"{name} (set)")
            raise Refused(f"{kind}.{name} cannot be set from the method's process")
        return getattr(obj, name)(*args, **kwargs)

    # -- what an untrusted side sends ----------------------------------------------------------

    def _accept_call(self, handle: int, op: str, name: str, args: Any, kwargs: Any
                     ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A call's arguments with their references in place, where they may be: this side's
        own objects as arguments, the other side's (proxies) only as a callable argument (a
        policy, a callback) or a callable field of an argument (an EpisodeRequest's policy)."""
        if not isinstance(args, tuple) or not isinstance(kwargs, dict) or not isinstance(handle, int):
            raise RemoteError("Refused", f"{self.name}: a call that is not (arguments, keywords)")
        args, kwargs = list(args), dict(kwargs)
        entry = self._objects.get(handle)
        callables = self._callable_slots(entry, op, name)
        allowed: set[tuple[int, Any]] = set()
        found: list[tuple[Any, Any, str, _Reference]] = []
        for holder, key, value, label in [*((args, i, v, f"argument {i + 1}") for i, v in enumerate(args)),
                                          *((kwargs, k, v, f"argument {k}") for k, v in kwargs.items())]:
            if isinstance(value, _Reference):
                found.append((holder, key, label, value))
                if value.pid[0] == "yours" or key in callables:
                    allowed.add((id(holder), key))
            found.extend((inner, at, label + where, ref) for inner, at, where, ref in references_in(value))
            for item in [value, *(value if isinstance(value, (list, tuple)) else ())]:
                for field in self._callable_fields.get(type(item), ()):
                    if isinstance(getattr(item, field, None), _Reference):
                        allowed.add((id(item), field))
        kind = type(entry[0]).__name__ if entry is not None else "?"
        self._place(found, allowed, f"{kind}.{name or op}")
        return tuple(args), kwargs

    def _accept_reply(self, ok: bool, value: Any, call: str) -> tuple[bool, Any]:
        """An answer holds no reference at all: it is data (a trajectory, an action)."""
        found = [([value], 0, "the answer", value)] if isinstance(value, _Reference) else []
        found += [(holder, key, f"the answer{where}", ref) for holder, key, where, ref in references_in(value)]
        try:
            self._place(found, set(), call)
        except RemoteError as refused:
            return False, refused
        return ok, value

    def _place(self, found: list[tuple[Any, Any, str, _Reference]], allowed: set[tuple[int, Any]],
               call: str) -> None:
        """Put each reference's object where it was found, if all are where they may be; else
        refuse the payload (its references let go) and tell ``on_refused``."""
        stray = [where for holder, key, where, _ in found if (id(holder), key) not in allowed]
        if stray:
            for reference in {id(ref): ref for _, _, _, ref in found}.values():
                if reference.pid[0] == "mine":
                    self.released.append(int(reference.pid[1]))
            why = (f"sent a reference to an object of its own process in {stray[0]} of {call}: what a "
                   "method sends the harness is plain data at every depth; only a policy or callback "
                   "(an EpisodeRequest's policy, run.play's on_done) may be a "
                   "function of the method's")
            self._on_refused(call.split(".")[0], call.split(".")[-1], why)
            raise RemoteError("Refused", f"{self.name}: {why}.")
        for holder, key, _, reference in found:
            resolved = self._persistent_load(reference.pid)
            if isinstance(holder, (list, dict)):
                holder[key] = resolved
            else:
                object.__setattr__(holder, key, resolved)

    def _callable_slots(self, entry: list[Any] | None, op: str, name: str) -> set[Any]:
        """The arguments (positions and names) of ``entry``'s ``name`` that take a callable."""
        if entry is None or op != "call" or name not in entry[1]:
            return set()
        names = frozenset().union(*(self._callable_parameters.get(f"{k.__module__}.{k.__qualname__}.{name}", ())
                                    for k in type(entry[0]).__mro__))
        if not names:
            return set()
        try:
            parameters = list(inspect.signature(getattr(entry[0], name)).parameters.values())
        except (TypeError, ValueError, AttributeError):
            return set(names)
        positions = {index for index, parameter in enumerate(parameters)
                     if parameter.name in names and parameter.kind is parameter.POSITIONAL_OR_KEYWORD}
        return set(names) | positions

    # -- the wire ----------------------------------------------------------------------------

    def _send(self, kind: str, chain: str, call_id: int, payload: tuple[Any, ...]) -> None:
        """A frame: the kind, chain and call id as plain values, then the payload pickled on its
        own, so a payload the other side refuses to build fails that call alone."""
        buffer = io.BytesIO()
        _Pickler(buffer, self).dump(payload)
        frame = pickle.dumps((kind, chain, call_id, buffer.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)
        with self._send_lock:
            if self._closed is not None:
                raise ChannelClosed(f"the other process ended ({self._closed})")
            released = [self.released.popleft() for _ in range(len(self.released))]
            try:
                if released:
                    self._connection.send_bytes(pickle.dumps(("release", "", 0, pickle.dumps(released))))
                self._connection.send_bytes(frame)
            except OSError as exc:
                raise ChannelClosed(f"pipe closed: {type(exc).__name__}") from None

    def _payload(self, data: bytes, fallback: tuple[Any, ...] | None = None) -> Any:
        """Build a payload; one this side refuses becomes the error its call ends with."""
        if self._trusted_modules is None:
            unpickler: pickle.Unpickler | pickle._Unpickler = _TrustedUnpickler(io.BytesIO(data), self._persistent_load)
        else:  # references stay inert until _accept has seen where they are
            unpickler = SafeUnpickler(io.BytesIO(data), self._trusted_modules, _inert_reference)
        try:
            return unpickler.load()
        except Exception as exc:
            refused = RemoteError("Refused", f"{self.name}: could not accept what was sent: {exc}")
            if fallback is None:
                raise refused from None
            return (False, refused)

    def _read(self) -> None:
        while True:
            try:
                data = self._connection.recv_bytes()
            except (EOFError, OSError) as exc:
                self.close(f"pipe closed: {type(exc).__name__}")
                return
            try:
                message = SafeUnpickler(io.BytesIO(data), (), _no_reference).load()
                if message[0] not in ("call", "reply", "release") or len(message) != 4:
                    raise pickle.UnpicklingError("not a frame")
                if message[0] == "release":
                    handles = SafeUnpickler(io.BytesIO(message[3]), (), _no_reference).load()
                    self._release([int(h) for h in handles])
                    continue
            except Exception as exc:
                self.close(f"refused a frame: {exc}")
                return
            inbox = self._inboxes.get(message[1])
            if inbox is not None:
                inbox.put(message)
            elif message[0] == "call":
                threading.Thread(target=self._serve_fresh, args=(message,), daemon=True).start()
            # else: the answer to a call that gave up waiting

    def _handle_of(self, obj: Any, names: frozenset[str]) -> int:
        """``obj``'s handle, counted once more: each reference sent becomes one proxy there."""
        with self._handle_lock:
            handle = self._handles.get(id(obj))
            if handle is None:
                handle = next(self._counter)
                self._handles[id(obj)] = handle
                self._objects[handle] = [obj, names, 0]
            entry = self._objects[handle]
            if entry[2] is not None:
                entry[2] += 1
            return handle

    def _release(self, handles: list[int]) -> None:
        """The other side dropped these references: an object none refers to is let go."""
        with self._handle_lock:
            for handle in handles:
                entry = self._objects.get(handle)
                if entry is None or entry[2] is None:
                    continue
                entry[2] -= 1
                if entry[2] <= 0:
                    del self._objects[handle]
                    self._handles.pop(id(entry[0]), None)

    def _persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Proxy):  # the other side's own object, going back: its handle
            return ("yours", obj._handle)
        if isinstance(obj, Method):  # a method of one of the other side's objects
            return ("yours", obj._handle, obj._name)
        if isinstance(obj, (str, bytes, int, float, bool, type(None), tuple, list, dict)):
            return None
        names = self._export(obj)
        if names is None:
            return None
        return ("mine", self._handle_of(obj, names), type(obj).__name__)

    def _persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or len(pid) < 2:
            raise pickle.UnpicklingError("bad reference")
        if pid[0] == "yours":  # one of this side's objects, back from the other side
            entry = self._objects.get(int(pid[1]))
            if entry is None:
                raise pickle.UnpicklingError("reference to an object this side never sent")
            if len(pid) == 3:  # one of its methods, as offered
                if pid[2] not in entry[1]:
                    self._on_refused(type(entry[0]).__name__, str(pid[2]))
                    raise pickle.UnpicklingError(f"{type(entry[0]).__name__}.{pid[2]} is not offered")
                return getattr(entry[0], pid[2])
            return entry[0]
        return Proxy(self, int(pid[1]), str(pid[2]))


@dataclasses.dataclass(frozen=True)
class MethodMarker:
    """The answer to reading an attribute that is a method: the reader then calls it by name
    (a dataclass of this module, so the harness accepts it from the worker: a policy's ``start``)."""


class _Pickler(pickle.Pickler):
    def __init__(self, buffer: io.BytesIO, channel: Channel) -> None:
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self._channel = channel

    def persistent_id(self, obj: Any) -> Any:
        return self._channel._persistent_id(obj)

    def reducer_override(self, obj: Any) -> Any:
        """Subclasses of dict and list (read-only copies, counters) travel as plain ones."""
        if type(obj) is not dict and isinstance(obj, dict) and type(obj).__module__ != "collections":
            return (dict, (dict(obj),))
        if type(obj) is not list and isinstance(obj, list) and type(obj).__module__ not in ("omegaconf",):
            return (list, (list(obj),))
        return NotImplemented


class _TrustedUnpickler(pickle.Unpickler):
    def __init__(self, data: io.BytesIO, persistent: Callable[[Any], Any]) -> None:
        super().__init__(data)
        self._persistent = persistent

    def persistent_load(self, pid: Any) -> Any:
        return self._persistent(pid)


def _inert_reference(pid: Any) -> _Reference:
    if not isinstance(pid, tuple) or len(pid) not in (2, 3) or pid[0] not in ("mine", "yours"):
        raise pickle.UnpicklingError("bad reference")
    return _Reference(pid)


def _no_reference(pid: Any) -> Any:
    raise pickle.UnpicklingError("a frame carries no references")


def portable(exc: BaseException) -> RemoteError:
    """``exc`` as a :class:`RemoteError`: its type's name, message and traceback, as text."""
    return RemoteError(type(exc).__name__, str(exc), "".join(traceback.format_exception(exc)))
