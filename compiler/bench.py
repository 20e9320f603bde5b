"""``python -m compiler.bench ENGINE PATH RUNS WARMUP OUT_NPZ THREADS``: one benchmark worker.

The entry point scripts and tests start as a worker process; the code is
``compiler/tools/bench.py``, whose ``measure`` and ``random_feeds`` are re-exported here.
"""

import sys

from .tools.bench import main, measure, random_feeds, worker  # noqa: F401

if __name__ == "__main__":
    main(sys.argv[1:])
