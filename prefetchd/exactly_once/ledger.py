"""The shard ledger: which shards were published, and which of them trainers finished.

"Ledger" in prefetchd means this and nothing else.

It lives in ``state_dir`` (on disk, surviving a reboot that empties the RAM disk)::

    shards/e<k>.w<i>.log     "<shard> <records>" per shard writer i published in epoch k,
                             appended and fsynced by the writer before its journal line
    shards/e<k>.delivered    "<shard>" per shard of epoch k a trainer finished: the supervisor
                             sees the claimant delete it (inotify) and appends it, fsynced,
                             within one loop tick (0.2 s)

A ledger line is written before the journal commit of its shard, so a line may name a shard
whose commit never happened (a crash in between); the writer's journal decides: shard ``c`` of
writer ``i`` is published iff ``c`` < the journal's last counter, or it is the journal's last
shard (``published_shards``, given each writer's last ``Commit``).

After a restart the supervisor compares the ledger with the files (``assess``): while the RAM
disk is intact (our marker and token survived), a published shard no longer on it was finished
by a trainer; once it was lost, only the delivered log says what the trainers had read. What is
neither delivered nor on disk is lost.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from prefetchd.atomic import open_append
from prefetchd.layout import Layout, parse_shard_name


def record_published(layout: Layout, writer: int, shard: str, records: int) -> None:
    """Append ``shard`` to writer ``writer``'s ledger of its epoch; durable when this returns."""
    parsed = parse_shard_name(shard)
    assert parsed is not None, shard
    _append(layout.published_ledger(parsed.epoch, writer), f"{shard} {records}\n")


def record_delivered(layout: Layout, shards: Iterable[str]) -> None:
    """Append finished shards to their epochs' delivered logs (one fsync per epoch)."""
    by_epoch: dict[int, list[str]] = {}
    for shard in shards:
        parsed = parse_shard_name(shard)
        if parsed is not None:
            by_epoch.setdefault(parsed.epoch, []).append(shard)
    for epoch, names in by_epoch.items():
        _append(layout.delivered_ledger(epoch), "".join(f"{n}\n" for n in names))


def forget_epoch(layout: Layout, epoch: int) -> None:
    """Drop epoch ``epoch``'s ledger: every shard of it was read, so none can be lost any more
    (an endless job would otherwise keep one more ledger per epoch)."""
    for path, name in layout.ledger_files():
        if name.epoch == epoch:
            path.unlink(missing_ok=True)
    for path in layout.shard_mixes(epoch):
        path.unlink(missing_ok=True)


def _append(path: Path, text: str) -> None:
    fd = open_append(path)
    try:
        os.write(fd, text.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)


def read_ledger(layout: Layout) -> tuple[dict[str, int], set[str]]:
    """``(published candidates: shard -> records, delivered shards)``, every epoch."""
    published: dict[str, int] = {}
    delivered: set[str] = set()
    for path, name in layout.ledger_files():
        for line in _lines(path):
            fields = line.split()
            if name.writer is None and len(fields) == 1:
                delivered.add(fields[0])
            elif name.writer is not None and len(fields) == 2 and fields[1].isdigit():
                published[fields[0]] = int(fields[1])  # the last line of a redone shard wins
    return published, delivered


def _lines(path: Path) -> list[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


class Commit(NamedTuple):
    """What the ledger rule needs of a writer's last journal entry."""

    counter: int
    shard: str | None


def published_shards(candidates: Mapping[str, int], heads: Mapping[int, Commit]) -> dict[str, int]:
    """The candidates whose commit happened, given each writer's last commit (see the
    module)."""
    kept = {}
    for shard, records in candidates.items():
        parsed = parse_shard_name(shard)
        head = heads.get(parsed.writer) if parsed else None
        if parsed is None or head is None:
            continue
        if parsed.counter < head.counter or shard == head.shard:
            kept[shard] = records
    return kept


@dataclass(frozen=True)
class Assessment:
    """What a restarted daemon finds: ``delivered`` (finished by trainers), ``lost`` (shard ->
    records: published, not delivered, no longer on disk), and the first epoch to redo."""

    delivered: frozenset[str]
    lost: Mapping[str, int]

    @property
    def first_lost_epoch(self) -> int | None:
        epochs = [p.epoch for p in map(parse_shard_name, self.lost) if p is not None]
        return min(epochs) if epochs else None

    def delivered_from(self, epoch: int) -> int:
        """How many delivered shards belong to ``epoch`` or later."""
        return sum(1 for p in map(parse_shard_name, self.delivered) if p and p.epoch >= epoch)

    def lost_records(self) -> int:
        return sum(self.lost.values())


def assess(
    published: Mapping[str, int], delivered: set[str], present: set[str], *, intact: bool
) -> Assessment:
    """Pure: classify every published shard as delivered, present or lost (see the module)."""
    gone = {s: n for s, n in published.items() if s not in present and s not in delivered}
    if intact:
        return Assessment(frozenset(delivered | set(gone)), {})
    return Assessment(frozenset(delivered), gone)
