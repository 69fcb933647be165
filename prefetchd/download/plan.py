"""The epochs' plan: which objects each epoch fetches, in which order, and which are done.

Each epoch goes over the host's share in its seeded order (``order.epoch_permutation``), one
``Job`` per object not yet finished; an object a previous run logged as published or skipped
(the download log) is not fetched again, except one whose file vanished after it was published.
When every object of epoch k is published or skipped, ``epochs/<k>.downloaded`` is written.
Before its first job, ``epochs/<k>.listing`` names the share (every source's) the order is over
(``trained_objects.ListingId``), for the positions trainers save (a resume on another number
of hosts checks it).

With several sources (``sources:``) an epoch's objects come from every source's share by
weight (``mixture.py``): each position of the order is a (source, period, row), and an object's
hash covers its source and period too (``mixed_key_hash``), so two sources listing one key, or
one object read twice in an epoch, never share a name or a download-log line. Resumed on
another number of hosts, the interrupted epoch is the reads left of it (``Remainder``: its rows
for one source, its ``mix`` for several), with the records trained of those begun as each
job's ``skip``. Each source's
figures for the report are ``source_figures.py``'s.
"""

from __future__ import annotations

import errno
import json
import logging
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.download.jobs import Job
from prefetchd.download.keeper import Keeper
from prefetchd.download.mixture import EpochMix, Streams, epoch_mix
from prefetchd.download.order import SourceObject, epoch_permutation
from prefetchd.download.rehost import Remainder, streams_of
from prefetchd.download.share import ShareTable
from prefetchd.download.source_figures import SourceFigures
from prefetchd.exactly_once.download_log import DownloadLog
from prefetchd.exactly_once.markers import first_epoch_without, mark_downloaded
from prefetchd.exactly_once.trained_objects import ListingId
from prefetchd.layout import (
    Layout,
    key_hash,
    mixed_key_hash,
    object_name,
    parse_object_name,
)
from prefetchd.messages.counters import DownloaderCounters
from prefetchd.messages.source_status import SourceStatus

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
        self.shares: list[ShareTable] = [ShareTable()]  # one per source, set once listed
        self.epochs: dict[int, EpochProgress] = {}
        # Epochs downloaded whose marker (or keep figures) a full cache disk held back: written
        # again by Publisher.settle_owed until they fit; the loop is not finished meanwhile.
        self.markers_owed: set[int] = set()
        self._mixes: dict[int, EpochMix] = {}  # epochs' mixed orders, the last two computed
        self._orders: dict[int, array[int]] = {}  # epochs' orders of one source, likewise
        self._streams: Streams | None = None
        self.figures = SourceFigures(config)
        self.first_epoch = 0  # the first epoch this run schedules
        self.refetch: set[str] = set()  # logged as published, found gone at start-up
        # resumed on another number of hosts: what is left of the interrupted epoch
        self.remainder: Remainder | None = None
        self._listing: bytes | None = None  # the share's ListingId as JSON, once computed

    @property
    def share(self) -> ShareTable:
        """The first source's share: the whole share of a job of one source."""
        return self.shares[0]

    @share.setter
    def share(self, table: ShareTable) -> None:
        self.shares = [table]

    def jobs(self) -> Iterator[Job]:
        """A job per object still to fetch, epoch after epoch (for ever without epochs.count)."""
        count = self.config.epochs.count
        epoch = self._first_epoch()
        first = True
        self.first_epoch = epoch
        while count is None or epoch < count:
            if epoch > self.first_epoch:
                self.before_epoch()
            total = self.epoch_length(epoch)
            self._write_listing(epoch)  # a resume on other hosts checks it
            progress = EpochProgress(total, bytearray(total))
            self.epochs[epoch] = progress
            mix = self.mix(epoch) if self.config.mixed else None
            self.figures.start_epoch(
                mix, [share.sizes() for share in self.shares] if mix is not None else []
            )
            done_bytes = self._mark_logged(epoch, progress)
            self.counters.update(
                {
                    "epoch": epoch,
                    "epoch_objects": total,
                    "epoch_objects_done": progress.done,
                    "epoch_bytes": self.epoch_bytes(epoch),
                    "epoch_bytes_done": done_bytes,
                }
            )
            # One source: job_at's steps inline, with what is the same for the whole epoch
            # looked up once (its order, the share, the bucket, the remainder's skips), not per
            # object (issue 28: a Python call less per step is CPU per small object).
            mixed, layout, keeper = self.config.mixed, self.layout, self.keeper
            order = None if mixed else self._order_of(epoch)
            share, bucket = self.share, self.config.source.bucket
            remainder = self.remainder
            skips = remainder.skips if remainder is not None and remainder.epoch == epoch else None
            finished = progress.finished
            for seq in range(total):
                if finished[seq]:
                    continue  # published or skipped before a restart
                if order is None:
                    job = self.job_at(epoch, seq)
                else:
                    row = order[seq]
                    obj = share[row]
                    if keeper is not None:
                        obj = keeper.current(row, obj)
                    name = object_name(epoch, seq, key_hash(bucket, obj.key))
                    job = Job(epoch, seq, obj, name, layout.download_part(name))
                    if skips is not None:
                        job.skip = skips.get(row)
                if first:
                    job.part_size, first = self._first_part_size(job.obj.size), False
                yield job
            progress.scheduled = True
            self.maybe_mark_downloaded(epoch)
            epoch += 1

    def order(self, epoch: int) -> array[int]:
        """Rows of the share in ``epoch``'s order (one source)."""
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
            identity = (
                ListingId.of_sources([share.identity() for share in self.shares])
                if self.config.mixed
                else self.share.identity()
            )
            self._listing = json.dumps(identity.to_json()).encode()
        path = self.layout.epoch_listing(epoch)
        try:
            if path.read_bytes() == self._listing:
                return
        except FileNotFoundError:
            pass
        write_atomic(path, self._listing)

    def streams(self) -> Streams:
        """The sources' streams over the listed shares (``mixture.py``)."""
        return streams_of(self.config, [share.sizes() for share in self.shares])

    def mix(self, epoch: int) -> EpochMix:
        """``epoch``'s mixed order (several sources), computed once per epoch; the reads left
        of it, resumed on another number of hosts (``rehost.split_mixed``)."""
        remainder = self.remainder
        if remainder is not None and remainder.mix is not None and epoch == remainder.epoch:
            self._mixes[epoch] = remainder.mix  # the report's figures read it there
            return remainder.mix
        if epoch not in self._mixes:
            if self._streams is None:
                self._streams = self.streams()
            self._mixes[epoch] = epoch_mix(self._streams, epoch)
            for old in sorted(self._mixes)[:-2]:
                del self._mixes[old]
        return self._mixes[epoch]

    def epoch_length(self, epoch: int) -> int:
        return len(self.mix(epoch)) if self.config.mixed else len(self._order_of(epoch))

    def epoch_bytes(self, epoch: int) -> int:
        if not self.config.mixed:
            return self.share.total_size()
        mix = self.mix(epoch)
        sizes = [share.sizes() for share in self.shares]
        return sum(sizes[s][r] for s, r in zip(mix.sources, mix.rows, strict=True))

    def object_at(self, epoch: int, seq: int) -> tuple[int, SourceObject, str]:
        """The source, the object (as listed now) and its hash at ``seq`` of ``epoch``."""
        if not self.config.mixed:
            row = self._order_of(epoch)[seq]
            obj = self.share[row]
            if self.keeper is not None:
                obj = self.keeper.current(row, obj)
            return 0, obj, key_hash(self.config.source.bucket, obj.key)
        source, period, row = self.mix(epoch).at(seq)
        obj = self.shares[source][row]
        if self.keeper is not None:
            obj = self.keeper.current(row, obj, source)
        bucket = self.config.sources[source].bucket
        return source, obj, mixed_key_hash(source, period, bucket, obj.key)

    def job_at(self, epoch: int, seq: int) -> Job:
        source, obj, digest = self.object_at(epoch, seq)
        name = object_name(epoch, seq, digest)
        job = Job(epoch, seq, obj, name, self.layout.download_part(name), source=source)
        if self.config.mixed:
            job.format = self.config.sources[source].format
            job.bucket = self.config.sources[source].bucket
            job.skip = self._skip(epoch, seq)  # by place in the remainder's mix
        else:
            job.skip = self._skip(epoch, self._order_of(epoch)[seq])
        return job

    def _order_of(self, epoch: int) -> array[int]:
        """``order(epoch)``, computed once for the last two epochs asked (one source)."""
        if epoch not in self._orders:
            self._orders[epoch] = self.order(epoch)
            for old in sorted(self._orders)[:-2]:
                del self._orders[old]
        return self._orders[epoch]

    def job_again(self, name: str) -> Job | None:
        """A new job for the published object ``name`` of a scheduled epoch (to fetch it again
        under the same name); None if ``name`` is no such object."""
        parsed = parse_object_name(name)
        if parsed is None or parsed[0] not in self.epochs:
            return None
        return self.job_at(parsed[0], parsed[1])

    def _skip(self, epoch: int, at: int) -> list[list[int]] | None:
        """The records trained before a resume on another number of hosts (the writer leaves
        them out) of the object at row ``at`` (one source) or of the read at place ``at`` of
        the epoch's order (several sources)."""
        if self.remainder is None or epoch != self.remainder.epoch:
            return None
        return self.remainder.skips.get(at)

    def mark_done(self, job: Job) -> None:
        """``job`` is published or skipped (and logged as such). Called per object: the
        progress is marked inline, and the marker looked at only once the epoch is scheduled."""
        epoch, progress = job.epoch, self.epochs[job.epoch]
        finished, seq = progress.finished, job.seq
        if not finished[seq]:  # EpochProgress.mark's, inline
            finished[seq] = 1
            progress.done += 1
        counters = self.counters
        if epoch == counters["epoch"]:
            counters["epoch_objects_done"] = progress.done
            counters["epoch_bytes_done"] += job.obj.size
            self.figures.epoch_done[job.source] += job.obj.size
        if progress.scheduled:
            self.maybe_mark_downloaded(epoch)

    def maybe_mark_downloaded(self, epoch: int) -> None:
        """Write ``epochs/<epoch>.downloaded`` once every object of it is done."""
        progress = self.epochs[epoch]
        if progress.scheduled and progress.done >= progress.total:
            # nothing more to log; the supervisor removes the log once the epoch is complete
            self.download_log.close(epoch)
            try:
                if self.keeper is not None:
                    self.keeper.save()
                marked = mark_downloaded(self.layout, epoch, progress.total)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                if epoch not in self.markers_owed:  # said once; written again until it fits
                    log.warning(
                        "epoch %d: all %d objects downloaded, but the cache disk is full: "
                        "its marker waits for room (%s)",
                        epoch,
                        progress.total,
                        exc.strerror,
                    )
                self.markers_owed.add(epoch)
                return
            self.markers_owed.discard(epoch)
            if marked:
                log.info("epoch %d: all %d objects downloaded", epoch, progress.total)

    def _first_part_size(self, size: int) -> int | None:
        """Finer parts for the first object this process fetches, so that it takes every
        connection and arrives alone, first, instead of dividing the bandwidth with the next
        few objects (objects of 8 parts with 32 connections: 4 at once). The trainer's first
        batch waits on it; later objects are fetched in ``download.part_size`` parts."""
        download = self.config.download
        part = max(FIRST_PART_MIN, -(-size // download.concurrency))
        return part if part < download.part_size else None

    def _mark_logged(self, epoch: int, progress: EpochProgress) -> int:
        """Mark the objects a previous run published or skipped; returns their bytes."""
        logged = self.download_log.read(epoch)
        done_bytes = 0
        if logged:
            for seq in range(progress.total):
                source, obj, digest = self.object_at(epoch, seq)
                if digest in logged and not self._refetching(epoch, seq, digest):
                    progress.mark(seq)
                    done_bytes += obj.size
                    self.figures.epoch_done[source] += obj.size
        return done_bytes

    def source_statuses(self, window: Mapping[str, int]) -> list[SourceStatus]:
        """Each source's figures now, with its bytes in ``window`` (name -> bytes held)."""
        return self.figures.statuses(self.counters["epoch"], window, self._mixes)

    def _refetching(self, epoch: int, seq: int, digest: str) -> bool:
        name = object_name(epoch, seq, digest) if self.refetch else ""
        if name not in self.refetch:
            return False
        self.refetch.discard(name)
        self.counters["objects_refetched"] += 1
        return True

    def _first_epoch(self) -> int:
        return first_epoch_without(self.layout.downloaded_marker)
