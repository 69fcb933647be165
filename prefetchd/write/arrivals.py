"""Which raw objects a writer takes out of ``cache/ready/``, and how it learns they are there.

Writers take turns by seq: object ``seq`` of an epoch is writer ``seq % writers``'s turn. A
writer takes the objects of its turn first, and one of another writer's turn only once that
object has waited ``STEAL_AFTER`` in ready/ (that writer is busy, or down). It claims an object
by renaming ``cache/ready/<obj>`` to ``cache/claimed/w<i>-<obj>``; a rename that finds the
object gone lost the race to another writer.

ready/ is listed only now and then (``LISTING_MAX_AGE``, or when a decision needs a fresh
look): in between, the names inotify reports (``IN_MOVED_TO``) are merged into the last listing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from prefetchd.inotify import Event, Watch
from prefetchd.layout import Layout, epoch_prefix, parse_object_name, writer_claim_prefix

LISTING_MAX_AGE = 0.5
# A writer takes the objects of its turn first, and one of another writer's turn once it has
# waited this long in ready/ ...
STEAL_AFTER = 0.05
PEEK = 8  # ... among the first this many (or 2 per writer) names of ready/: a bounded look


class Arrivals:
    """Writer ``index``'s view of ``cache/ready/`` and its claims out of it.

    Owns the listing of ready/ (sorted: epoch first), when each name was first seen, the names
    inotify reported since the last listing, the watch itself (``watch``, set while the writer
    runs) and the rule of whose turn an object is. ``claim_next`` renames the next object this
    writer may take into its claimed set."""

    def __init__(self, layout: Layout, index: int, writers: int) -> None:
        self.layout = layout
        self.index = index
        self.writers = writers
        self.peek = max(PEEK, 2 * writers)
        self.prefix = writer_claim_prefix(index)
        # Joined per object as text: a pathlib join and its str() cost more than the syscall.
        self._ready_dir = str(layout.cache_ready)
        self._claimed_prefix = layout.writer_claims(index)
        self.listing: list[str] = []
        self.listed_at = 0.0
        self.first_seen: dict[str, float] = {}  # when each name of ``listing`` was first seen
        self.arrived: list[str] = []  # renamed into ready/ (inotify) since ``listing`` was made
        self.watch: Watch | None = None  # renames into ready/, while the writer runs
        # ``wait`` read the watch's queue to its end and no look has needed it since: the next
        # ``list`` that finds nothing to take need not read it again (see ``list``)
        self._waited = False

    def claimed(self, name: str) -> str:
        """Where ``name`` lies once this writer claimed it (joined as text: per object)."""
        return f"{self._claimed_prefix}{name}"

    def claimed_names(self) -> list[str]:
        """The objects this writer has claimed (after a restart: those it was writing), sorted."""
        return sorted(
            e.name[len(self.prefix) :]
            for e in os.scandir(self.layout.cache_claimed)
            if e.name.startswith(self.prefix)
        )

    def claim_next(self, current: int | None, switch: Callable[[int], bool]) -> str | None:
        """Rename the next object ``_pick`` chooses into this writer's claimed set; None if
        there is none now. One of another epoch than ``current`` (the epoch being written)
        only if ``switch(epoch)`` says the writer moves on to it now (it may list ready/
        again: the choice is then made anew)."""
        self.list()
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
            # ``my_turn(seq)``, inline: per object, as in ``_pick``
            if seq % self.writers != self.index and now - self.listed_at >= STEAL_AFTER:
                self.list(force=True)  # the writer whose turn it is may have taken it since
                continue
            if epoch != current:
                if not switch(epoch):
                    return None
                if self.listing[i : i + 1] != [name]:  # switch listed ready/ again
                    continue  # choose from the new listing
            self.listing.pop(i)
            self.first_seen.pop(name, None)
            try:
                os.rename(f"{self._ready_dir}/{name}", self.claimed(name))
            except FileNotFoundError:
                continue  # another writer was faster
            return name
        return None

    def _pick(self, now: float) -> int | None:
        """Which of the first ``peek`` names of ``listing`` to claim: the first of this
        writer's turn (``my_turn``), or the first another writer left waiting ``STEAL_AFTER``
        seconds (busy, or down: no object waits long for one writer). Each arrival wakes every
        writer; when all of them took the first name they saw, all but one renamed it in vain,
        once per object per extra writer."""
        writers, index = self.writers, self.index
        for i, name in enumerate(self.listing[: self.peek]):
            parsed = parse_object_name(name)
            if parsed is None or parsed[1] % writers == index:  # ``my_turn``, inline: per name
                return i
            if now - self.first_seen.get(name, now) >= STEAL_AFTER:
                return i
        return None

    def my_turn(self, seq: int) -> bool:
        """Whether the object at ``seq`` of its epoch is this writer's turn."""
        return seq % self.writers == self.index

    def first_is_of(self, epoch: int) -> bool:
        """Whether the first name of the listing is of ``epoch`` or later (so none of an
        earlier epoch waits in ready/; names sort by epoch)."""
        return bool(self.listing) and self.listing[0] >= epoch_prefix(epoch)

    def any_of(self, epoch: int) -> bool:
        """Whether ready/, listed afresh, holds an object of ``epoch``."""
        self.list(force=True)
        return any(n.startswith(epoch_prefix(epoch)) for n in self.listing)

    def wait(self, timeout: float, *, gather: float = 0.0, want: int = 1) -> None:
        """Wait up to ``timeout`` seconds for an object to be renamed into ready/; the names
        that were are claimed next (these events are consumed here). With ``gather``, once
        one arrived and fewer than ``want`` did, wait that much longer and take those that
        arrived meanwhile too: one wake for several objects (``FlushClock.gather``)."""
        assert self.watch is not None
        events = self.watch.read(timeout=timeout)
        if events and gather > 0 and len(events) < want:
            time.sleep(gather)
            events += self.watch.read_now()
        self._note(events)
        self._waited = True

    def _note(self, events: list[Event]) -> bool:
        """Keep the names inotify reported for the next claim; after an overflow (events were
        lost) the next claim lists ready/ instead. Whether anything arrived."""
        for event in events:
            if event.overflow:
                self.listed_at = 0.0
            else:
                self.arrived.append(event.name)
        return bool(events)

    def list(self, *, force: bool = False) -> None:
        """Refresh ``listing`` (ready/, sorted) when it is stale, or add the names inotify
        reported since. ready/ is listed only when forced, when the listing is
        ``LISTING_MAX_AGE`` old (an event missed), after an overflow, or without a watch: a
        writer that keeps up with the downloader found the listing empty on almost every loop,
        and listing ready/ again for each arrival (both writers, each arrival) was most of a
        writer's syscalls per small object.

        Nor is the watch read when ``wait`` just read it to its end (and the names it reported
        are what this look takes): the writer's loop waits, claims those, and its next look
        found nothing new on almost every pass — a ``read`` failing with EAGAIN, most of a
        writer's inotify reads per small object. Whatever arrived in between wakes the next
        ``wait`` at once."""
        now = time.monotonic()
        stale = now - self.listed_at > LISTING_MAX_AGE
        waited, self._waited = self._waited, False
        if force or stale or (self.watch is None and not self.listing):
            if self.watch is not None:
                # What arrived so far is in the listing: read again later, names this writer
                # took meanwhile would come back, each a rename in vain.
                self.watch.read_now()
            self.listing = sorted(os.listdir(self.layout.cache_ready))
            self.listed_at = now
            self.arrived.clear()
            seen = self.first_seen
            self.first_seen = {name: seen.get(name, now) for name in self.listing}
            return
        if self.arrived:
            self._merge_arrived(now)
            self._waited = waited  # the names wait() reported: the queue is as it left it
        elif self._pick(now) is None and not waited and self._arrived():
            self._merge_arrived(now)

    def _merge_arrived(self, now: float) -> None:
        """Add the names inotify reported to ``listing``. Names another writer has claimed
        since stay in it until ready/ is listed again (``claim_next`` does so before it takes
        one of another writer's turn)."""
        for name in self.arrived:
            self.first_seen.setdefault(name, now)
        self.listing = sorted({*self.listing, *self.arrived})
        self.arrived.clear()

    def _arrived(self) -> bool:
        """Whether anything was renamed into ready/ since the last look (always, unwatched)."""
        return self.watch is None or self._note(self.watch.read_now())
