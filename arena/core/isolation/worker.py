"""``python -m arena.core.isolation.worker FD``: a method's worker process (run.isolation=process)."""

import sys

from arena.core.isolation.isolated import worker_main

if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
