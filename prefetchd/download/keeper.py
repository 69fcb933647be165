"""The downloader's side of ``download.keep``: which objects to keep, whether a kept copy may
stand in for a download, and the hit and miss figures.

At start-up ``plan`` chooses the kept subset of this host's share (``keep.choose_kept``) and
drops every entry of the store that is not in it (what another job, an overwritten object or a
smaller ``keep`` left). With several sources (``sources:``) the subset is chosen over every
source's share at once, by the same rank, so each source keeps about the same fraction of its
bytes; an entry is named by bucket, key, ETag and size, not by the local name (which hashes the
source and the period it is read in), so a kept object stands in for every read of it: in any
later epoch, and the second read in one epoch of an object ``on_exhausted: repeat`` reads twice.

Each later epoch ``refresh`` compares a new listing (of every source) with the one the run
started from: an object whose ETag or size changed, or that is gone, loses its kept copy and is
downloaded as listed now. A hit is served only for the object as listed now (``usable``).

Keeping stops for the rest of the run, counted and logged once, when the disk fills (ENOSPC) or
would leave less room than the download window still needs: training goes on, downloading what
was not kept.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path

from prefetchd.atomic import write_atomic
from prefetchd.download.keep import choose_kept, keep_rank
from prefetchd.download.kept import KeptStore, disk_full, free_bytes
from prefetchd.download.order import SourceObject
from prefetchd.download.share import ShareTable
from prefetchd.layout import Layout
from prefetchd.messages.counters import DownloaderCounters
from prefetchd.messages.epoch_keep import EpochKeep, read_epoch_keep
from prefetchd.sizes import format_size

log = logging.getLogger(__name__)


class Keeper:
    """Policy, freshness and figures over one ``KeptStore``."""

    def __init__(
        self,
        layout: Layout,
        bucket: str,
        capacity: int,
        part_size: int,
        counters: DownloaderCounters,
        free: Callable[[Path], int] = free_bytes,
    ) -> None:
        self.layout = layout
        self.store = KeptStore(layout.cache_keep, bucket, capacity)
        self.part_size = part_size
        self.counters = counters
        self.free = free
        self.buckets: tuple[str, ...] = (bucket,)  # each source's (``plan``)
        self.flags: list[bytearray] = []  # each source's: one byte per row of its share
        self.wanted: set[str] = set()
        # (source, row) -> the object as listed now, if it changed since the run started
        self.overrides: dict[tuple[int, int], SourceObject] = {}
        self.trusted = True  # False while the latest listing failed: no copy is confirmed
        self.stopped: str | None = None
        self.epochs: dict[int, EpochKeep] = {}
        self.dirty: set[int] = set()

    # --- start-up and listings ----------------------------------------------------------------

    def plan(self, *shares: ShareTable, buckets: Sequence[str] = ()) -> None:
        """Choose the kept subset of ``shares`` (one per source, ``buckets`` theirs; by default
        the store's) and drop every entry outside it. One choice over all sources (an object
        two sources list, the same bucket and key, is one entry; its size counts for each in
        the choice)."""
        self.buckets = tuple(buckets) or (self.store.bucket,) * len(shares)
        ranks, sizes = array("Q"), array("Q")
        for share in shares if self.store.capacity else ():
            for obj in share:
                ranks.append(keep_rank(obj.key))
                sizes.append(obj.size)
        flags = choose_kept(ranks, sizes, self.store.capacity)
        self.flags, start = [], 0
        for source, share in enumerate(shares):
            part = flags[start : start + len(share)]
            start += len(part)
            self.flags.append(part)
            for row, flag in enumerate(part):
                name = self.store.name_of(share[row], self.buckets[source]) if flag else None
                if name is not None:
                    self.wanted.add(name)
        self.store.load()
        dropped = self.store.retain(self.wanted)
        if not self.store.capacity:
            if dropped:
                log.info("download.keep is 0: dropped %d objects an earlier run kept", dropped)
            return
        log.info(
            "download.keep: %d objects (%s) chosen to keep, %d already kept (%s)%s",
            len(self.wanted),
            format_size(sum(s for s, f in zip(sizes, flags, strict=True) if f)),
            len(self.store.entries),
            format_size(self.store.used),
            f"; dropped {dropped} kept objects not chosen now" if dropped else "",
        )
        self._gauges()

    def refresh(self, share: ShareTable, listing: ShareTable, source: int = 0) -> None:
        """Compare a new ``listing`` of ``source`` with its ``share`` (both sorted by key): a
        kept object whose ETag or size changed, or that is gone, loses its kept copy; changed
        ones are fetched (and kept) as listed now."""
        self.overrides = {at: obj for at, obj in self.overrides.items() if at[0] != source}
        self.trusted = True
        j = 0
        for row in range(len(share)):
            obj = share[row]
            while j < len(listing) and listing[j].key < obj.key:
                j += 1
            now = listing[j] if j < len(listing) and listing[j].key == obj.key else None
            if now == obj:
                continue
            self._changed(source, row, obj, now)

    def _changed(self, source: int, row: int, was: SourceObject, now: SourceObject | None) -> None:
        bucket = self.buckets[source]
        old = self.store.name_of(was, bucket)
        if old is not None and self.store.has(old):
            log.info("s3://%s/%s changed at the source; its kept copy is dropped", bucket, was.key)
            self.store.drop(old)
        self.wanted.discard(old or "")
        if now is None:
            return  # gone: fetched as listed at start, the store's 404 skips it
        self.overrides[(source, row)] = now
        new = self.store.name_of(now, bucket)
        if self.flags[source][row] and new is not None:
            self.wanted.add(new)

    def current(self, row: int, obj: SourceObject, source: int = 0) -> SourceObject:
        """``obj`` (row ``row`` of ``source``'s share) as the latest listing gave it."""
        return self.overrides.get((source, row), obj)

    # --- hits ---------------------------------------------------------------------------------

    def usable(self, obj: SourceObject, source: int = 0) -> str | None:
        """The entry that may stand in for ``obj`` (of ``source``) as listed now, if one is
        kept."""
        name = self.store.name_of(obj, self.bucket(source))
        return name if self.trusted and name is not None and self.store.has(name) else None

    def wants(self, obj: SourceObject, source: int = 0) -> bool:
        """Whether ``obj`` (of ``source``) as listed now is chosen to be kept and keeping goes
        on."""
        return not self.stopped and self.store.name_of(obj, self.bucket(source)) in self.wanted

    def bucket(self, source: int) -> str:
        """``source``'s bucket (the store's before ``plan``)."""
        return self.buckets[source] if source < len(self.buckets) else self.store.bucket

    def hand_over(self, name: str, obj: SourceObject, dest: Path, source: int = 0) -> bool:
        """Link the kept copy at ``dest``; False (counted, logged) if it failed its check."""
        problem = self.store.hand_over(name, dest)
        if problem is None:
            return True
        self.counters["keep_refetched"] += 1
        log.warning("s3://%s/%s: %s; fetching it again", self.bucket(source), obj.key, problem)
        self._gauges()
        return False

    def hit(self, epoch: int, obj: SourceObject) -> None:
        self.epochs[epoch] = self._epoch(epoch).hit(obj.size)
        self.counters["keep_hits"] += 1
        self.counters["keep_hit_bytes"] += obj.size
        self.counters["keep_gets_saved"] += max(1, -(-obj.size // self.part_size))

    # --- misses -------------------------------------------------------------------------------

    def downloaded(
        self, epoch: int, obj: SourceObject, path: Path, reserve: int, source: int = 0
    ) -> None:
        """Count a miss; keep the verified download at ``path`` if it was chosen, unless the
        disk would keep less than ``reserve`` bytes free (what the window may still need)."""
        self.epochs[epoch] = self._epoch(epoch).miss(obj.size)
        self.counters["keep_misses"] += 1
        self.counters["keep_miss_bytes"] += obj.size
        name = self.store.name_of(obj, self.bucket(source))
        if self.stopped or name is None or name not in self.wanted or self.store.has(name):
            return
        try:
            if self.free(self.layout.cache_keep) - obj.size < reserve:
                self._stop(f"it would leave less than {format_size(reserve)} free for downloads")
                return
            self.store.add(name, obj, path)
        except OSError as exc:
            reason = "the disk is full" if disk_full(exc) else f"{exc.strerror}"
            self._stop(f"{reason} ({self.layout.cache_keep})")
        self._gauges()

    def _stop(self, reason: str) -> None:
        self.stopped = reason
        self.counters["keep_stopped"] += 1
        log.warning(
            "download.keep: no longer keeping objects in this run: %s; %s stay kept",
            reason,
            format_size(self.store.used),
        )

    # --- figures ------------------------------------------------------------------------------

    def _epoch(self, epoch: int) -> EpochKeep:
        figures = self.epochs.get(epoch)
        if figures is None:
            figures = read_epoch_keep(self.layout.keep_figures(epoch), epoch)
        self.dirty.add(epoch)
        return figures

    def save(self) -> None:
        """Write the figures of the epochs that changed since the last call (atomically)."""
        for epoch in sorted(self.dirty):
            write_atomic(self.layout.keep_figures(epoch), self.epochs[epoch].encode())
        self.dirty.clear()

    def _gauges(self) -> None:
        self.counters["keep_bytes"] = self.store.used
