"""A steppable wall clock for the clock test: every Python process started with this directory
on PYTHONPATH (the daemon, its spawned children, the trainer) reads ``time.time()`` plus the
offset in seconds written in ``$PREFETCHD_TEST_WALL_STEP`` (a file; missing or empty: 0), as
after an NTP step. ``time.monotonic()`` is left alone. A thread rereads the file every 50 ms,
so all processes see a step within a fraction of a heartbeat."""

from __future__ import annotations

import os
import threading
import time

_PATH = os.environ.get("PREFETCHD_TEST_WALL_STEP")


def _install(path: str) -> None:
    real = time.time
    offset = [0.0]

    def read() -> None:
        while True:
            try:
                with open(path, encoding="ascii") as f:
                    offset[0] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)

    time.time = lambda: real() + offset[0]
    threading.Thread(target=read, name="wall-step", daemon=True).start()


if _PATH:
    _install(_PATH)
