"""Mixing: a writer's next records drawn at random across its open objects, in bounded memory.

The draw: with one source, each next record comes from an open object chosen uniformly
(``choice.KERNEL.picks``). With several sources (``sources:``) and objects of two or more of
them open, each next record's source is chosen first, by smooth weighted round robin at the
rate that source's records arrive (``source_rates.py``; ``choice.KERNEL.source_picks``), then
its object uniformly among that source's open objects. A uniform draw across objects gives a
source the share of the open objects it happens to hold, which drifts over an object's lifetime
(thousands of records): with one writer, windows of 1,000 records were 13.7 points off the
epoch's shares, 1.3-1.5 with the draw by source (tests/e2e/test_mixed_sources.py;
``bench.studies.mix_windows``, docs/sources.md). A source with no object open is left out of
the round (nothing is owed to it later: no burst when one opens); with one source open, the
draw is the uniform one.

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
from collections.abc import Sequence
from typing import NamedTuple

from prefetchd.kernel import choice, twin
from prefetchd.messages.counters import WriterCounters
from prefetchd.seeds import mixing_rng
from prefetchd.write.frames import BATCH_BYTES, EMPTY
from prefetchd.write.objects import ObjectReader, OpenObject
from prefetchd.write.source_rates import SourceRates

STEP_BYTES = 1024 * 1024  # frames copied per step: one write, one report and stop check
PICKS = 16384  # choices of object drawn at once
# Frames this large on average are written where they lie (one writev of views) instead of
# copied into one buffer first: a Python step per frame (~0.5 us) costs less than copying
# 16 KiB (bench.profile.writer medium, 16-128 KiB records: 5 % less writer CPU than at 64 KiB).
LARGE_FRAME = 16 * 1024


class SourceDraw(NamedTuple):
    """What, besides the generator's state and count, drew choices by source: each mixable
    object's source (``groups``, uint32), the sources' rates (uint64) and their credits before
    the first choice (``choice.KERNEL.source_picks``)."""

    groups: bytes
    rates: bytes
    credits: tuple[int, ...]

    def numbers(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """The same as integers (a shard's mix keeps them: ``messages/shard_mix.py``)."""
        return tuple(array("I", self.groups)), tuple(array("Q", self.rates)), self.credits


class Drawn(NamedTuple):
    """Frames drawn for the shard: ``parts`` back to back hold ``records`` frames, after which
    the choices stand at ``stop`` and each mixable object's cursor at ``cursors``."""

    parts: list[bytes] | list[memoryview]
    records: int
    stop: int
    cursors: array[int]


class Mixer:
    """A writer's open objects and the seeded choices among them.

    Owns the open objects, those drained since the last shard (``finished``: deleted once it
    is published), the choices of object drawn ahead (``picks`` from ``pick_at`` on, indices
    into ``mixable()``, thrown away whenever that set changes) and their SplitMix64 state,
    with several sources the sources' credits and rates (``rates``), and the memory bound:
    which object may read its next batch (``may_fetch``), which wait. ``by_source=False``
    draws uniformly across objects whatever their sources (``bench.studies.mix_windows``)."""

    def __init__(
        self,
        reader: ObjectReader,
        counters: WriterCounters,
        seed: int,
        index: int,
        *,
        by_source: bool = True,
    ) -> None:
        self.reader = reader
        self.by_source = by_source
        self.rates = SourceRates()
        self.credits = array("q")  # per source: its credit in the draw by source
        self.draw_from: SourceDraw | None = None  # with ``picks_from``, what drew ``picks``
        self.counters = counters
        self.seed = seed
        self.index = index
        # what an open object holds at most with records well under a batch: its block, the
        # batch it gave and its input batch (see may_fetch)
        self.normal_hold = 2 * reader.shuffle_bytes + 2 * BATCH_BYTES
        self.open: list[OpenObject] = []
        self.finished: list[OpenObject] = []  # drained, deleted once their shard is published
        self.mix_epoch: int | None = None  # the epoch mix_state was seeded for
        self.mix_state = 0  # SplitMix64 state of the choices of object
        self.picks = b""  # choices of object drawn ahead: uint32 indices into mixable()
        self.pick_at = 0
        self.held_total = 0  # sum of the open objects' ``measured``
        self.batch_frames = 0  # frames in the open objects' current batches ...
        self.batch_bytes = 0  # ... and their bytes (``large_frames``)
        self.large = 0  # open objects whose ``measured`` is over ``normal_hold``
        self.waiting = 0  # open objects waiting for a batch
        self._mixable: list[OpenObject] | None = None  # mixable(), until the set changes
        self.picks_from: tuple[int, int] | None = None  # (state, count) that drew ``picks``

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
        epoch = min(o.epoch for o in self.open)
        if epoch != self.mix_epoch:
            self.mix_epoch = epoch
            self.mix_state = mixing_rng(self.seed, epoch, self.index).getrandbits(64)
            self.picks, self.draw_from, self.credits = b"", None, array("q")
            self.rates.forget_before(epoch)
        self._mixable = [o for o in self.open if o.epoch == epoch and not o.waiting]
        return self._mixable

    def _changed(self) -> None:
        """The set of objects to choose from changed: the choices drawn ahead and the list
        of mixable objects are thrown away (the credits of a draw by source first brought to
        where the choices used leave them: ``_settle``)."""
        if self.draw_from is not None and self.picks_from is not None and self.picks:
            self._settle(self.draw_from, self.picks_from[0])
        self.picks = b""
        self.picks_from = None
        self.draw_from = None
        self._mixable = None

    def _settle(self, draw: SourceDraw, state: int) -> None:
        """The credits and the generator's state after the first ``pick_at`` choices of
        ``draw``: as if only those had been drawn, so the round robin goes on evenly across a
        change of the open objects (which throws the rest away)."""
        credits = array("q", draw.credits)
        _, self.mix_state = choice.KERNEL.source_picks(
            draw.groups, draw.rates, credits, self.pick_at, state
        )
        self.credits = credits

    def order_state(self) -> dict[str, object]:
        """The seeded state of the choices, at a commit: what ``restore_order`` needs to go
        on as if nothing happened (with the same objects open, each at its position)."""
        draw = self.draw_from.numbers() if self.picks and self.draw_from else None
        return {
            "epoch": self.mix_epoch,
            "state": self.mix_state,
            "picks": list(self.picks_from) if self.picks and self.picks_from else None,
            "at": self.pick_at,
            "credits": list(self.credits),
            "draw": [list(part) for part in draw] if draw else None,
            "rates": self.rates.state(self.open) if self.by_source else None,
        }

    def restore_order(self, saved: dict[str, object]) -> None:
        """Put back what ``order_state`` saved, once the same objects are open again."""
        epoch, state, picks, at = saved["epoch"], saved["state"], saved["picks"], saved["at"]
        self.mix_epoch = epoch if isinstance(epoch, int) else None
        self.mix_state = int(str(state))
        credits, draw = saved.get("credits"), saved.get("draw")
        self.credits = array("q", [int(c) for c in credits] if isinstance(credits, list) else [])
        self.rates.restore(saved.get("rates"), self.open)
        if self.open and isinstance(picks, list) and len(picks) == 2:
            mixable = self.mixable()
            start, count = int(picks[0]), int(picks[1])
            if isinstance(draw, list) and len(draw) == 3:
                groups, rates, before = (list(map(int, part)) for part in draw)
                self.draw_from = SourceDraw(
                    array("I", groups).tobytes(), array("Q", rates).tobytes(), tuple(before)
                )
                self.credits = array("q", before)
                self.picks, self.mix_state = choice.KERNEL.source_picks(
                    self.draw_from.groups, self.draw_from.rates, self.credits, count, start
                )
            else:
                self.picks, self.mix_state = choice.KERNEL.picks(len(mixable), count, start)
            self.picks_from = (start, count)
            self.pick_at = int(str(at))

    def draw(self, mixable: list[OpenObject], limit: int) -> Drawn:
        """The next frames in the drawn order, at most ``limit`` bytes, up to the first pick of
        an object whose batch ran out; the objects' cursors are not moved yet (``advance``)."""
        if self.pick_at * 4 >= len(self.picks):
            self._draw_picks(mixable)
        cursors = array("Q", [o.cursor for o in mixable])
        sources = [(o.frames.data, o.frames.ends) for o in mixable]
        parts: list[bytes] | list[memoryview]
        if self.large_frames():  # write them where they lie: one copy less per byte
            parts, stop = twin.interleave_views(sources, cursors, self.picks, self.pick_at, limit)
        else:
            data, stop = choice.KERNEL.interleave(sources, cursors, self.picks, self.pick_at, limit)
            parts = [data]
        return Drawn(parts, stop - self.pick_at, stop, cursors)

    def advance(self, mixable: list[OpenObject], drawn: Drawn) -> None:
        """Count ``drawn``'s frames as taken (they are written), then refill the objects whose
        batch ran out: at once, so an object is drained as soon as its last record is in."""
        used_up = []
        for obj, cursor in zip(mixable, drawn.cursors, strict=True):
            if cursor != obj.cursor:
                obj.taken += cursor - obj.cursor
                obj.cursor = cursor
            if cursor >= len(obj.frames):
                used_up.append(obj)
        self.pick_at = drawn.stop
        for obj in used_up:
            if self.may_fetch(obj):
                self._next_batch(obj)
            else:
                self._park(obj)

    # --- a large record in a shard of its own ------------------------------------------------

    def large_ahead(self, mixable: list[OpenObject], room: int) -> bool:
        """Whether some current batch may hold a frame larger than ``room`` (the rest of the
        shard): then records are drawn one at a time, so each one is placed where it fits."""
        for o in mixable:
            frames = o.frames
            rest = len(frames.data) - frames.start(o.cursor) if o.cursor < len(frames) else 0
            if rest > room and frames.largest_frame > room:
                return True
        return False

    def next_frame(self, mixable: list[OpenObject]) -> int:
        """The size of the frame the next pick takes (0: its object's batch ran out)."""
        if self.pick_at * 4 >= len(self.picks):
            self._draw_picks(mixable)
        obj = mixable[memoryview(self.picks).cast("I")[self.pick_at]]  # native uint32
        return obj.frames.frame_size(obj.cursor) if obj.cursor < len(obj.frames) else 0

    def _draw_picks(self, mixable: list[OpenObject]) -> None:
        """Draw the next choices of object: no more than can be used before some object's
        batch runs out (then the set may change and the rest would be thrown away)."""
        left = sum(len(o.frames) - o.cursor for o in mixable)
        count = min(PICKS, left + 1)
        self.picks_from = (self.mix_state, count)
        draw = self._source_draw(mixable)
        if draw is None:
            self.picks, self.mix_state = choice.KERNEL.picks(len(mixable), count, self.mix_state)
        else:
            self.picks, self.mix_state = choice.KERNEL.source_picks(
                draw.groups, draw.rates, self.credits, count, self.mix_state
            )
        self.draw_from = draw
        self.pick_at = 0

    def _source_draw(self, mixable: Sequence[OpenObject]) -> SourceDraw | None:
        """How to draw by source from ``mixable``: None (uniformly across objects) with one
        source open, ``by_source`` off, or a source without an estimate yet."""
        if not self.by_source or len(self.rates.seen_records) < 2:
            return None  # one source so far: not a step more than before sources existed
        groups = array("I", [o.source for o in mixable])
        first = groups[0]
        if all(g == first for g in groups):
            return None
        rates = self.rates.rates(mixable[0].epoch, groups)
        if rates is None:
            return None
        sources = len(rates) // 8
        if len(self.credits) < sources:
            self.credits.extend([0] * (sources - len(self.credits)))
        # one rate per credit (the kernel's contract); a source not open keeps its credit
        rates += bytes(8 * (len(self.credits) - sources))
        return SourceDraw(groups.tobytes(), rates, tuple(self.credits))

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
        old, new = obj.measured, 0 if gone else obj.held()
        obj.measured = new
        limit = self.normal_hold
        self.held_total += new - old
        self.large += (new > limit) - (old > limit)
        frames, data = (0, 0) if gone else (len(obj.frames), len(obj.frames.data))
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
