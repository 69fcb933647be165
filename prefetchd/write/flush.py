"""The flush clock: when a writer cuts a shard short of ``output.shard_size``, and when it
draws records before ``output.mix`` objects are open.

A shard is published when it reaches ``output.shard_size`` (the writer's loop), when its epoch
has nothing left to give, when no input has arrived for ``IDLE_FLUSH`` seconds, or when it is
``STARVED_FLUSH`` seconds old while no shard is ready for the trainers (an age that doubles,
up to ``STARVED_FLUSH_MAX``, while they stay starved). A writer's first ``FIRST_SHARDS`` shards
of a run go out at once while no shard is ready, after the step that wrote them, and it draws
them from the objects it has: the trainers' first batch waits on them (``prefetchd.tf.dataset``
opens four shards before it gives a record).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from prefetchd.layout import Layout

IDLE_FLUSH = 0.5  # seconds without input before a partial shard is published
STARVED_FLUSH = 0.2  # age of a partial shard published early while ready/ is empty ...
STARVED_FLUSH_MAX = 1.0  # ... doubling per early shard while they stay empty, up to this
FIRST_SHARDS = 2  # shards a writer publishes at once while ready/ is empty, once per start
FILL_WAIT = 0.5  # seconds a writer waits for output.mix open objects before drawing anyway
STARVED_FILL = 0.25  # ... or this long while no shard is ready for the trainers
FILL_CHECK = 0.05  # how often a writer with fewer than output.mix objects re-checks the above
# While it waits to fill its mix, a writer woken by one arrival lets this long pass before it
# claims, so one wake takes the objects that arrive meanwhile (``gather``).
GATHER = 0.01


class FlushClock:
    """One writer's clocks for cutting shards early and for drawing before the mix is full.

    Owns when input last arrived, since when fewer than ``output.mix`` objects are open, the
    age at which a starved trainer's shard goes out (``starved_age``) and when that was last
    checked, and how many shards this process has published (the first ``FIRST_SHARDS`` go
    early). The writer tells it when input arrives (``input_arrived``) and a shard opens or is
    published (``shard_opened``, ``shard_published``)."""

    def __init__(self, layout: Layout, mix: int) -> None:
        self.layout = layout
        self.mix = mix
        self.last_input = time.monotonic()
        self.fill_since: float | None = None  # since when fewer than output.mix are open
        self.fill_checked = 0.0
        self.fill_wait = True
        self.shard_checked = 0.0  # when trainers_starved last looked (or the shard opened)
        self.starved_age = STARVED_FLUSH  # the age at which trainers_starved looks next
        self.published = 0  # shards this process published (the first FIRST_SHARDS go early)

    def input_arrived(self) -> None:
        self.last_input = time.monotonic()

    def shard_opened(self) -> None:
        self.shard_checked = time.monotonic()

    def shard_published(self) -> None:
        self.published += 1

    def dried_up(self) -> bool:
        """Whether no input has arrived for ``IDLE_FLUSH`` seconds."""
        return time.monotonic() - self.last_input >= IDLE_FLUSH

    def trainers_starved(self) -> bool:
        """True when the current shard is ``starved_age`` old (any age while ``starting``) and
        no shard is ready for trainers.

        Input that trickles in (slow store, small objects) would otherwise fill a shard of
        ``shard_size`` for a long time while trainers wait: the time to the first batch was
        ``shard_size`` / download rate. Checked at most every ``starved_age`` seconds, but on
        every step while ``starting``.

        ``starved_age`` starts at STARVED_FLUSH and doubles with every early shard, up to
        STARVED_FLUSH_MAX, while trainers stay starved; the first check that finds a shard
        ready sets it back. A trainer that waits on the download gets its records at the
        download's pace whatever the shards' size, but pays for every shard it opens (~1-2 ms
        of claiming, opening and freeing): at 0.2 s a writer published 5 shards a second to
        a trainer that could not read faster anyway."""
        now, starting = time.monotonic(), self.starting()
        if not starting and now - self.shard_checked < self.starved_age:
            return False
        self.shard_checked = now
        if not self.ready_empty():
            self.starved_age = STARVED_FLUSH
            return False
        if not starting:
            self.starved_age = min(2 * self.starved_age, STARVED_FLUSH_MAX)
        return True

    def starting(self) -> bool:
        """Whether this process has yet to publish its first ``FIRST_SHARDS`` shards.

        Until then a waiting trainer gets what is written at once: at start-up the trainers'
        first batch waits for the first shard of every writer (and ``prefetchd.tf.dataset``
        for four shards), and a shard that waits to fill or to mix delays it by that wait
        (0.25 s to fill plus 0.5 s to age cost 0.75 s of a 2-3 s first batch behind a paced
        network). Later shards mix and age as usual."""
        return self.published < FIRST_SHARDS

    def ready_empty(self) -> bool:
        """Whether no shard is ready for the trainers (ram_dir/ready/ is empty)."""
        try:
            with os.scandir(self.layout.ram_ready) as entries:
                return next(entries, None) is None
        except FileNotFoundError:
            return False

    def gather(self) -> float:
        """How long a writer waiting to fill its mix, just woken by an arrival, waits for more
        before it claims: ``GATHER``, or 0 while ``starting`` or when a decision of this clock
        falls due within it (the shard's next starved check, the end of ``STARVED_FILL``).

        Behind a paced network objects arrive spread out (one every ~0.8 ms from 32
        connections), and a writer that keeps up woke for nearly each one: a poll, an inotify
        read and a turn of its loop per object, ~0.4 wakes per small object against ~0.2 on
        loopback. Gathering costs no throughput (what arrives meanwhile waits in ready/ and
        is claimed at the next turn) and no trainer waits on it: a shard due to a starved
        trainer, or a draw due for one, is never put off past its time."""
        if self.starting():
            return 0.0
        now = time.monotonic()
        due = self.shard_checked + self.starved_age
        if self.fill_since is not None:
            due = min(due, self.fill_since + STARVED_FILL)
        return GATHER if now + GATHER < due else 0.0

    def filling(self, opened: int, epoch: int, holding_large: Callable[[], bool]) -> bool:
        """Whether to wait for more objects before drawing (``opened`` are open, the first of
        ``epoch``): records mix only across the open objects, so while downloads trail the
        writers, drawing at once would mix few. A writer draws once ``output.mix`` objects are
        open, its epoch has nothing more to download, ``FILL_WAIT`` seconds passed without a
        new object (e.g. the window is full), or it has had fewer than ``mix`` objects for
        ``STARVED_FILL`` (no time at all while ``starting``) while no shard is ready for the
        trainers: better mixing is worth nothing to a trainer with nothing to read (at
        start-up with two writers and ``mix`` 8 it would wait for the first 16 objects;
        objects that arrive later join the mix). The file-system checks run at most every
        ``FILL_CHECK`` seconds, not per record. Nor does it wait while an object is holding a
        large batch (``holding_large()``): no other object is opened until that one is
        written."""
        if opened >= self.mix or holding_large():
            self.fill_since = None
            return False
        now = time.monotonic()
        if self.fill_since is None:
            self.fill_since = now
        elif now - self.fill_checked < FILL_CHECK:
            return self.fill_wait
        self.fill_checked = now
        starved_for = 0.0 if self.starting() else STARVED_FILL
        self.fill_wait = not (
            now - self.last_input >= FILL_WAIT
            or (now - self.fill_since >= starved_for and self.ready_empty())
            or self.layout.downloaded_marker(epoch).exists()
        )
        return self.fill_wait
