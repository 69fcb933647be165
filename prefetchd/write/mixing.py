"""Mixing: a writer's next records drawn at random across its open objects, in bounded memory.

The draw: which open object each next record comes from is a seeded choice
(``choices.py``: uniform across objects with one source, by source first with several).

The work is done a batch at a time: each open object gives batches of ready frames
(``frames.Frames``), the choices of object are drawn ``PICKS`` at a time (seeded per epoch and
writer), and one call (``choice.KERNEL.interleave``) copies up to ``STEP_BYTES`` of frames in the
drawn order into one buffer that the shard takes in one write. Per record, no Python code runs
on this path.

Per step the bookkeeping is kept incremental, not a pass over every open object: what the
objects hold (in total, and how many hold a large batch) is updated when an object's batch
changes (``_measure``), and the objects to draw from (``mixable()``) are kept until that set
changes. So a large ``output.mix`` costs no Python work per record.

Memory: each open object holds its current batch (and, in the block shuffle, what it keeps
between batches); normally at most ``normal_hold`` bytes (twice its shuffle block plus two
input batches). While one object is holding more (a record near ``output.max_record_size``),
the writer takes records only from the objects whose batch is not used up and gives no other
object a new batch nor opens one until it is back under (``may_fetch``): so one writer holds at
most one large record's batch at a time, whatever ``output.mix`` is.

Shards: a record whose frame does not fit in the rest of the shard (``large_ahead``,
``next_frame``) goes into a shard of its own, so a writer's shard in progress is at most
``max(shard_size, one frame)``: what ``config.record_size_limit`` counts on.
"""

from __future__ import annotations

from array import array
from itertools import compress
from operator import le
from typing import NamedTuple

from prefetchd.kernel import choice, twin
from prefetchd.messages.counters import WriterCounters
from prefetchd.write.choices import Choices
from prefetchd.write.frames import BATCH_BYTES, EMPTY
from prefetchd.write.objects import ObjectReader, OpenObject

STEP_BYTES = 1024 * 1024  # frames copied per step: one write, one report and stop check
# Frames this large on average are written where they lie (one writev of views) instead of
# copied into one buffer first: a Python step per frame (~0.5 us) costs less than copying
# 16 KiB (bench.profile.writer medium, 16-128 KiB records: 5 % less writer CPU than at 64 KiB).
LARGE_FRAME = 16 * 1024


class Drawn(NamedTuple):
    """Frames drawn for the shard: ``parts`` back to back hold ``records`` frames, after which
    the choices stand at ``stop`` and each mixable object's cursor at ``cursors``."""

    parts: list[bytes] | list[memoryview]
    records: int
    stop: int
    cursors: array[int]


class Mixer:
    """A writer's open objects, drawn from by its seeded ``choices``, in bounded memory.

    Owns the open objects, those drained since the last shard (``finished``: deleted once it
    is published), the mixable ones (``mixable()``: kept until that set changes, which
    discards the choices drawn ahead), the frames drawn and taken (``draw``, ``advance``), and
    the memory bound: which object may read its next batch (``may_fetch``), which wait."""

    def __init__(self, reader: ObjectReader, counters: WriterCounters, choices: Choices) -> None:
        self.reader = reader
        self.choices = choices
        self.rates = choices.rates  # fed here as objects open, give batches and drain
        self.counters = counters
        # what an open object holds at most with records well under a batch: its block, the
        # batch it gave and its input batch (see may_fetch)
        self.normal_hold = 2 * reader.shuffle_bytes + 2 * BATCH_BYTES
        self.open: list[OpenObject] = []
        self.finished: list[OpenObject] = []  # drained, deleted once their shard is published
        self.held_total = 0  # sum of the open objects' ``measured``
        self.batch_frames = 0  # frames in the open objects' current batches ...
        self.batch_bytes = 0  # ... and their bytes (``large_frames``)
        self.large = 0  # open objects whose ``measured`` is over ``normal_hold``
        # No open object's current batch holds more bytes than this (``large_ahead``): raised
        # as batches come, lowered only when ``large_ahead`` looks at every object anyway.
        self.batch_bound = 0
        self.waiting = 0  # open objects waiting for a batch
        self._mixable: list[OpenObject] | None = None  # mixable(), until the set changes

    def add(self, obj: OpenObject) -> None:
        """Open ``obj`` for mixing: read up to its first record not yet taken, unless an object
        is holding a large batch (only after a restart: the writer opens nothing else while
        one is); then it waits for its turn to read (``resume_waiting``)."""
        self.open.append(obj)
        self.rates.opened_object(obj)
        self._changed()
        if self.holding_large():
            obj.waiting, obj.started = True, False
            self.waiting += 1
            return
        self._start(obj)

    def take_over(self, objects: list[OpenObject]) -> None:
        """Make ``objects``, with their batches as they are, the open objects (in place of
        any): what they hold and which wait is counted afresh."""
        self.open, self.held_total, self.large, self.waiting = [], 0, 0, 0
        self.batch_frames = self.batch_bytes = 0
        for obj in objects:
            obj.measured = obj.measured_frames = obj.measured_bytes = 0
            self.open.append(obj)
            self.rates.opened_object(obj)
            self._measure(obj)
            self.waiting += obj.waiting
        self._changed()

    def mixable(self) -> list[OpenObject]:
        """The open objects of the oldest open epoch (only after a restart can open objects
        span two epochs; a shard holds one), but those waiting for a batch (``_park``)."""
        if self._mixable is not None:
            return self._mixable
        epoch = min([o.epoch for o in self.open])  # a list: no generator resumed per object
        self.choices.seed_epoch(epoch)
        self._mixable = [o for o in self.open if o.epoch == epoch and not o.waiting]
        return self._mixable

    def _changed(self) -> None:
        """The set of objects to choose from changed: the choices drawn ahead and the list
        of mixable objects are thrown away."""
        choices = self.choices
        if choices.picks or choices.picks_from or choices.draw_from:  # else a no-op: no call
            choices.discard()
        self._mixable = None

    def order_state(self) -> dict[str, object]:
        """The seeded state of the choices at a commit (``Choices.state``)."""
        return self.choices.state(self.open)

    def restore_order(self, saved: dict[str, object]) -> None:
        """Put back what ``order_state`` saved, once the same objects are open again."""
        self.choices.restore(saved, self.open, self.mixable)

    def draw(self, mixable: list[OpenObject], limit: int) -> Drawn:
        """The next frames in the drawn order, at most ``limit`` bytes, up to the first pick of
        an object whose batch ran out; the objects' cursors are not moved yet (``advance``)."""
        choices = self.choices
        picks = choices.ready(mixable)
        cursors = array("Q", [o.cursor for o in mixable])
        sources = [(o.frames.data, o.frames.ends) for o in mixable]
        parts: list[bytes] | list[memoryview]
        if self.large_frames():  # write them where they lie: one copy less per byte
            parts, stop = twin.interleave_views(sources, cursors, picks, choices.pick_at, limit)
        else:
            data, stop = choice.KERNEL.interleave(sources, cursors, picks, choices.pick_at, limit)
            parts = [data]
        return Drawn(parts, stop - choices.pick_at, stop, cursors)

    def advance(self, mixable: list[OpenObject], drawn: Drawn) -> None:
        """Count ``drawn``'s frames as taken (they are written), then refill the objects whose
        batch ran out: at once, so an object is drained as soon as its last record is in."""
        # Passes over every open object in a constant number of calls (comprehensions, ``map``,
        # ``compress``): with 64 small objects open a step takes ~7 records, and a Python call
        # per open object here cost each of them ~9 (``test_writer_batches``)
        cursors = drawn.cursors
        moved = [(o, c) for o, c in zip(mixable, cursors, strict=True) if c != o.cursor]
        for obj, cursor in moved:
            obj.taken += cursor - obj.cursor
            obj.cursor = cursor
        sizes = map(len, [o.frames.ends for o in mixable])  # ``len(o.frames)``, no __len__
        used_up = list(compress(mixable, map(le, sizes, cursors)))
        self.choices.pick_at = drawn.stop
        for obj in used_up:
            if self.may_fetch(obj):
                self._next_batch(obj)
            else:
                self._park(obj)

    # --- a large record in a shard of its own ------------------------------------------------

    def large_ahead(self, mixable: list[OpenObject], room: int) -> bool:
        """Whether some current batch may hold a frame larger than ``room`` (the rest of the
        shard): then records are drawn one at a time, so each one is placed where it fits.
        While no batch holds more than ``room`` bytes (``batch_bound``) none can: no pass over
        the open objects, which cost a step as much as its write with 64 small raw objects
        open (one record each, ~7 records a step)."""
        if self.batch_bound <= room:
            return False
        self.batch_bound = max((len(o.frames.data) for o in self.open), default=0)
        if self.batch_bound <= room:
            return False
        for o in mixable:
            frames = o.frames
            rest = len(frames.data) - frames.start(o.cursor) if o.cursor < len(frames) else 0
            if rest > room and frames.largest_frame > room:
                return True
        return False

    def next_frame(self, mixable: list[OpenObject]) -> int:
        """The size of the frame the next pick takes (0: its object's batch ran out)."""
        picks = self.choices.ready(mixable)
        obj = mixable[memoryview(picks).cast("I")[self.choices.pick_at]]  # native uint32
        return obj.frames.frame_size(obj.cursor) if obj.cursor < len(obj.frames) else 0

    # --- the memory bound: one large batch per writer -----------------------------------------

    def held_bytes(self) -> int:
        """The bytes the open objects hold: their batches and what their iterators keep (as
        measured after each change of batch)."""
        return self.held_total

    def holding_large(self) -> bool:
        """Whether an open object holds more than ``normal_hold`` (a large record's batch)."""
        return self.large > 0

    def may_fetch(self, obj: OpenObject) -> bool:
        """Whether ``obj`` may read its next batch: only while no other open object holds more
        than ``normal_hold``. So at most one object holds a large batch at a time; with
        records well under a batch this is always true, and the mixing is as without it."""
        return self.large - (obj.measured > self.normal_hold) == 0

    def large_frames(self) -> bool:
        """Whether the open objects' current batches' frames average ``LARGE_FRAME`` bytes or
        more."""
        return self.batch_bytes >= LARGE_FRAME * max(1, self.batch_frames)

    def _measure(self, obj: OpenObject, *, gone: bool = False) -> None:
        """Note what ``obj`` holds now (nothing, once ``gone``): called whenever its batch
        changes, so ``held_bytes``, ``holding_large``, ``may_fetch`` and ``large_frames``
        need no pass over the open objects."""
        # ``obj.held()``, inline: twice per small object
        old, new = obj.measured, 0 if gone else len(obj.frames.data) + obj.holding.bytes
        obj.measured = new
        limit = self.normal_hold
        self.held_total += new - old
        self.large += (new > limit) - (old > limit)
        frames, data = (0, 0) if gone else (len(obj.frames.ends), len(obj.frames.data))
        if data > self.batch_bound:
            self.batch_bound = data
        self.batch_frames += frames - obj.measured_frames
        self.batch_bytes += data - obj.measured_bytes
        obj.measured_frames, obj.measured_bytes = frames, data

    def _park(self, obj: OpenObject) -> None:
        """Park ``obj``, whose batch is used up, until ``may_fetch``: out of the mixing, its
        used-up batch freed."""
        obj.frames, obj.cursor, obj.waiting = EMPTY, 0, True
        self.waiting += 1
        self._measure(obj)
        self._changed()

    def resume_waiting(self) -> None:
        """Give the parked objects their next batch once they may (an object reopened after a
        restart while another was holding a large batch: its first). If every object of the
        oldest epoch waits (only possible after a restart), the first goes on anyway: progress
        before the bound."""
        if not self.waiting:
            return
        for obj in [o for o in self.open if o.waiting]:
            if self.may_fetch(obj):
                self._fetch(obj)
        while True:  # each turn un-parks an object or removes it (drained, quarantined)
            epoch = min((o.epoch for o in self.open), default=None)
            oldest = [o for o in self.open if o.epoch == epoch]
            if not oldest or not all(o.waiting for o in oldest):
                return
            self._fetch(oldest[0])

    def _fetch(self, obj: OpenObject) -> None:
        obj.waiting = False
        self.waiting -= 1
        self._changed()
        if obj.started:
            self._next_batch(obj)
        else:
            self._start(obj)

    # --- reading, draining, setting aside -----------------------------------------------------

    def _start(self, obj: OpenObject) -> None:
        """Read ``obj`` up to its first record not yet taken; quarantine it if that fails."""
        try:
            self.reader.start(obj)
        except Exception as exc:  # any exception from parsing input quarantines that object
            self._quarantine(obj, exc)
            return
        self.rates.batch(obj, obj.frames)
        self._measure(obj)

    def _next_batch(self, obj: OpenObject) -> None:
        """Move ``obj`` to its next batch; drain or quarantine it at its end."""
        if obj.one_frame is not None:  # a one-record object's lane: its one batch was its end
            self._drained(obj)  # (not a StopIteration raised and caught per small object)
            return
        try:
            frames = next(obj.batches)
            while not len(frames.ends):  # ``len(frames)`` without a call of ``__len__``
                frames = next(obj.batches)
        except StopIteration:
            self._drained(obj)
            return
        except Exception as exc:  # any exception from parsing input quarantines that object
            self._quarantine(obj, exc)
            return
        obj.frames, obj.cursor = frames, 0
        self.rates.batch(obj, frames)
        self._measure(obj)

    def _remove(self, obj: OpenObject) -> None:
        self.open.remove(obj)  # by identity (OpenObject has no field-wise __eq__)
        self._measure(obj, gone=True)
        if obj.waiting:
            obj.waiting = False
            self.waiting -= 1
        self._changed()

    def _drained(self, obj: OpenObject) -> None:
        self.rates.drained(obj)
        self._remove(obj)
        self.finished.append(obj)
        self.counters["objects_consumed"] += 1

    def _quarantine(self, obj: OpenObject, exc: Exception) -> None:
        self._remove(obj)
        self.reader.quarantine(obj, exc)
