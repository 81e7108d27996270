"""Prompt stops of a run's episode threads (Ctrl-C, SIGTERM).

Python delivers a signal to the main thread only. While it waits on worker threads that play
whole episodes, a plain thread pool would let every running episode play to its end (minutes
for a method whose ``solve`` plays several) before the run could stop. Instead the thread that
is interrupted sets a stop flag that its workers share, and each episode checks it before every
step and unwinds with :class:`Stopping`. An episode stopped this way is never recorded, so a
resumed run plays it again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


class Stopping(BaseException):
    """The run is stopping; raised in an episode thread at its next step.

    A ``BaseException``, like ``KeyboardInterrupt``, so that the error handling around
    episodes and plugin hooks (``except Exception``) does not record it as a failed episode.
    """


def current_flag() -> threading.Event | None:
    """The stop flag of the thread pool this thread works for (None outside one)."""
    return getattr(_local, "flag", None)


@contextmanager
def sharing(flag: threading.Event) -> Iterator[None]:
    """Make ``flag`` this thread's stop flag while the block runs (a worker's whole item)."""
    previous = current_flag()
    _local.flag = flag
    try:
        yield
    finally:
        _local.flag = previous


def check() -> None:
    """Raise :class:`Stopping` if this thread's pool was told to stop."""
    flag = current_flag()
    if flag is not None and flag.is_set():
        raise Stopping
