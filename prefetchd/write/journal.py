"""A writer's commit journal: ``state_dir/journal/w<i>.log``, one JSON line per shard commit.

Writer ``i`` appends (and fsyncs) one line before it renames a shard into ``ready/``; after a
crash it reads back the last line to roll that shard forward and resume its objects (the
commit protocol is in ``writer.py``). Only writer ``i`` reads its journal. A line::

    {"version": 1, "shard": "e0-w1-3.tfrecord" | null, "counter": 3,
     "positions": {"<obj>": <records taken>, ...}, "finished": ["<obj>", ...]}

``positions`` counts the records taken from every object still open, ``finished`` names the
objects whose last record is in this (or an earlier) shard.

Other versions: a job resumed by another release reads a journal another version wrote. A line
without ``version`` (version 0) has the same fields. Unknown fields are ignored and a missing
``shard`` is null; ``counter``, ``positions`` and ``finished`` are required. A line that is
not a JSON object is a torn last write (its shard was never published) and is skipped. A line
of a newer version, or one without a required field, raises ``JournalError``: resuming from a
commit this version cannot read could publish records twice or lose them, so the writer stops
with the reason instead (finish the job with the newer release, or start it afresh).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefetchd.errors import RuntimeFailure
from prefetchd.layout import open_append, write_atomic

JOURNAL_VERSION = 1
COMPACT_EVERY = 256  # appended lines before the journal is rewritten to its last entry


class JournalError(RuntimeFailure):
    """A journal line this version cannot resume from (names the file and the reason)."""


@dataclass(frozen=True)
class JournalEntry:
    """One shard commit (``shard`` is None for a commit that only releases objects)."""

    shard: str | None
    counter: int
    positions: dict[str, int]
    finished: tuple[str, ...]

    def encode(self) -> str:
        """The one encoder: the line, newline included."""
        entry = {
            "version": JOURNAL_VERSION,
            "shard": self.shard,
            "counter": self.counter,
            "positions": self.positions,
            "finished": list(self.finished),
        }
        return json.dumps(entry) + "\n"

    @classmethod
    def decode(cls, line: str, where: Path) -> JournalEntry | None:
        """The one decoder: None for a torn line; raises ``JournalError`` naming ``where``
        for a line of a newer version or without a required field (see the module)."""
        try:
            raw: Any = json.loads(line)
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
        version = raw.get("version", 0)
        if not isinstance(version, int) or version > JOURNAL_VERSION:
            raise JournalError(
                f"{where}: a commit of journal version {version!r}, newer than this "
                f"prefetchd's {JOURNAL_VERSION}: finish the job with that release or start afresh"
            )
        return cls._from_fields(raw, where)

    @classmethod
    def _from_fields(cls, raw: Mapping[str, Any], where: Path) -> JournalEntry:
        shard, counter = raw.get("shard"), raw.get("counter")
        positions, finished = raw.get("positions"), raw.get("finished")
        if (
            not (shard is None or isinstance(shard, str))
            or not isinstance(counter, int)
            or not isinstance(positions, dict)
            or not all(isinstance(k, str) and isinstance(v, int) for k, v in positions.items())
            or not isinstance(finished, list)
            or not all(isinstance(n, str) for n in finished)
        ):
            raise JournalError(
                f"{where}: a commit without a valid counter, positions or finished list; "
                "cannot resume from it"
            )
        return cls(shard, counter, dict(positions), tuple(finished))


class Journal:
    """Writer ``i``'s journal file: appends are fsynced before the shard they describe is
    published; every ``COMPACT_EVERY`` appends it is rewritten to its last entry (only the last
    entry matters)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0  # appended since start or the last compaction

    def last(self) -> JournalEntry | None:
        """The last complete entry, or None if there is none (no file, nothing committed)."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        for line in reversed(lines):
            entry = JournalEntry.decode(line, self.path)
            if entry is not None:
                return entry
        return None

    def rewrite(self, entry: JournalEntry) -> None:
        """Replace the journal by ``entry`` alone (atomically, fsynced)."""
        write_atomic(self.path, entry.encode().encode(), fsync=True)

    def append(self, entry: JournalEntry) -> None:
        """Commit ``entry``: durable when this returns."""
        self.lines += 1
        if self.lines >= COMPACT_EVERY:
            self.rewrite(entry)
            self.lines = 1
            return
        with os.fdopen(open_append(self.path), "a", encoding="utf-8") as f:
            f.write(entry.encode())
            f.flush()
            os.fsync(f.fileno())
