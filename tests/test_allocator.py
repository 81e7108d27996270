"""The C allocator settings a run starts with (arena.core.host.allocator)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from arena.core.host import allocator

pytestmark = pytest.mark.skipif(allocator._LIBC is None, reason="glibc only (Linux)")

SHOW = "import json; from arena.core.host.allocator import compact_allocator as c; print(json.dumps(c()))"


def chosen(**env: str) -> dict[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != allocator.OPT_OUT}
    done = subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, check=True,
                          env={**clean, **env})
    return json.loads(done.stdout)


def test_one_arena_and_large_blocks_mapped_unless_the_user_chose() -> None:
    assert chosen() == {"arena_max": 1, "mmap_threshold": 4 << 20}
    assert chosen(MALLOC_ARENA_MAX="4") == {"mmap_threshold": 4 << 20}  # the user's own setting stays
    assert chosen(MALLOC_MMAP_THRESHOLD_="65536") == {"arena_max": 1}
    assert chosen(ARENA_MALLOC="glibc") == {}


def test_the_command_line_sets_it_before_anything_runs() -> None:
    """`arena` starts with it (a run's threads then share one arena); --help still loads no torch."""
    code = ("import sys; import arena.cli as cli; "
            "calls = []; cli.compact_allocator = lambda: calls.append(1) or {}; sys.argv = ['arena', '--help']\n"
            "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print(calls, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[1] False"
