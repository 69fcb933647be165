"""The epochs' plan: which objects each epoch fetches, in which order, and which are done.

Each epoch goes over the host's share in its seeded order (``order.epoch_permutation``), one
``Job`` per object not yet finished; an object a previous run logged as published or skipped
(the download log) is not fetched again, except one whose file vanished after it was published.
When every object of epoch k is published or skipped, ``epochs/<k>.downloaded`` is written.
Before its first job, ``epochs/<k>.listing`` names the share the order is over
(``progress.ListingId``), for the positions trainers save (a resume on another number of hosts
checks it).
"""

from __future__ import annotations

import json
import logging
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.download.jobs import Job
from prefetchd.download.keeper import Keeper
from prefetchd.download.order import epoch_permutation
from prefetchd.download.rehost import Remainder
from prefetchd.download.share import ShareTable
from prefetchd.exactly_once.download_log import DownloadLog
from prefetchd.exactly_once.markers import first_epoch_without, mark_downloaded
from prefetchd.layout import (
    Layout,
    key_hash,
    object_name,
    parse_object_name,
)
from prefetchd.messages.counters import DownloaderCounters

log = logging.getLogger(__name__)

FIRST_PART_MIN = 1024 * 1024  # the smallest part of the first object (see _first_part_size)


@dataclass
class EpochProgress:
    """How far one epoch is: which positions of its order are published or skipped."""

    total: int
    finished: bytearray  # one byte per position in the epoch's order: published or skipped
    done: int = 0  # how many of ``finished`` are set
    scheduled: bool = False

    def mark(self, seq: int) -> None:
        if not self.finished[seq]:
            self.finished[seq] = 1
            self.done += 1


class EpochPlan:
    """Owns the epochs this run downloads: the host's share (``share``, set once listed), each
    epoch's order over it, which of its objects are done (``epochs``: an ``EpochProgress`` per
    epoch scheduled), the objects to fetch again although logged (``refetch``, found at
    start-up), and the ``epochs/<k>.downloaded`` marker."""

    def __init__(
        self,
        config: Config,
        layout: Layout,
        download_log: DownloadLog,
        keeper: Keeper | None,
        counters: DownloaderCounters,
        before_epoch: Callable[[], None],
    ) -> None:
        self.config = config
        self.layout = layout
        self.download_log = download_log
        self.keeper = keeper
        self.counters = counters
        self.before_epoch = before_epoch  # called before each epoch after this run's first
        self.share = ShareTable()
        self.epochs: dict[int, EpochProgress] = {}
        self.first_epoch = 0  # the first epoch this run schedules
        self.refetch: set[str] = set()  # logged as published, found gone at start-up
        # resumed on another number of hosts: what is left of the interrupted epoch
        self.remainder: Remainder | None = None
        self._listing: bytes | None = None  # the share's ListingId as JSON, once computed

    def jobs(self) -> Iterator[Job]:
        """A job per object still to fetch, epoch after epoch (for ever without epochs.count)."""
        count = self.config.epochs.count
        epoch = self._first_epoch()
        bucket = self.config.source.bucket
        first = True
        self.first_epoch = epoch
        while count is None or epoch < count:
            if epoch > self.first_epoch:
                self.before_epoch()
            order = self.order(epoch)
            self._write_listing(epoch)
            progress = EpochProgress(len(order), bytearray(len(order)))
            self.epochs[epoch] = progress
            done_bytes = self._mark_logged(epoch, order, progress)
            self.counters.update(
                {
                    "epoch": epoch,
                    "epoch_objects": len(order),
                    "epoch_objects_done": progress.done,
                    "epoch_bytes": self.share.total_size(),
                    "epoch_bytes_done": done_bytes,
                }
            )
            for seq, row in enumerate(order):
                if progress.finished[seq]:
                    continue  # published or skipped before a restart
                obj = self.share[row]
                if self.keeper is not None:
                    obj = self.keeper.current(row, obj)
                digest = key_hash(bucket, obj.key)
                name = object_name(epoch, seq, digest)
                job = Job(epoch, seq, obj, name, self.layout.download_part(name))
                job.skip = self._skip(epoch, row)
                if first:
                    job.part_size, first = self._first_part_size(obj.size), False
                yield job
            progress.scheduled = True
            self.maybe_mark_downloaded(epoch)
            epoch += 1

    def order(self, epoch: int) -> array[int]:
        """Rows of the share in ``epoch``'s order."""
        if self.remainder is not None and epoch == self.remainder.epoch:
            return self.remainder.rows
        return epoch_permutation(
            len(self.share),
            seed=self.config.epochs.seed,
            epoch=epoch,
            shuffle=self.config.epochs.shuffle,
        )

    def _write_listing(self, epoch: int) -> None:
        """``epochs/<epoch>.listing``: the share's ``ListingId`` (computed once per run, read
        back once per epoch), rewritten only if a restart listed another share."""
        if self._listing is None:
            self._listing = json.dumps(self.share.identity().to_json()).encode()
        path = self.layout.epoch_listing(epoch)
        try:
            if path.read_bytes() == self._listing:
                return
        except FileNotFoundError:
            pass
        write_atomic(path, self._listing)

    def job_again(self, name: str) -> Job | None:
        """A new job for the published object ``name`` of a scheduled epoch (to fetch it again
        under the same name); None if ``name`` is no such object."""
        parsed = parse_object_name(name)
        if parsed is None or parsed[0] not in self.epochs:
            return None
        epoch, seq, _ = parsed
        row = self.order(epoch)[seq]
        job = Job(epoch, seq, self.share[row], name, self.layout.download_part(name))
        job.skip = self._skip(epoch, row)
        return job

    def _skip(self, epoch: int, row: int) -> list[list[int]] | None:
        """The records of the object at ``row`` trained before a resume on another number of
        hosts (the writer leaves them out)."""
        if self.remainder is None or epoch != self.remainder.epoch:
            return None
        return self.remainder.skips.get(row)

    def mark_done(self, job: Job) -> None:
        """``job`` is published or skipped (and logged as such)."""
        progress = self.epochs[job.epoch]
        progress.mark(job.seq)
        if job.epoch == self.counters["epoch"]:
            self.counters["epoch_objects_done"] = progress.done
            self.counters["epoch_bytes_done"] += job.obj.size
        self.maybe_mark_downloaded(job.epoch)

    def maybe_mark_downloaded(self, epoch: int) -> None:
        """Write ``epochs/<epoch>.downloaded`` once every object of it is done."""
        progress = self.epochs[epoch]
        if progress.scheduled and progress.done >= progress.total:
            # nothing more to log; the supervisor removes the log once the epoch is complete
            self.download_log.close(epoch)
            if self.keeper is not None:
                self.keeper.save()
            if mark_downloaded(self.layout, epoch, progress.total):
                log.info("epoch %d: all %d objects downloaded", epoch, progress.total)

    def _first_part_size(self, size: int) -> int | None:
        """Finer parts for the first object this process fetches, so that it takes every
        connection and arrives alone, first, instead of dividing the bandwidth with the next
        few objects (objects of 8 parts with 32 connections: 4 at once). The trainer's first
        batch waits on it; later objects are fetched in ``download.part_size`` parts."""
        download = self.config.download
        part = max(FIRST_PART_MIN, -(-size // download.concurrency))
        return part if part < download.part_size else None

    def _mark_logged(self, epoch: int, order: array[int], progress: EpochProgress) -> int:
        """Mark the objects a previous run published or skipped; returns their bytes."""
        logged = self.download_log.read(epoch)
        done_bytes = 0
        if logged:
            bucket = self.config.source.bucket
            for seq, row in enumerate(order):
                obj = self.share[row]
                digest = key_hash(bucket, obj.key)
                if digest in logged and not self._refetching(epoch, seq, digest):
                    progress.mark(seq)
                    done_bytes += obj.size
        return done_bytes

    def _refetching(self, epoch: int, seq: int, digest: str) -> bool:
        name = object_name(epoch, seq, digest) if self.refetch else ""
        if name not in self.refetch:
            return False
        self.refetch.discard(name)
        self.counters["objects_refetched"] += 1
        return True

    def _first_epoch(self) -> int:
        return first_epoch_without(self.layout.downloaded_marker)
