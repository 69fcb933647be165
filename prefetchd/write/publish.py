"""Publishing: a writer's current shard, its commit, and the roll-forward after a crash.

Commit protocol (``state_dir/journal/w<i>.log``, one JSON line per shard, fsynced; the line's
format is ``exactly_once/journal.py``)::

    shard complete in .tmp  ->  its mix (``shards/<shard>.mix``)  ->  ledger line
    (``exactly_once/ledger.py``)  ->  journal line
    {shard, positions, finished}  ->  rename into ready/  ->  delete the raw objects whose last
    record is in that shard (meta first: a meta whose object is gone then always means the
    object vanished)

``positions`` counts the records taken from every still-open object. After a crash the writer
rolls the last journalled shard forward if it is still in ``.tmp``, drops other temp shards,
and resumes each claimed object after the journalled position, so every record of the epoch is
published exactly once.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefetchd.atomic import write_atomic
from prefetchd.budget import Interrupted, RamBudget
from prefetchd.exactly_once.journal import Journal, JournalEntry
from prefetchd.exactly_once.ledger import record_published
from prefetchd.layout import Layout, parse_shard_name, shard_name, unpart
from prefetchd.messages.counters import WriterCounters
from prefetchd.write.composition import Composition
from prefetchd.write.flush import FlushClock
from prefetchd.write.mixing import Mixer
from prefetchd.write.objects import ObjectReader
from prefetchd.write.shards import ShardFile

log = logging.getLogger(__name__)


@dataclass
class CommitState:
    """The counter of the next shard and, after a restart, the journalled positions."""

    counter: int = 0
    positions: dict[str, int] = field(default_factory=dict)


class Publisher:
    """Writer ``i``'s shard being written and the commit that publishes it.

    Owns the current shard (``shard``, of one epoch: ``shard_epoch``), the shard counter, the
    commit journal, and the order of a commit's steps (``publish``); after a crash, the roll
    forward of the last journalled shard (``recover``)."""

    def __init__(
        self,
        layout: Layout,
        index: int,
        budget: RamBudget,
        mixer: Mixer,
        reader: ObjectReader,
        clock: FlushClock,
        counters: WriterCounters,
        *,
        gzip: bool,
        shard_size: int,
    ) -> None:
        self.layout = layout
        self.index = index
        self.budget = budget
        self.mixer = mixer
        self.reader = reader
        self.clock = clock
        self.counters = counters
        self.gzip = gzip
        self.shard_size = shard_size
        self.journal = Journal(layout.journal_file(index))
        self.commit = CommitState()
        # epochs.order: replayable: the order's state each commit records (write/replay.py)
        self.order_state: Callable[[], dict[str, Any]] | None = None
        self.shard: ShardFile | None = None
        self.shard_epoch: int | None = None
        self.composition = Composition()  # the current shard's objects, step by step

    def recover(self) -> dict[str, int]:
        """Finish what a crash interrupted: roll the last journalled shard forward if it is
        still in ``.tmp``, delete the objects it finished, drop this writer's other temp shards
        (their records are redone). The journalled positions of the claimed objects."""
        last = self.journal.last()
        if last is not None:
            tmp = self.layout.shard_part(last.shard or "")
            if last.shard and tmp.exists():
                os.rename(tmp, self.layout.ram_ready / last.shard)
                log.info("rolled forward shard %s after a restart", last.shard)
            for name in last.finished:
                self.reader.delete(name)
            self.commit = CommitState(last.counter + 1, dict(last.positions))
            self.journal.rewrite(last)
        for entry in os.scandir(self.layout.ram_tmp):
            parsed = parse_shard_name(unpart(entry.name))
            if parsed is not None and parsed[1] == self.index:
                os.unlink(entry.path)  # an unjournalled shard: its records are redone
        return self.commit.positions

    def room(self, epoch: int) -> int:
        """The bytes a shard of ``epoch`` still takes before it is full."""
        if self.shard is not None and self.shard_epoch == epoch:
            return self.shard_size - self.shard.size
        return self.shard_size

    def holds_records(self, epoch: int) -> bool:
        """Whether the current shard is of ``epoch`` and holds records."""
        shard = self.shard
        return shard is not None and self.shard_epoch == epoch and shard.records > 0

    def shard_for(self, epoch: int) -> ShardFile:
        """The shard records of ``epoch`` go into: the current one, or a new one (the current
        one published first if it is of another epoch)."""
        if self.shard is not None and self.shard_epoch != epoch:
            self.publish()  # only after a restart can open objects span two epochs
        if self.shard is None:
            self.shard_epoch = epoch
            self.counters["epoch"] = epoch
            name = shard_name(epoch, self.index, self.commit.counter, gzip=self.gzip)
            self.shard = ShardFile(self.layout, name, self.budget, gzip=self.gzip)
            self.clock.shard_opened()
        return self.shard

    def publish(self) -> None:
        """Commit the current shard (if any) and release the objects it finished, in the order
        of the commit protocol (this module's docstring)."""
        shard = self.shard
        if shard is None and not self.mixer.finished:
            return
        entry = JournalEntry(
            shard=shard.name if shard else None,
            counter=self.commit.counter,
            positions={o.name: o.taken for o in self.mixer.open},
            finished=tuple(o.name for o in self.mixer.finished),
            replay=self.order_state() if self.order_state is not None else None,
        )
        if shard is not None:
            shard.finish()
            # which objects it holds, for positions that outlive this host (trained_objects.py); a
            # redone shard's replaces the one of the shard cut short
            mix = self.composition.mix(self.mixer.open, self.mixer.finished)
            write_atomic(self.layout.shard_mix(shard.name), mix.encode())
            record_published(self.layout, self.index, shard.name, shard.records)
        self.journal.append(entry)
        if shard is not None:
            shard.publish()
            self.counters["records_written"] += shard.records
            self.counters["bytes_written"] += shard.size
            self.counters["shards_written"] += 1
            self.commit.counter += 1
            self.clock.shard_published()
        for obj in self.mixer.finished:
            self.reader.delete(obj.name, obj.meta_path)
        self.mixer.finished.clear()
        self.shard = None
        self.composition = Composition()

    def stop(self) -> None:
        """Drain: publish what is written so far so no record is stranded in a temp file."""
        if self.shard is not None and self.shard.records:
            with contextlib.suppress(Interrupted):
                self.publish()
        elif self.shard is not None:
            self.shard.discard()
            self.shard = None
            self.composition = Composition()
