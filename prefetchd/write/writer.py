"""A writer process: claim downloaded objects, draw their records at random, write shards.

Writer ``i`` claims raw objects by renaming ``cache/ready/<obj>`` to ``cache/claimed/w<i>-<obj>``,
keeps up to ``output.mix`` of them open, and writes each next record from a randomly chosen
open object (seeded per epoch and writer) into the current shard. A shard holds records of one
epoch only and is published when it reaches ``output.shard_size``, when its epoch has nothing
left to give, when no input has arrived for ``IDLE_FLUSH`` seconds, or when it is
``STARVED_FLUSH`` seconds old while no shard is ready for the trainers (an age that doubles,
up to ``STARVED_FLUSH_MAX``, while they stay starved). A writer's first
``FIRST_SHARDS`` shards of a run go out at once while no shard is ready, after the step that
wrote them, and it draws them from the objects it has: the trainers' first batch waits on them
(``prefetchd.tf.dataset`` opens four shards before it gives a record).

Memory: each open object holds its current batch (and, in the block shuffle, what it keeps between
batches); normally at most ``normal_hold`` bytes (twice its shuffle block plus two input
batches). While one object holds more (a record near ``output.max_record_size``), the writer
takes records only from the objects whose batch is not used up and gives no other object a new
batch nor opens one until it is back under (``_may_fetch``): so one writer holds at most one
large record's batch at a time, whatever ``output.mix`` is (docs/reliability.md invariant 8).

The work is done a batch at a time: each open object gives batches of ready frames
(``frames.Frames``), the choices of object are drawn ``PICKS`` at a time, and one call
(``core.IMPL.interleave``) copies up to ``STEP_BYTES`` of frames in the drawn order into one
buffer that the shard takes in one write. Per record, no Python code runs on this path.

Commit protocol (``state_dir/journal/w<i>.log``, one JSON line per shard, fsynced; the line's
format is ``journal.py``)::

    shard complete in .tmp  ->  ledger line (``ledger.py``)  ->  journal line {shard, positions,
    finished}  ->  rename into ready/  ->  delete the raw objects whose last record is in that
    shard (meta first: a meta whose object is gone then always means the object vanished)

``positions`` counts the records taken from every still-open object. After a crash the writer
rolls the last journalled shard forward if it is still in ``.tmp``, drops other temp shards,
and resumes each claimed object after the journalled position, so every record of the epoch is
published exactly once.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prefetchd.budget import Interrupted, RamBudget, ram_chunk
from prefetchd.inotify import IN_MOVED_TO, Event, Watch
from prefetchd.layout import (
    TMP_SUFFIX,
    epoch_prefix,
    parse_object_name,
    parse_shard_name,
    read_small,
    shard_name,
    writer_claim_prefix,
)
from prefetchd.ledger import record_published
from prefetchd.logs import escape_key
from prefetchd.seeds import mixing_rng, object_rng
from prefetchd.supervise.child import ChildContext
from prefetchd.supervise.child_report import Activity, QuarantineCounter, WriterCounters
from prefetchd.write import core, pycore
from prefetchd.write.attempts import MAX_ATTEMPTS, ParseAttempts
from prefetchd.write.formats import (
    Format,
    check_object,
    get_format,
    object_frames,
    read_whole_first,
    shuffled_object_frames,
)
from prefetchd.write.formats.plugin import PluginFormat, PluginHeartbeat
from prefetchd.write.frames import BATCH_BYTES, EMPTY, Frames
from prefetchd.write.journal import Journal, JournalEntry
from prefetchd.write.quarantine import ParseTimeout, Reason, classify
from prefetchd.write.shards import ShardFile
from prefetchd.write.shuffle import Holding

log = logging.getLogger(__name__)

IDLE_FLUSH = 0.5  # seconds without input before a partial shard is published
STARVED_FLUSH = 0.2  # age of a partial shard published early while ready/ is empty ...
STARVED_FLUSH_MAX = 1.0  # ... doubling per early shard while they stay empty, up to this
FIRST_SHARDS = 2  # shards a writer publishes at once while ready/ is empty, once per start
FILL_WAIT = 0.5  # seconds a writer waits for output.mix open objects before drawing anyway
STARVED_FILL = 0.25  # ... or this long while no shard is ready for the trainers
FILL_CHECK = 0.05  # how often a writer with fewer than output.mix objects re-checks the above
LISTING_MAX_AGE = 0.5
# Writers share the arrivals by seq (``_pick``): a writer takes its own share first, and one
# of another writer's once it has waited this long in ready/ ...
STEAL_AFTER = 0.05
PEEK = 8  # ... among the first this many (or 2 per writer) names of ready/: a bounded look
# With epochs.shuffle, each open object's records come in a seeded random order: uncompressed
# TFRecord objects are shuffled whole by offsets; other objects pass through a block shuffle
# (shuffle.py), and the blocks of all open objects together hold at most this much (or 256 KiB
# per object).
SHUFFLE_BYTES = 32 * 1024 * 1024
SHUFFLE_RECORDS = 65536
STEP_BYTES = 1024 * 1024  # frames copied per step: one write, one report and stop check
PICKS = 16384  # choices of object drawn at once
# Frames this large on average are written where they lie (one writev of views) instead of
# copied into one buffer first: a Python step per frame (~0.5 us) costs less than copying
# 16 KiB (bench.profile.writer medium, 16-128 KiB records: 5 % less writer CPU than at 64 KiB).
LARGE_FRAME = 16 * 1024
MALLOC_KEEP = 32 * 1024 * 1024  # freed memory a writer keeps for reuse (_reuse_freed_memory)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


@dataclass
class OpenObject:
    """A claimed raw object and how many of its records are already taken."""

    name: str
    key: str
    epoch: int
    path: Path
    batches: Iterator[Frames]
    frames: Frames = EMPTY  # the current batch; frames[cursor:] are still to be written
    cursor: int = 0
    taken: int = 0
    holding: Holding = field(default_factory=Holding)  # what ``batches`` keeps besides frames
    waiting: bool = False  # its batch ran out while another object held a large one
    started: bool = True  # False: reopened after a restart, not yet read up to ``taken``
    meta: dict[str, object] = field(default_factory=dict)  # the downloader's meta of it

    def held(self) -> int:
        """The bytes this object keeps in memory: its current batch and its iterator's."""
        return len(self.frames.data) + self.holding.bytes


_REASON_COUNTER: dict[Reason, QuarantineCounter] = {
    Reason.CORRUPT: "quarantined_corrupt",
    Reason.TOO_LARGE: "quarantined_too_large",
    Reason.TIMEOUT: "quarantined_timeout",
    Reason.PLUGIN_ERROR: "quarantined_plugin_error",
}


def _reuse_freed_memory() -> None:
    """Have glibc keep freed batch buffers for reuse instead of unmapping them.

    A writer allocates and frees buffers of 0.1-4 MiB all the time. By default glibc maps
    each such buffer afresh or trims the heap after freeing one, and the page faults of touching
    fresh memory then cost more than the copies themselves (a 200 KiB copy into fresh memory
    ran at 1.5 GB/s instead of 17). Fixed thresholds keep up to ``MALLOC_KEEP`` freed bytes:
    a bounded, stated cost in RSS. A no-op where mallopt is missing (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_TRIM_THRESHOLD, MALLOC_KEEP)
    mallopt(_M_MMAP_THRESHOLD, MALLOC_KEEP)


def _large_frames(objects: list[OpenObject]) -> bool:
    """Whether the current batches' frames average ``LARGE_FRAME`` bytes or more."""
    frames = sum(len(o.frames) for o in objects)
    return sum(len(o.frames.data) for o in objects) >= LARGE_FRAME * max(1, frames)


@dataclass
class CommitState:
    counter: int = 0
    positions: dict[str, int] = field(default_factory=dict)


class Writer:
    def __init__(self, ctx: ChildContext, index: int) -> None:
        self.ctx = ctx
        self.index = index
        self.config = ctx.config
        self.layout = ctx.layout
        out = self.config.output
        self.format: Format = get_format(
            self.config.source.format,
            max_record_size=out.max_record_size,
            parse_timeout=self.config.source.parse_timeout,
        )
        self.budget = RamBudget(
            self.layout,
            out.ram_budget,
            ram_chunk(out.shard_size),
            self._waiting_for_ram,
            self._headroom,
        )
        self.shuffle_bytes = max(256 * 1024, SHUFFLE_BYTES // out.mix)  # per open object
        # what an open object holds at most with records well under a batch: its block, the
        # batch it gave and its input batch (see _may_fetch)
        self.normal_hold = 2 * self.shuffle_bytes + 2 * BATCH_BYTES
        self.oldest_epoch = 0  # lowest epoch not yet complete, as far as this writer knows
        self.prefix = writer_claim_prefix(index)
        # Joined per object as text: a pathlib join and its str() cost more than the syscall.
        self._ready_dir = str(self.layout.cache_ready)
        self._claimed_prefix = f"{self.layout.cache_claimed}/{self.prefix}"
        self._meta_dir = str(self.layout.cache_meta)
        self.journal = Journal(self.layout.journal / f"w{index}.log")
        self.attempts = ParseAttempts(self.layout.journal / f"w{index}.parsing")
        self.open: list[OpenObject] = []
        self.finished: list[OpenObject] = []  # drained, deleted once their shard is published
        self.shard: ShardFile | None = None
        self.shard_epoch: int | None = None
        self.mix_epoch: int | None = None  # the epoch mix_state was seeded for
        self.mix_state = 0  # SplitMix64 state of the choices of object
        self.picks = b""  # choices of object drawn ahead: uint32 indices into _mixable()
        self.pick_at = 0
        self.commit = CommitState()
        self.listing: list[str] = []
        self.listed_at = 0.0
        self.first_seen: dict[str, float] = {}  # when each name of ``listing`` was first seen
        self.writers = out.writers
        self.peek = max(PEEK, 2 * out.writers)
        self.arrived: list[str] = []  # renamed into ready/ (inotify) since ``listing`` was made
        self.arrivals: Watch | None = None  # renames into ready/, while run() runs
        self.last_input = time.monotonic()
        self.fill_since: float | None = None  # since when fewer than output.mix are open
        self.fill_checked = 0.0
        self.fill_wait = True
        self.shard_checked = 0.0  # when _trainers_starved last looked (or the shard opened)
        self.starved_age = STARVED_FLUSH  # the age at which _trainers_starved looks next
        self.published = 0  # shards this process published (the first FIRST_SHARDS go early)
        self.counters = ctx.counters = WriterCounters(
            records_written=0,
            shards_written=0,
            bytes_written=0,
            objects_consumed=0,
            errors=0,
            epoch=None,
            ram_wait_s=0.0,
            objects_open=0,
            activity=Activity.STARTING,
            objects_quarantined=0,
            quarantined_corrupt=0,
            quarantined_too_large=0,
            quarantined_timeout=0,
            quarantined_plugin_error=0,
        )

    # --- boot and recovery --------------------------------------------------------------------

    def run(self) -> None:
        log.info("writer %d: record framing and mixing in %s", self.index, core.ACTIVE)
        _reuse_freed_memory()
        self._recover()
        self.ctx.settled()
        with Watch(self.layout.cache_ready, IN_MOVED_TO) as arrivals, self._plugin_heartbeat():
            self.arrivals = arrivals
            with contextlib.suppress(Interrupted):
                self._loop()
            self._stop()

    def _plugin_heartbeat(self) -> contextlib.AbstractContextManager[object]:
        """With a plugin format, a thread that reports while the plugin's code runs (a slow
        object within ``source.parse_timeout`` must not look like a hung writer)."""
        if not isinstance(self.format, PluginFormat):
            return contextlib.nullcontext()
        return PluginHeartbeat(self.format, lambda: self.ctx.report(force=True), 1.0)

    def _recover(self) -> None:
        last = self.journal.last()
        if last is not None:
            tmp = self.layout.ram_tmp / f"{last.shard}{TMP_SUFFIX}"
            if last.shard and tmp.exists():
                os.rename(tmp, self.layout.ram_ready / last.shard)
                log.info("rolled forward shard %s after a restart", last.shard)
            for name in last.finished:
                self._delete_raw(name)
            self.commit = CommitState(last.counter + 1, dict(last.positions))
            self.journal.rewrite(last)
        for entry in os.scandir(self.layout.ram_tmp):
            parsed = parse_shard_name(entry.name.removesuffix(TMP_SUFFIX))
            if parsed is not None and parsed[1] == self.index:
                os.unlink(entry.path)  # an unjournalled shard: its records are redone below
        claimed = sorted(
            e.name[len(self.prefix) :]
            for e in os.scandir(self.layout.cache_claimed)
            if e.name.startswith(self.prefix)
        )
        for name in claimed:
            self._open(name, resume_at=self.commit.positions.get(name, 0))
        if claimed:
            log.info("resuming %d claimed objects after a restart", len(claimed))

    # --- main loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.ctx.should_stop():
            self._refill()
            if not self.open:
                self._idle()
                continue
            if self._filling():
                self.counters["activity"] = Activity.WAITING_TO_MIX
                self._report()
                self._wait_for_arrivals(0.05)
                continue
            self._step()
            if self.shard is not None and (
                self.shard.size >= self.config.output.shard_size or self._trainers_starved()
            ):
                self._publish()
            self._report()

    def _step(self) -> None:
        """Write the next records, drawn at random across the open objects, into the shard
        (at most ``STEP_BYTES``, and never past ``shard_size``, up to the first pick of an
        object whose batch ran out); then refill the objects whose batch ran out."""
        self._resume_waiting()
        if not self.open:
            return  # the waiting objects were drained
        mixable = self._mixable()
        epoch = mixable[0].epoch
        if self.pick_at * 4 >= len(self.picks):
            self._draw(mixable)
        room = self.config.output.shard_size
        if self.shard is not None and self.shard_epoch == epoch:
            room -= self.shard.size
        cursors = array("Q", [o.cursor for o in mixable])
        sources = [(o.frames.data, o.frames.ends) for o in mixable]
        limit = min(STEP_BYTES, room)
        parts: list[bytes] | list[memoryview]
        if _large_frames(mixable):  # write them where they lie: one copy less per byte
            parts, stop = pycore.interleave_views(sources, cursors, self.picks, self.pick_at, limit)
        else:
            data, stop = core.IMPL.interleave(sources, cursors, self.picks, self.pick_at, limit)
            parts = [data]
        if stop > self.pick_at:
            # `taken` counts only written records: _shard_for may journal it (publishing a
            # shard of another epoch), and the write may be interrupted waiting for RAM
            self._shard_for(epoch).write_frames(parts, stop - self.pick_at)
            for obj, cursor in zip(mixable, cursors, strict=True):
                obj.taken += cursor - obj.cursor
                obj.cursor = cursor
        self.pick_at = stop
        for obj in mixable:  # at once: an object is drained as soon as its last record is in
            if obj.cursor >= len(obj.frames):
                if self._may_fetch(obj):
                    self._next_batch(obj)
                else:
                    self._wait(obj)

    def _mixable(self) -> list[OpenObject]:
        """The open objects of the oldest open epoch (only after a restart can open objects
        span two epochs; a shard holds one), but those waiting for a batch (``_wait``)."""
        epoch = min(o.epoch for o in self.open)
        if epoch != self.mix_epoch:
            self.mix_epoch = epoch
            self.mix_state = mixing_rng(self.config.epochs.seed, epoch, self.index).getrandbits(64)
            self.picks = b""
        return [o for o in self.open if o.epoch == epoch and not o.waiting]

    # --- the memory bound: one large batch per writer -----------------------------------------

    def held_bytes(self) -> int:
        """The bytes the open objects hold: their batches and what their iterators keep."""
        return sum(o.held() for o in self.open)

    def _over_share(self) -> bool:
        """Whether an open object holds more than ``normal_hold`` (a large record's batch)."""
        return any(o.held() > self.normal_hold for o in self.open)

    def _may_fetch(self, obj: OpenObject) -> bool:
        """Whether ``obj`` may read its next batch: only while no other open object holds more
        than ``normal_hold``. So at most one object holds a large batch at a time; with
        records well under a batch this is always true, and the mixing is as without it."""
        limit = self.normal_hold
        return all(o.held() <= limit for o in self.open if o is not obj)

    def _wait(self, obj: OpenObject) -> None:
        """Park ``obj``, whose batch is used up, until ``_may_fetch``: out of the mixing, its
        used-up batch freed."""
        obj.frames, obj.cursor, obj.waiting = EMPTY, 0, True
        self.picks = b""  # the set of objects to choose from changed

    def _resume_waiting(self) -> None:
        """Give the parked objects their next batch once they may (an object reopened after a
        restart while another held a large batch: its first). If every object of the oldest
        epoch waits (only possible after a restart), the first goes on anyway: progress
        before the bound."""
        for obj in [o for o in self.open if o.waiting]:
            if self._may_fetch(obj):
                self._fetch(obj)
        while True:  # each turn un-parks an object or removes it (drained, quarantined)
            epoch = min((o.epoch for o in self.open), default=None)
            oldest = [o for o in self.open if o.epoch == epoch]
            if not oldest or not all(o.waiting for o in oldest):
                return
            self._fetch(oldest[0])

    def _fetch(self, obj: OpenObject) -> None:
        obj.waiting = False
        self.picks = b""  # the set of objects to choose from changed
        if obj.started:
            self._next_batch(obj)
        else:
            self._start(obj)

    def _draw(self, mixable: list[OpenObject]) -> None:
        """Draw the next choices of object: no more than can be used before some object's
        batch runs out (then the set may change and the rest would be thrown away)."""
        left = sum(len(o.frames) - o.cursor for o in mixable)
        count = min(PICKS, left + 1)
        self.picks, self.mix_state = core.IMPL.picks(len(mixable), count, self.mix_state)
        self.pick_at = 0

    def _next_batch(self, obj: OpenObject) -> None:
        """Move ``obj`` to its next batch; drain or quarantine it at its end."""
        try:
            frames = next(obj.batches)
            while not len(frames):
                frames = next(obj.batches)
        except StopIteration:
            self._drained(obj)
            return
        except Exception as exc:  # any exception from parsing input quarantines that object
            self._quarantine(obj, exc)
            return
        obj.frames, obj.cursor = frames, 0

    def _trainers_starved(self) -> bool:
        """True when the current shard is ``starved_age`` old (any age while ``_starting``) and
        no shard is ready for trainers.

        Input that trickles in (slow store, small objects) would otherwise fill a shard of
        ``shard_size`` for a long time while trainers wait: the time to the first batch was
        ``shard_size`` / download rate. Checked at most every ``starved_age`` seconds, but on
        every step while ``_starting``.

        ``starved_age`` starts at STARVED_FLUSH and doubles with every early shard, up to
        STARVED_FLUSH_MAX, while trainers stay starved; the first check that finds a shard
        ready sets it back. A trainer that waits on the download gets its records at the
        download's pace whatever the shards' size, but pays for every shard it opens (~1-2 ms
        of claiming, opening and freeing): at 0.2 s a writer published 5 shards a second to
        a trainer that could not read faster anyway."""
        now, starting = time.monotonic(), self._starting()
        if not starting and now - self.shard_checked < self.starved_age:
            return False
        self.shard_checked = now
        if not self._ready_empty():
            self.starved_age = STARVED_FLUSH
            return False
        if not starting:
            self.starved_age = min(2 * self.starved_age, STARVED_FLUSH_MAX)
        return True

    def _starting(self) -> bool:
        """Whether this process has yet to publish its first ``FIRST_SHARDS`` shards.

        Until then a waiting trainer gets what is written at once: at start-up the trainers'
        first batch waits for the first shard of every writer (and ``prefetchd.tf.dataset``
        for four shards), and a shard that waits to fill or to mix delays it by that wait
        (0.25 s to fill plus 0.5 s to age cost 0.75 s of a 2-3 s first batch behind a paced
        network). Later shards mix and age as usual."""
        return self.published < FIRST_SHARDS

    def _ready_empty(self) -> bool:
        try:
            with os.scandir(self.layout.ram_ready) as entries:
                return next(entries, None) is None
        except FileNotFoundError:
            return False

    def _filling(self) -> bool:
        """Whether to wait for more objects before drawing: records mix only across the open
        objects, so while downloads trail the writers, drawing at once would mix few. A writer
        draws once ``output.mix`` objects are open, its epoch has nothing more to download,
        ``FILL_WAIT`` seconds passed without a new object (e.g. the window is full), or it has
        had fewer than ``mix`` objects for ``STARVED_FILL`` (no time at all while ``_starting``)
        while no shard is ready for the trainers: better mixing is worth nothing to a trainer
        with nothing to read (at start-up with two writers and ``mix`` 8 it would wait for the
        first 16 objects; objects that arrive later join the mix). The file-system
        checks run at most every ``FILL_CHECK`` seconds, not per record. Nor does it wait while
        an object holds a large batch: no other object is opened until that one is written."""
        if len(self.open) >= self.config.output.mix or self._over_share():
            self.fill_since = None
            return False
        now = time.monotonic()
        if self.fill_since is None:
            self.fill_since = now
        elif now - self.fill_checked < FILL_CHECK:
            return self.fill_wait
        self.fill_checked = now
        starved_for = 0.0 if self._starting() else STARVED_FILL
        self.fill_wait = not (
            now - self.last_input >= FILL_WAIT
            or (now - self.fill_since >= starved_for and self._ready_empty())
            or self.layout.downloaded_marker(self.open[0].epoch).exists()
        )
        return self.fill_wait

    def _refill(self) -> None:
        """Open objects up to ``output.mix``, but none while one holds a large batch."""
        while len(self.open) < self.config.output.mix and not self._over_share():
            name = self._claim_next()
            if name is None:
                return
            self._open(name, resume_at=0)
            self.last_input = time.monotonic()

    def _idle(self) -> None:
        """Nothing open: publish a partial shard if its epoch is over, input dried up, or the
        trainers wait for it (``_trainers_starved``)."""
        if self.shard is not None and self.shard.records:
            epoch_over = self._epoch_exhausted(self.shard_epoch)
            dried_up = time.monotonic() - self.last_input >= IDLE_FLUSH
            if epoch_over or dried_up or self._trainers_starved():
                self._publish()
        elif self.finished:
            self._publish()
        self.counters["activity"] = Activity.WAITING_FOR_DOWNLOADS
        self._report()
        self._wait_for_arrivals(0.1)

    def _epoch_exhausted(self, epoch: int | None) -> bool:
        if epoch is None or not self.layout.downloaded_marker(epoch).exists():
            return False
        self._list(force=True)
        return not any(n.startswith(epoch_prefix(epoch)) for n in self.listing)

    def _claim_next(self) -> str | None:
        """Rename the next object ``_pick`` chooses into our claimed set; None if there is
        none now."""
        self._list()
        while self.listing:
            now = time.monotonic()
            i = self._pick(now)
            if i is None:
                return None
            name = self.listing[i]
            parsed = parse_object_name(name)
            if parsed is None:
                self.listing.pop(i)
                continue
            epoch, seq, _ = parsed
            if not self._mine(seq) and now - self.listed_at >= STEAL_AFTER:
                self._list(force=True)  # the writer whose share it is may have taken it since
                continue
            current = self.open[0].epoch if self.open else self.shard_epoch
            if epoch != current:
                if self.open or self.finished or not self._may_switch(name, epoch):
                    return None  # finish this epoch's shard before starting another
                self._publish()
                self.shard_epoch = None
                if self.listing[i : i + 1] != [name]:  # _may_switch listed ready/ again
                    continue  # choose from the new listing
            self.listing.pop(i)
            self.first_seen.pop(name, None)
            try:
                os.rename(f"{self._ready_dir}/{name}", self._claimed(name))
            except FileNotFoundError:
                continue  # another writer was faster
            return name
        return None

    def _pick(self, now: float) -> int | None:
        """Which of the first ``peek`` names of ``listing`` to claim: the first of this
        writer's share (``_mine``), or the first another writer left waiting ``STEAL_AFTER``
        seconds (busy, or down: no object waits long for one writer). Each arrival wakes every
        writer; when all of them took the first name they saw, all but one renamed it in vain,
        once per object per extra writer."""
        for i, name in enumerate(self.listing[: self.peek]):
            parsed = parse_object_name(name)
            if parsed is None or self._mine(parsed[1]):
                return i
            if now - self.first_seen.get(name, now) >= STEAL_AFTER:
                return i
        return None

    def _mine(self, seq: int) -> bool:
        """Whether the object at ``seq`` of its epoch is in this writer's share."""
        return seq % self.writers == self.index

    def _may_switch(self, name: str, epoch: int) -> bool:
        """Whether this writer, with nothing open, may take ``name``, an object of ``epoch``:
        one of an earlier epoch than its shard's at once; one of a later epoch than the oldest
        incomplete only once every epoch before it is downloaded (``epochs/<k>.downloaded``),
        so that no object of those can still arrive.

        Trainers read epochs in order. A writer that took a later epoch's objects early filled
        the RAM budget with shards no trainer could read yet, then waited inside the budget
        holding them; an object of the earlier epoch that arrived after (fetched again after a
        fault or a restart) found no writer to take it, the epoch never ended and nothing ever
        freed the budget (the soak's stall). Once every earlier epoch is downloaded, its
        objects are all in ``ready/`` or claimed, and writers take them first (``ready/`` is
        listed in name order, epoch first), within the room ``_headroom`` keeps for them."""
        if self.shard_epoch is not None and epoch < self.shard_epoch:
            return True
        if epoch <= self.oldest_epoch:
            return True  # no earlier epoch can be incomplete: no need to look at the markers
        oldest = self._oldest_incomplete()
        if epoch <= oldest:
            return True
        downloaded = self.layout.downloaded_marker
        if not all(downloaded(k).exists() for k in range(oldest, epoch)):
            return False
        # The listing ``name`` came from may predate the last of those markers: list again,
        # so that an object of an earlier epoch that arrived just before it is taken first
        # (names sort by epoch).
        self._list(force=True)
        return bool(self.listing) and self.listing[0] >= epoch_prefix(epoch)

    def _wait_for_arrivals(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for an object to be renamed into ready/; the names
        that were are claimed next (these events are consumed here)."""
        assert self.arrivals is not None
        self._note_arrivals(self.arrivals.read(timeout=timeout))

    def _note_arrivals(self, events: list[Event]) -> bool:
        """Keep the names inotify reported for the next claim; after an overflow (events were
        lost) the next claim lists ready/ instead. Whether anything arrived."""
        for event in events:
            if event.overflow:
                self.listed_at = 0.0
            else:
                self.arrived.append(event.name)
        return bool(events)

    def _list(self, *, force: bool = False) -> None:
        """Refresh ``listing`` (ready/, sorted) when it is stale, or add the names inotify
        reported since. ready/ is listed only when forced, when the listing is
        ``LISTING_MAX_AGE`` old (an event missed), after an overflow, or without a watch: a
        writer that keeps up with the downloader found the listing empty on almost every loop,
        and listing ready/ again for each arrival (both writers, each arrival) was most of a
        writer's syscalls per small object."""
        now = time.monotonic()
        stale = now - self.listed_at > LISTING_MAX_AGE
        if force or stale or (self.arrivals is None and not self.listing):
            if self.arrivals is not None:
                # What arrived so far is in the listing: read again later, names this writer
                # took meanwhile would come back, each a rename in vain.
                self.arrivals.read_now()
            self.listing = sorted(os.listdir(self.layout.cache_ready))
            self.listed_at = now
            self.arrived.clear()
            seen = self.first_seen
            self.first_seen = {name: seen.get(name, now) for name in self.listing}
            return
        if self._pick(now) is None:
            self._arrived()
        if self.arrived:
            # Names another writer has claimed since stay in the list until it is listed again
            # (``_claim_next`` does so before it takes one of another writer's share).
            for name in self.arrived:
                self.first_seen.setdefault(name, now)
            self.listing = sorted({*self.listing, *self.arrived})
            self.arrived.clear()

    def _arrived(self) -> bool:
        """Whether anything was renamed into ready/ since the last look (always, unwatched)."""
        return self.arrivals is None or self._note_arrivals(self.arrivals.read_now())

    def _claimed(self, name: str) -> str:
        """Where ``name`` lies once this writer claimed it (joined as text: per object)."""
        return f"{self._claimed_prefix}{name}"

    def _open(self, name: str, *, resume_at: int) -> None:
        path = Path(self._claimed(name))
        meta_path = f"{self._meta_dir}/{name}.json"
        parsed = parse_object_name(name)
        assert parsed is not None
        try:
            meta = json.loads(read_small(meta_path))
            key = meta["key"]
        except (OSError, ValueError, KeyError, TypeError):
            meta, key = {}, f"<unknown key of {name}>"
        holding = Holding()
        if self.config.epochs.shuffle:
            batches = shuffled_object_frames(
                self.format,
                key,
                str(path),
                object_rng(self.config.epochs.seed, parsed[0], key).getrandbits(64),
                max_records=SHUFFLE_RECORDS,
                max_bytes=self.shuffle_bytes,
                holding=holding,
            )
        else:
            batches = object_frames(self.format, key, str(path))
        obj = OpenObject(name, key, parsed[0], path, batches, taken=resume_at, holding=holding)
        obj.meta = meta
        self.open.append(obj)
        self.picks = b""  # the set of objects to choose from changed
        if self._over_share():  # only in _recover: _refill opens nothing while this is so
            obj.waiting, obj.started = True, False
            return
        self._start(obj)

    def _start(self, obj: OpenObject) -> None:
        """Read ``obj`` through first if it needs it (``_validate``), then up to its first
        record not yet taken (``obj.taken``, from the journal); quarantine it if that fails."""
        resume_at, obj.taken, obj.started = obj.taken, 0, True
        try:
            if resume_at == 0 and not self._checked_whole(obj.meta, obj.key, obj.path):
                self._validate(obj)
            self._skip(obj, resume_at)  # which also reads the first batch
        except Exception as exc:  # any exception from parsing input quarantines that object
            self._quarantine(obj, exc)

    def _checked_whole(self, meta: dict[str, object], key: str, path: Path) -> bool:
        """Whether the object is known good before its first record is taken, so reading it
        through first (``_validate``) would only repeat work: the format checks all of it first,
        or the downloader found every TFRecord frame's CRCs right (``records_ok`` in its meta:
        uncompressed ``tfrecord`` input, whose bytes went from its check into the cache file and
        never left this host) and the object is too small to hold a record over
        ``output.max_record_size``."""
        if meta.get("records_ok") is True:
            with contextlib.suppress(OSError):
                if os.stat(path).st_size <= self.config.output.max_record_size:
                    return True
        return read_whole_first(self.format, key, str(path))

    def _validate(self, obj: OpenObject) -> None:
        """Parse the whole object once, keeping nothing, before any of its records is taken:
        a bad object is then quarantined with none of its records in a shard (see "Hostile
        input" in docs/reliability.md). Raises what the format raises; with a plugin, also
        ``ParseTimeout`` once ``MAX_ATTEMPTS`` reads of this object hung until the writer was
        killed (``attempts.py``)."""
        plugin = isinstance(self.format, PluginFormat)
        if plugin and self.attempts.begin(obj.name) >= MAX_ATTEMPTS:
            self.attempts.end(obj.name)
            spec, limit = self.config.source.format, self.config.source.parse_timeout
            raise ParseTimeout(obj.key, spec, limit, killed=MAX_ATTEMPTS)
        try:
            for _ in check_object(self.format, obj.key, str(obj.path)):
                self._report()  # a large object takes a while: stay visibly alive
        finally:
            if plugin:
                self.attempts.end(obj.name)

    @staticmethod
    def _skip(obj: OpenObject, count: int) -> None:
        """Pass over the first ``count`` records (those the journal says are in shards) and
        stop in the batch that holds the next one."""
        for frames in obj.batches:
            if count - obj.taken < len(frames):
                obj.frames, obj.cursor = frames, count - obj.taken
                obj.taken = count
                return
            obj.taken += len(frames)

    def _shard_for(self, epoch: int) -> ShardFile:
        if self.shard is not None and self.shard_epoch != epoch:
            self._publish()  # only after a restart can open objects span two epochs
        if self.shard is None:
            self.shard_epoch = epoch
            self.counters["epoch"] = epoch
            gzip = self.config.output.compression == "gzip"
            name = shard_name(epoch, self.index, self.commit.counter, gzip=gzip)
            self.shard = ShardFile(self.layout, name, self.budget, gzip=gzip)
            self.shard_checked = time.monotonic()
        return self.shard

    def _drained(self, obj: OpenObject) -> None:
        self.open.remove(obj)
        self.picks = b""  # the set of objects to choose from changed
        self.finished.append(obj)
        self.counters["objects_consumed"] += 1

    def _quarantine(self, obj: OpenObject, exc: Exception) -> None:
        """Set ``obj`` aside for good: deleted at once (so a restart cannot count it again),
        logged once with its key and the reason, counted under its ``Reason``."""
        reason, message = classify(exc)
        self.open.remove(obj)
        self.picks = b""  # the set of objects to choose from changed
        self._delete_raw(obj.name)
        log.error(
            "quarantined s3://%s/%s (%s): %s",
            self.config.source.bucket,
            escape_key(obj.key),
            reason.value,
            escape_key(message),
        )
        self.ctx.error(obj.key, message)
        self.counters["errors"] += 1
        self.counters["objects_consumed"] += 1
        self.counters["objects_quarantined"] += 1
        self.counters[_REASON_COUNTER[reason]] += 1

    # --- commit -------------------------------------------------------------------------------

    def _publish(self) -> None:
        """Commit the current shard (if any) and release the objects it finished."""
        shard = self.shard
        if shard is None and not self.finished:
            return
        entry = JournalEntry(
            shard=shard.name if shard else None,
            counter=self.commit.counter,
            positions={o.name: o.taken for o in self.open},
            finished=tuple(o.name for o in self.finished),
        )
        if shard is not None:
            shard.finish()
            record_published(self.layout, self.index, shard.name, shard.records)
        self.journal.append(entry)
        if shard is not None:
            shard.publish()
            self.counters["records_written"] += shard.records
            self.counters["bytes_written"] += shard.size
            self.counters["shards_written"] += 1
            self.commit.counter += 1
            self.published += 1
        for obj in self.finished:
            self._delete_raw(obj.name)
        self.finished.clear()
        self.shard = None

    def _delete_raw(self, name: str) -> None:
        for path in (f"{self._meta_dir}/{name}.json", self._claimed(name)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _headroom(self) -> int:
        """Room a shard of a later epoch must leave free for the oldest incomplete one.

        Trainers read epochs in order. If shards of epoch k+1 could fill the RAM budget while a
        writer still holds records of epoch k, epoch k could never finish and no trainer would
        ever free the budget. So a later epoch leaves half the budget (at least
        ``writers x chunk``) to the oldest incomplete one: its trainers may hold several of its
        shards at once — a resumable stream keeps those its last checkpoint covers until the
        next ``position()``, three when it checkpoints every two shards — and its writers need
        room besides for the shard they wait for. With only ``writers x chunk`` left to it, such
        a trainer waited for ever (tests/unit/write/test_ram_headroom.py).
        """
        if self.shard_epoch is None or self.shard_epoch <= self._oldest_incomplete():
            return 0
        return max(self.config.output.writers * self.budget.chunk, self.budget.budget // 2)

    def _oldest_incomplete(self) -> int:
        """The lowest epoch without its ``complete`` marker (markers only ever appear)."""
        while self.layout.complete_marker(self.oldest_epoch).exists():
            self.oldest_epoch += 1
        return self.oldest_epoch

    def _waiting_for_ram(self) -> bool:
        """Called while blocked on the RAM budget: stay visibly alive; say whether to stop."""
        self.counters["activity"] = Activity.WAITING_FOR_RAM
        self.counters["objects_open"] = len(self.open)
        self.counters["ram_wait_s"] = round(self.budget.waited, 3)
        self.ctx.report()
        return self.ctx.should_stop()

    def _report(self) -> None:
        self.counters["ram_wait_s"] = round(self.budget.waited, 3)
        self.counters["objects_open"] = len(self.open)
        if self.open:
            self.counters["activity"] = Activity.WRITING
        self.ctx.report()

    def _stop(self) -> None:
        """Drain: publish what is written so far so no record is stranded in a temp file."""
        if self.shard is not None and self.shard.records:
            with contextlib.suppress(Interrupted):
                self._publish()
        elif self.shard is not None:
            self.shard.discard()
            self.shard = None
        self.counters["activity"] = Activity.STOPPED
        self.ctx.report(force=True)
