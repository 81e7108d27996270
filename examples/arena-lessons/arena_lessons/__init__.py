"""lessons: an example third-party Arena method (plugin in :mod:`arena_lessons.plugin`)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("arena-lessons")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0.0.0"
