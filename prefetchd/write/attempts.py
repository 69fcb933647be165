"""How many times a writer's reads of one object with a format plugin hung until the writer
was killed: the guard against a plugin that hangs where ``source.parse_timeout`` cannot
interrupt it.

The plugin's time limit is a ``SIGALRM`` (``formats/plugin.py``); a plugin blocked in C code
that holds the GIL never sees it, stops the writer's heartbeat, and the supervisor kills the
writer (children.py, ``HEARTBEAT_TIMEOUT``, 30 s). The restarted writer would open the same
object and hang again, for ever. So before a plugin reads an object the writer notes it in
``state_dir/journal/w<i>.parsing``::

    {"<object name>": {"hung": <reads cut short after HANG_SECONDS or more>,
                       "started": <CLOCK_MONOTONIC when the last read started>}, ...}

and removes the entry once the read ends (well or with an exception). A read that is found
still noted at the next start was cut short; it counts as hung if it started ``HANG_SECONDS``
or more before (the heartbeat kill takes 30 s; a plugin that kills its process at once, as a
segfault does, is a crash, left to the supervisor's crash policy). An object with
``MAX_ATTEMPTS`` hung reads is quarantined (``timeout``) instead of being read again.
CLOCK_MONOTONIC is shared by all processes and never steps; after a reboot it restarts, and
an older note then counts nothing. The built-in formats never write the note.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from prefetchd.atomic import write_atomic

MAX_ATTEMPTS = 3
HANG_SECONDS = 25.0  # a read cut short after this long was a hang (HEARTBEAT_TIMEOUT is 30 s)


class ParseAttempts:
    """Writer ``i``'s note of the objects a plugin started reading and did not finish."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock

    def begin(self, name: str) -> int:
        """Note that a read of ``name`` starts; how many earlier reads of it hung."""
        note = self._read()
        now = self.clock()
        hung, started = note.get(name, (0, now))
        if name in note and now - started >= HANG_SECONDS:
            hung += 1
        note[name] = (hung, now)
        self._write(note)
        return hung

    def end(self, name: str) -> None:
        """The read of ``name`` ended (whatever its outcome): forget it."""
        note = self._read()
        note.pop(name, None)
        self._write(note)

    def _write(self, note: dict[str, tuple[int, float]]) -> None:
        if not note:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        raw = {name: {"hung": hung, "started": started} for name, (hung, started) in note.items()}
        write_atomic(self.path, json.dumps(raw).encode())

    def _read(self) -> dict[str, tuple[int, float]]:
        """The note; empty if there is none or it is torn (a count lost is one more try)."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict):
            return {}
        return {
            name: (entry["hung"], float(entry["started"]))
            for name, entry in raw.items()
            if isinstance(entry, dict)
            and isinstance(entry.get("hung"), int)
            and isinstance(entry.get("started"), int | float)
        }
