"""``epochs.order: replayable``: the writer takes objects in a fixed order, whatever the timing.

With the same seed, data, config and hosts, the records of a host come out in the same order on
every run. The writer's draws depend on the set of open objects and the seeded choices
(``mixing.py``); timing enters only through which objects are open when, and when a shard is
cut. In this mode (one writer, ``config.py``):

- objects are claimed in ``(epoch, seq)`` order, each only once the one before it is claimed or
  can no longer come (``ReplayOrder.claim_next``): the epoch is downloaded and ready/ holds
  nothing before it. An object the downloader skipped is still published, as a tombstone (an
  empty file whose meta says ``"skipped": true``, ``download/publish.py``), so its turn passes
  without a wait; the writer drops it unread (``ObjectReader.tombstone``);
- the writer draws only with the mix full: ``output.mix`` objects open, or the open ones holding
  ``MIX_MEMORY``, or their files taking half of ``download.window`` (so the window always has
  room for the next object), or nothing more of the epoch to come (``Writer._filling``);
- a shard is cut at ``output.shard_size`` and at the end of the writer's epoch only (no flush
  clock), and trainers claim shards in name order, which with one writer is the order they
  were written.

Each journal line (``exactly_once/journal.py``) also records the order's state at the commit:
the next ``(epoch, seq)`` and the mixer's seeded state (``Choices.state``). A restarted
writer reopens the objects the commit had open, in the order they were opened, each at its
journalled position, puts the choices back, and keeps the objects it had claimed after the
commit for their turn (``pending``): so it goes on in the order an uninterrupted run gives, and
the records from the crash on come out the same. That needs a commit to be followed by the step a
restarted writer makes first, a fresh one with the new shard's room (``Writer._step``): which
objects are drained when, and so where the choices drawn ahead are thrown away, depends on how
the draws are cut. Without that state (a journal written by a
``fast`` run) it takes the first object in ready/: complete and exactly once, not replayed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from prefetchd.exactly_once.markers import first_epoch_without
from prefetchd.layout import Layout, parse_object_name
from prefetchd.write.arrivals import Arrivals


class ReplayOrder:
    """Which object the writer takes next in the replayable order. Owns ``expected``: the
    ``(epoch, seq)`` the next object must have (or come after, once that one cannot come);
    None after a restart, when the first object in ready/ is taken."""

    def __init__(self, layout: Layout, arrivals: Arrivals, *, fresh: bool) -> None:
        self.layout = layout
        self.arrivals = arrivals
        self.expected: tuple[int, int] | None = (0, 0) if fresh else None
        self.pending: list[str] = []  # claimed before a restart, after its commit: next, in order

    def state(self) -> dict[str, object]:
        """What a commit records of the order (with the mixer's: ``Choices.state``)."""
        return {"next": list(self.expected) if self.expected is not None else None}

    def resume(self, saved: dict[str, object], pending: list[str]) -> None:
        """Go on from a commit's ``state``; ``pending`` (claimed after it) are taken first."""
        after = saved.get("next")
        if isinstance(after, list) and len(after) == 2:
            self.expected = (int(after[0]), int(after[1]))
        self.pending = sorted(pending)

    def claim_next(self, current: int | None, switch: Callable[[int], bool]) -> str | None:
        """Rename the next object in ``(epoch, seq)`` order into the claimed set; None while
        it has not arrived (or the writer may not move on to its epoch yet: ``switch``)."""
        if self.pending:
            name = self.pending[0]
            parsed = parse_object_name(name)
            assert parsed is not None
            if parsed.epoch != current and not switch(parsed.epoch):
                return None
            self.pending.pop(0)
            self.expected = (parsed.epoch, parsed.seq + 1)
            return name  # already claimed
        arrivals = self.arrivals
        arrivals.list()
        fresh = False  # whether the listing was made just now
        while arrivals.listing:
            name = arrivals.listing[0]  # names sort by epoch, then seq
            parsed = parse_object_name(name)
            if parsed is None:
                arrivals.listing.pop(0)
                continue
            at = (parsed.epoch, parsed.seq)
            if self.expected is not None and at > self.expected:
                if not fresh:  # the expected object may have arrived since the listing
                    arrivals.list(force=True)
                    fresh = True
                    continue
                if not self._passed(at):
                    return None
                if parsed.epoch > self.expected[0]:  # that epoch is over: the next one's
                    self.expected = (parsed.epoch, 0)  # first object comes first
                    continue
            if parsed.epoch != current and not switch(parsed.epoch):
                return None
            if arrivals.listing[:1] != [name]:  # switch listed ready/ again
                continue
            arrivals.listing.pop(0)
            arrivals.first_seen.pop(name, None)
            try:
                os.rename(f"{self.layout.cache_ready}/{name}", arrivals.claimed(name))
            except FileNotFoundError:
                continue  # a name the listing kept after this writer took it (Arrivals.list)
            self.expected = (parsed.epoch, parsed.seq + 1)
            return name
        return None

    def _passed(self, at: tuple[int, int]) -> bool:
        """Whether the expected object can no longer come, so ``at`` (the first in ready/,
        after it) is next: the expected object's epoch is downloaded, so all of it that is
        left lies in ready/, and a fresh listing still starts after it."""
        assert self.expected is not None
        epoch = self.expected[0]
        if epoch < first_epoch_without(self.layout.complete_marker, 0):
            return True  # its epoch is complete (its markers may be cleaned up since)
        if not self.layout.downloaded_marker(epoch).exists():
            return False
        self.arrivals.list(force=True)
        first = self.arrivals.listing[0] if self.arrivals.listing else None
        parsed = parse_object_name(first) if first is not None else None
        return parsed is None or (parsed.epoch, parsed.seq) >= at

    def epoch_over(self, epoch: int) -> bool:
        """Whether nothing more of ``epoch`` can come: downloaded, none of it in ready/."""
        if not self.layout.downloaded_marker(epoch).exists():
            return False
        return not self.arrivals.any_of(epoch)
