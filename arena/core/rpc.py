"""Calls both ways between two processes over one pipe: the harness and a method's worker.

Each side hands the other some of its objects by reference (the harness its run, store and LLM;
the worker the method's policies) and everything else by value (tasks, trajectories,
experiences). A call runs on the thread that waits for it: when the worker, serving a hook the
harness's episode thread called, calls back into the run, the call is served by that same
episode thread, so thread-bound state (the episode being played, its seed) is what it would
be in one process. Calls that start on a fresh thread of one side get a fresh thread on the
other.

The harness never unpickles what the worker sends with the full pickle machinery (that would
run any code the worker chose): :class:`SafeUnpickler` builds only the classes it allows.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import io
import itertools
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

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


class SafeUnpickler(pickle.Unpickler):
    """Builds only allowed classes: builtins' plain types, :data:`SAFE_CALLABLES`, and the
    classes defined in ``modules`` (e.g. ``arena.core.types``). Anything else (``os.system``,
    a function of the harness) is refused before it runs."""

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
    may build. ``on_refused(kind, name)`` is told of each name refused (the harness records it).
    """

    def __init__(self, connection: Any, name: str, export: Callable[[Any], frozenset[str] | None],
                 trusted_modules: Iterable[str] | None = None,
                 on_refused: Callable[[str, str], None] | None = None,
                 portable_error: Callable[[BaseException], BaseException] = lambda exc: exc) -> None:
        self._connection = connection
        self._portable_error = portable_error
        self._ended = threading.Event()
        self.name = name
        self._export = export
        self._trusted_modules = None if trusted_modules is None else frozenset(trusted_modules)
        self._on_refused = on_refused or (lambda kind, attr: None)
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
        try:
            self._connection.close()
        except OSError:
            pass
        for inbox in list(self._inboxes.values()):
            inbox.put(("closed", why))
        self._ended.set()

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
            value, ok = self._perform(handle, op, name, args, kwargs), True
        except BaseException as exc:
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
            raise Refused(f"{kind}.{name} is not offered to the method's process; the names it "
                          f"may use are: {', '.join(sorted(n for n in names if not n.startswith('__')))}")
        if op == "get":
            value = getattr(obj, name)
            if callable(value) and not isinstance(value, type) and self._export(value) is None:
                return MethodMarker()
            return value
        if op == "set":  # the other side's objects are read, never changed, from here
            self._on_refused(kind, f"{name} (set)")
            raise Refused(f"{kind}.{name} cannot be set from the method's process")
        return getattr(obj, name)(*args, **kwargs)

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
            unpickler: pickle.Unpickler = _TrustedUnpickler(io.BytesIO(data), self._persistent_load)
        else:
            unpickler = SafeUnpickler(io.BytesIO(data), self._trusted_modules, self._persistent_load)
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


class MethodMarker:
    """The answer to reading an attribute that is a method: the reader then calls it by name."""


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


def _no_reference(pid: Any) -> Any:
    raise pickle.UnpicklingError("a frame carries no references")


def portable(exc: BaseException) -> RemoteError:
    """``exc`` as a :class:`RemoteError`: its type's name, message and traceback, as text."""
    return RemoteError(type(exc).__name__, str(exc), "".join(traceback.format_exception(exc)))
