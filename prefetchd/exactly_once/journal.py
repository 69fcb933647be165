"""A writer's commit journal: ``state_dir/journal/w<i>.log``, one JSON line per shard commit.

Writer ``i`` appends (and fsyncs) one line before it renames a shard into ``ready/`` (the
commit protocol: ``exactly_once/__init__.py``). Who reads it, and when:

- writer ``i`` alone appends to ``w<i>.log`` (and compacts it) while the daemon runs, and
  reads back its last entry when it starts, to roll that shard forward and resume its objects;
- the supervisor reads every writer's last entry at start-up, before any writer runs
  (``read_heads``, for ``recovery.py``), and may rewrite one to its last entry without the
  epochs it starts again (``Journal.rewrite``).

A line::

    {"version": 1, "shard": "e0-w1-3.tfrecord" | null, "counter": 3,
     "positions": {"<obj>": <records taken>, ...}, "finished": ["<obj>", ...]}

``positions`` counts the records taken from every object still open (in the order they were
opened), ``finished`` names the objects whose last record is in this (or an earlier) shard.
With ``epochs.order: replayable`` a line also holds ``"replay"``: the next object in order and
the mixer's seeded state at the commit (``write/replay.py``), so a restarted writer goes on in
the order an uninterrupted one would.

Other versions: a job resumed by another release reads a journal another version wrote. A line
without ``version`` (version 0) has the same fields. Unknown fields are ignored and a missing
``shard`` is null; ``counter``, ``positions`` and ``finished`` are required. A line that is
not a JSON object is a torn last write (its shard was never published) and is skipped. A line
of a newer version, or one without a required field, raises ``JournalError``: resuming from a
commit this version cannot read could publish records twice or lose them, so the writer stops
with the reason and the file named instead (finish the job with the newer release, or start
it afresh).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Self

from prefetchd.atomic import open_append, write_all, write_atomic
from prefetchd.errors import RuntimeFailure
from prefetchd.layout import Layout

COMPACT_EVERY = 256  # appended lines before the journal is rewritten to its last entry


class JournalError(RuntimeFailure):
    """A journal line this version cannot resume from (names the file and the reason)."""


class TornEntry(ValueError):
    """A line a crash cut short: its shard was never published, so it is skipped."""


@dataclass(frozen=True)
class JournalEntry:
    """One shard commit (``shard`` is None for a commit that only releases objects)."""

    VERSION: ClassVar[int] = 1

    shard: str | None
    counter: int
    positions: dict[str, int]
    finished: tuple[str, ...]
    replay: dict[str, Any] | None = None  # epochs.order: replayable: the writer's order state

    def encode(self) -> bytes:
        """The one encoder: the line, newline included."""
        entry = {
            "version": self.VERSION,
            "shard": self.shard,
            "counter": self.counter,
            "positions": self.positions,
            "finished": list(self.finished),
        }
        if self.replay is not None:
            entry["replay"] = self.replay
        return (json.dumps(entry) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes) -> Self:
        """The one decoder. Raises ``TornEntry`` for a torn line, ``JournalError`` for a line
        of a newer version or without a required field (see the module)."""
        try:
            raw: Any = json.loads(data)
        except ValueError:
            raise TornEntry(data) from None
        if not isinstance(raw, dict):
            raise TornEntry(data)
        version = raw.get("version", 0)
        if not isinstance(version, int) or version > cls.VERSION:
            raise JournalError(
                f"a commit of journal version {version!r}, newer than this "
                f"prefetchd's {cls.VERSION}: finish the job with that release or start afresh"
            )
        return cls._from_fields(raw)

    @classmethod
    def _from_fields(cls, raw: Mapping[str, Any]) -> Self:
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
                "a commit without a valid counter, positions or finished list; "
                "cannot resume from it"
            )
        replay = raw.get("replay")
        return cls(
            shard,
            counter,
            dict(positions),
            tuple(finished),
            dict(replay) if isinstance(replay, dict) else None,
        )


class Journal:
    """Writer ``i``'s journal file: appends are fsynced before the shard they describe is
    published; every ``COMPACT_EVERY`` appends it is rewritten to its last entry (only the last
    entry matters)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0  # appended since start or the last compaction

    def last(self) -> JournalEntry | None:
        """The last complete entry, or None if there is none (no file, nothing committed).
        Raises ``JournalError`` naming the file for an entry this version cannot resume from."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return None
        for line in reversed(lines):
            try:
                return JournalEntry.decode(line.encode())
            except TornEntry:
                continue
            except JournalError as exc:
                raise JournalError(f"{self.path}: {exc}") from None
        return None

    def rewrite(self, entry: JournalEntry) -> None:
        """Replace the journal by ``entry`` alone (atomically, fsynced)."""
        write_atomic(self.path, entry.encode(), fsync=True)

    def append(self, entry: JournalEntry) -> None:
        """Commit ``entry``: durable when this returns."""
        self.lines += 1
        if self.lines >= COMPACT_EVERY:
            self.rewrite(entry)
            self.lines = 1
            return
        fd = open_append(self.path)
        try:
            write_all(fd, entry.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


class Head(NamedTuple):
    """A writer's journal and its last entry, as recovery reads them."""

    journal: Journal
    last: JournalEntry


def read_heads(layout: Layout) -> dict[int, Head]:
    """Every writer's journal with its last entry, by writer index; writers that committed
    nothing are left out. Only for the supervisor at start-up, before any writer runs.
    Raises ``JournalError`` for a journal this version cannot read."""
    heads = {}
    for index, path in layout.journal_files().items():
        journal = Journal(path)
        last = journal.last()
        if last is not None:
            heads[index] = Head(journal, last)
    return heads
