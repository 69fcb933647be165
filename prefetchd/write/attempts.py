"""How many times a writer started parsing one object with a format plugin and never finished:
the guard against a plugin that hangs where ``source.parse_timeout`` cannot interrupt it.

The plugin's time limit is a ``SIGALRM`` (``formats/plugin.py``); a plugin blocked in C code
that holds the GIL never sees it, stops the writer's heartbeat, and the supervisor kills the
writer (children.py, ``HEARTBEAT_TIMEOUT``). The restarted writer would open the same object
and hang again, for ever. So before a plugin reads an object the writer notes it in
``state_dir/journal/w<i>.parsing``::

    {"<object name>": <reads started without an end>, ...}

and removes the object's entry once the read ends (well or with an exception). An object
whose entry says it was started ``MAX_ATTEMPTS`` times already is quarantined (``timeout``)
instead of being read again. A writer killed for another reason while a plugin reads counts
as an attempt too; only ``MAX_ATTEMPTS`` such deaths on one object quarantine it. Entries are
only those of reads cut short (one per writer death at most), and the note goes once the last
of them ends. The built-in formats never write it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from prefetchd.layout import write_atomic

MAX_ATTEMPTS = 3


class ParseAttempts:
    """Writer ``i``'s note of the object a plugin is reading."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def begin(self, name: str) -> int:
        """Note that a read of ``name`` starts; how many reads of it started, this one
        included, without ending."""
        note = self._read()
        note[name] = note.get(name, 0) + 1
        write_atomic(self.path, json.dumps(note).encode())
        return note[name]

    def end(self, name: str) -> None:
        """The read of ``name`` ended (whatever its outcome): forget it."""
        note = self._read()
        note.pop(name, None)
        if note:
            write_atomic(self.path, json.dumps(note).encode())
        else:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def _read(self) -> dict[str, int]:
        """The note; empty if there is none or it is torn (a count lost is one more try)."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict):
            return {}
        return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, int)}
