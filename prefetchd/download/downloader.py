"""The downloader process: list once, then fetch each epoch's objects into the cache window.

Objects are fetched in the epoch's seeded order, ``download.concurrency`` requests at a time,
while the raw bytes on disk stay within ``download.window``. A fetched object is verified,
then published in three steps whose order makes a crash at any point safe::

    meta/<obj>.json written  ->  "P <hash>" appended to progress/e<k>.log  ->  .tmp/<obj>.part
    renamed to ready/<obj>

A first meta is written without a temp name, complete before its log line; no reader opens it
before the rename, and one a crash left partial is of an object not yet logged, which start-up
deletes. A meta rewritten (a refetched object's) is replaced atomically.
On start-up a ``.part`` whose hash is already in the progress log is rolled forward (renamed);
any other ``.part`` is deleted and fetched again. Objects in the log are not fetched again,
except one whose meta is still there while its file is gone (deleted from ``ready/`` by someone
else, before any writer read it; writers delete the meta first): that one is fetched again under
the same name and counted in ``objects_refetched``, at start-up and while running alike.
When every object of epoch k is published or skipped, ``epochs/<k>.downloaded`` is written.
An object to be fetched again keeps its room in the window until it is published or skipped
(``_discard``): the next epoch's objects, which writers leave alone until then, must not take it.

With ``download.keep`` (``keeper.py``), an object whose verified copy is kept goes the same way
without a GET: the kept file is hard-linked at ``.tmp/<obj>.part`` and published as above. Such
hand-overs take no disk of their own, so they are held to a second ledger (``handoff``, also
``download.window`` bytes) instead of the window; it keeps ``ready/`` as short as downloads do.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import queue
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from prefetchd.atomic import open_append, write_atomic, write_new
from prefetchd.budget import Window
from prefetchd.download.jobs import Job
from prefetchd.download.keeper import Keeper
from prefetchd.download.order import epoch_permutation
from prefetchd.download.share import ShareTable
from prefetchd.download.store import (
    Fault,
    S3Client,
    boot_failure,
    bucket_readable,
    classify,
    describe,
    is_throttling,
    list_share,
    make_client,
)
from prefetchd.download.transfer import make_transfer
from prefetchd.download.verify import IntegrityError, SizeChanged
from prefetchd.errors import RuntimeFailure
from prefetchd.exactly_once.markers import first_epoch_without
from prefetchd.inotify import IN_DELETE, IN_MOVED_FROM, Watch
from prefetchd.layout import (
    claimed_object,
    is_part,
    key_hash,
    object_digest,
    object_name,
    parse_object_name,
    unmeta,
    unpart,
)
from prefetchd.logs import escape_key
from prefetchd.supervise.child import ChildContext
from prefetchd.supervise.child_report import Activity, DownloaderCounters

log = logging.getLogger(__name__)

MAX_INTEGRITY_ATTEMPTS = 3
BACKOFF_MAX = 60.0
PROBE_INTERVAL = 10.0  # seconds a "can we still list the bucket?" answer is trusted
UNREACHABLE_AFTER = 60.0  # seconds of nothing but store errors before status says so
FIRST_PART_MIN = 1024 * 1024  # the smallest part of the first object (see _first_part_size)
# How often the busy loop reads the inotify watches (two reads, each mostly EAGAIN): a freed
# window is looked for at once when an object does not fit, so this only delays noticing.
DELETIONS_EVERY = 0.02


@dataclass
class EpochProgress:
    total: int
    finished: bytearray  # one byte per position in the epoch's order: published or skipped
    done: int = 0  # how many of ``finished`` are set
    scheduled: bool = False

    def mark(self, seq: int) -> None:
        if not self.finished[seq]:
            self.finished[seq] = 1
            self.done += 1


class Downloader:
    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.layout = ctx.layout
        self.window = Window(self.config.download.window)
        self.handoff = Window(self.config.download.window)  # kept objects handed to writers
        self.keeper: Keeper | None = None
        self.linked: set[str] = set()  # objects on disk whose bytes are also kept (start-up)
        self.first_epoch = 0  # the first epoch this run schedules
        self.results: queue.SimpleQueue[Job] = queue.SimpleQueue()  # C; no Condition per put
        self.retry_queue: list[tuple[float, Job]] = []
        self.epochs: dict[int, EpochProgress] = {}
        self.share = ShareTable()
        self.active: dict[str, Job] = {}  # prepared and not yet handled, by local name
        self.meta_written: set[str] = set()  # names whose meta a transfer thread wrote
        self.refetch: set[str] = set()  # logged as published, found gone at start-up
        self.log_fds: dict[int, int] = {}  # epoch -> its progress log, open for appending
        self.consecutive_faults = 0
        self.deletions_due = 0.0  # monotonic time the busy loop next reads the watches
        self.unverified_reasons: set[str] = set()  # logged once each
        self.paused_until = 0.0
        self.pause_reason: str | None = None
        self.faults_since = 0.0  # monotonic time of the first of the consecutive faults
        self._probe_client: S3Client | None = None
        # Joined per object as text: a pathlib join and its str() cost more than the syscall.
        self._ready_dir = str(self.layout.cache_ready)
        self._probed: tuple[float, bool] = (-PROBE_INTERVAL, False)  # (when, readable)
        self.counters = ctx.counters = DownloaderCounters(
            objects_downloaded=0,
            bytes_downloaded=0,
            retries=0,
            errors=0,
            objects_skipped=0,
            integrity_failures=0,
            objects_unverified=0,
            verify_requests=0,
            objects_refetched=0,
            objects_listed=0,
            epoch=0,
            epoch_objects=0,
            epoch_objects_done=0,
            epoch_bytes=0,
            epoch_bytes_done=0,
            window_bytes=0,
            window_fetching_bytes=0,
            window_limit=self.window.limit,
            keep_bytes=0,
            keep_hits=0,
            keep_hit_bytes=0,
            keep_misses=0,
            keep_miss_bytes=0,
            keep_gets_saved=0,
            keep_refetched=0,
            keep_stopped=0,
            activity=Activity.LISTING,
            activity_detail=None,
        )

    # --- boot ---------------------------------------------------------------------------------

    def run(self) -> None:
        client = make_client(self.config, pool=8)
        try:
            for obj in list_share(client, self.config, listed=self._listed):
                self.share.append(obj)
            self.share.finish()
        except RuntimeFailure:
            raise
        except Exception as exc:
            raise boot_failure(self.config, exc) from None
        if not self.share:
            raise RuntimeFailure(
                f"no objects under {self.config.source.url} match source.include "
                f"{list(self.config.source.include)} for worker "
                f"{self.config.sharding.worker_index} of {self.config.sharding.num_workers}"
            )
        log.info(
            "%d objects, %.1f MiB in this host's share of %s (listing held in %.1f MiB)",
            len(self.share),
            self.share.total_size() / 2**20,
            self.config.source.url,
            self.share.nbytes() / 2**20,
        )
        if self.share.duplicates:
            log.warning(
                "%d keys were listed more than once; each is read once", self.share.duplicates
            )
        self._plan_keep()
        # Watch before the start-up scan: a writer that deletes an object while we scan (its
        # own recovery) must still free the window, or those bytes would be held for ever.
        with (
            Watch(self.layout.cache_claimed, IN_DELETE | IN_MOVED_FROM) as deletions,
            Watch(self.layout.cache_ready, IN_DELETE) as vanished,
        ):
            self.deletions = deletions
            self.vanished = vanished  # writers rename out of ready/: a delete is someone else
            self._recover()
            self.transfer = make_transfer(self.config, self._transfer_done)
            self.ctx.settled()
            try:
                self._loop()
            finally:
                self.transfer.shutdown()
                self._drain_results()
                self._abandon_unfinished()
                for fd in self.log_fds.values():
                    os.close(fd)
                self.log_fds.clear()
        self.ctx.report(force=True)

    def _listed(self, count: int) -> None:
        """Listing progress: status shows it (a bucket of millions of keys lists for minutes,
        and a starving trainer should read why), and the report is this child's heartbeat."""
        self.counters["objects_listed"] = count
        self.ctx.report()

    def _abandon_unfinished(self) -> None:
        """On stop: remove downloads that were cancelled before they finished."""
        for job in self.active.values():
            if job.fd >= 0:
                os.close(job.fd)
                job.fd = -1
            job.tmp.unlink(missing_ok=True)
        self.active.clear()

    def _recover(self) -> None:
        """Sweep what a previous run left behind; learn what is already on disk."""
        logged = {k: self._read_log(k) for k in self._unfinished_epochs_on_disk()}
        for entry in os.scandir(self.layout.cache_tmp):
            name = unpart(entry.name)
            parsed = parse_object_name(name)
            if parsed and is_part(entry.name) and parsed[2] in logged.get(parsed[0], ()):
                os.rename(entry.path, self.layout.cache_ready / name)  # roll forward
                log.info("rolled forward %s after a restart", name)
            else:
                os.unlink(entry.path)
        on_disk = self._objects_on_disk()
        for entry in os.scandir(self.layout.cache_meta):
            name = unmeta(entry.name)
            parsed = parse_object_name(name)
            if name in on_disk:
                continue
            if parsed is not None and parsed[2] in logged.get(parsed[0], ()):
                self.refetch.add(name)  # published, then deleted before a writer read it
                log.warning("%s vanished from %s; fetching it again", name, self.layout.cache)
            else:
                os.unlink(entry.path)  # written early for a fetch that never finished
        self._reset_windows(on_disk)

    def _objects_on_disk(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for directory in (self.layout.cache_ready, self.layout.cache_claimed):
            for entry in os.scandir(directory):
                name = claimed_object(entry.name) if directory.name == "claimed" else entry.name
                if name is None:
                    continue
                try:
                    info = entry.stat()
                except FileNotFoundError:
                    continue
                held[name] = info.st_size
                if info.st_nlink > 1:
                    self.linked.add(name)
        return held

    def _unfinished_epochs_on_disk(self) -> list[int]:
        return self.layout.download_log_epochs()

    def _read_log(self, epoch: int) -> set[str]:
        path = self._log_path(epoch)
        try:
            with path.open(encoding="ascii") as f:
                return {line.split()[1] for line in f if len(line.split()) == 2}
        except FileNotFoundError:
            return set()

    def _log_path(self, epoch: int) -> Path:
        return self.layout.download_log(epoch)

    # --- main loop ----------------------------------------------------------------------------

    def _jobs(self) -> Iterator[Job]:
        count = self.config.epochs.count
        epoch = self._first_epoch()
        bucket = self.config.source.bucket
        first = True
        self.first_epoch = epoch
        while count is None or epoch < count:
            if epoch > self.first_epoch:
                self._refresh_keep()
            order = epoch_permutation(
                len(self.share),
                seed=self.config.epochs.seed,
                epoch=epoch,
                shuffle=self.config.epochs.shuffle,
            )
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
                if first:
                    job.part_size, first = self._first_part_size(obj.size), False
                yield job
            progress.scheduled = True
            self._maybe_mark_downloaded(epoch)
            epoch += 1

    def _first_part_size(self, size: int) -> int | None:
        """Finer parts for the first object this process fetches, so that it takes every
        connection and arrives alone, first, instead of with the next few objects sharing the
        bandwidth (objects of 8 parts with 32 connections: 4 at once). The trainer's first
        batch waits on it; later objects are fetched in ``download.part_size`` parts."""
        download = self.config.download
        part = max(FIRST_PART_MIN, -(-size // download.concurrency))
        return part if part < download.part_size else None

    def _mark_logged(self, epoch: int, order: array[int], progress: EpochProgress) -> int:
        """Mark the objects a previous run published or skipped; returns their bytes."""
        logged = self._read_log(epoch)
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

    def _loop(self) -> None:
        jobs = self._jobs()
        current: Job | None = None
        exhausted = False
        while not self.ctx.should_stop():
            self._drain_results()
            now = time.monotonic()
            if now >= self.deletions_due:
                self._apply_deletions(timeout=0)
            if current is None:
                current = self._next_retry(now)
            if current is None and not exhausted:
                current = next(jobs, None)
                exhausted = current is None
            if current is None:
                if exhausted and not self.active and not self.retry_queue:
                    self.counters["activity"] = Activity.FINISHED
                    self._report()
                    self._apply_deletions(timeout=0.2)
                    continue
                self._wait(0.05)
                continue
            if now < self.paused_until:
                self.counters["activity"] = Activity.PAUSED
                self.counters["activity_detail"] = self.pause_reason
                self._wait(0.1)
                continue
            if current.fd < 0 and current.next_part == 0:
                served = self._serve_kept(current)
                if served is not False:
                    current = None if served else self._prefer_held_retry(current, now)
                    continue
                if not self.window.fits(current.obj.size, current.name):
                    self._apply_deletions(timeout=0)  # not yet read: maybe room was freed
                if not self.window.fits(current.obj.size, current.name):
                    current = self._prefer_held_retry(current, now)
                    self.counters["activity"] = Activity.WAITING_FOR_WINDOW
                    self._wait(0.05)
                    continue
                self.window.reserve(current.name, current.obj.size)
                self.transfer.prepare(current)
                self.active[current.name] = current
            self.counters["activity"] = Activity.DOWNLOADING
            if self.transfer.submit_parts(current, timeout=0.05):
                current = None
            self._report()

    def _prefer_held_retry(self, waiting: Job, now: float) -> Job:
        """A job that waits for room gives way to a due retry that still holds its own room: a
        later object, perhaps of the next epoch, must never wait in front of an earlier one
        whose room is kept for it (``_discard``), or neither would ever start. The job put back
        is taken again as a retry due now, before any new job."""
        for i, (due, job) in enumerate(self.retry_queue):
            if due <= now and job.name in self.window.held:
                self.retry_queue[i] = (now, waiting)
                return job
        return waiting

    def _wait(self, timeout: float) -> None:
        try:
            job = self.results.get(timeout=timeout)
        except queue.Empty:
            self._apply_deletions(timeout=0)
        else:
            self._handle(job)
        self._report()

    def _report(self) -> None:
        if not self.ctx.report_due():
            return  # the loop calls this per step; the figures are only needed when published
        self.counters["window_bytes"] = self.window.used
        if self.keeper is not None:
            self.keeper.save()
        self.counters["window_fetching_bytes"] = sum(
            job.obj.size for job in (*self.active.values(), *(job for _, job in self.retry_queue))
        )
        self.ctx.report()

    def _apply_deletions(self, timeout: float) -> None:
        self.deletions_due = time.monotonic() + DELETIONS_EVERY
        for event in self.vanished.read_now():
            if not event.overflow:
                self._refetch(event.name)
        for event in self.deletions.read(timeout):
            if event.overflow:
                self._reset_windows({**self._objects_on_disk(), **self._in_flight_sizes()})
                continue
            name = claimed_object(event.name)
            if name is not None:
                self.window.release(name)
                self.handoff.release(name)

    def _refetch(self, name: str) -> None:
        """``ready/<name>`` was deleted before any writer claimed it (a writer renames, never
        deletes, there): fetch it again under the same name. Its meta is (re)written first, so
        the supervisor does not call its epoch complete meanwhile."""
        parsed = parse_object_name(name)
        if parsed is None or parsed[0] not in self.epochs:
            return
        epoch, seq, _ = parsed
        order = epoch_permutation(
            len(self.share),
            seed=self.config.epochs.seed,
            epoch=epoch,
            shuffle=self.config.epochs.shuffle,
        )
        obj = self.share[order[seq]]
        job = Job(epoch, seq, obj, name, self.layout.download_part(name))
        self._write_meta(job)
        # its room in the window stays reserved for the new copy (see _discard)
        log.warning(
            "%s (s3://%s/%s) vanished from ready/ before a writer read it; fetching it again",
            name,
            self.config.source.bucket,
            obj.key,
        )
        self.counters["objects_refetched"] += 1
        self._retry(job, delay=0.0, count_attempt=False)

    def _in_flight_sizes(self) -> dict[str, int]:
        """The room of the jobs being fetched and of the retries that keep theirs."""
        held = {
            job.name: job.obj.size for _, job in self.retry_queue if job.name in self.window.held
        }
        return {**held, **{name: job.obj.size for name, job in self.active.items()}}

    def _drain_results(self) -> None:
        while True:
            try:
                job = self.results.get_nowait()
            except queue.Empty:
                return
            self._handle(job)

    # --- results ------------------------------------------------------------------------------

    def _handle(self, job: Job) -> None:
        self.active.pop(job.name, None)
        self.counters["retries"] += job.retries
        self.counters["verify_requests"] += job.lookups
        if job.error is None:
            job.error = self._try_publish(job)
            if job.error is None:
                self.consecutive_faults = 0
                self._note_unverified(job)
                return
        self._discard(job)
        if self.ctx.stopping:
            return
        key, error = job.obj.key, job.error
        if isinstance(error, SizeChanged):
            self._resize(job, error)
            return
        if isinstance(error, IntegrityError):
            self.counters["integrity_failures"] += 1
            if job.attempt + 1 < MAX_INTEGRITY_ATTEMPTS:
                log.warning("re-fetching %s: %s", escape_key(key), error)
                self.counters["retries"] += 1
                self._retry(job, delay=0.5)
            else:
                self._skip(job, f"corrupt after {MAX_INTEGRITY_ATTEMPTS} fetches: {error}")
            return
        fault = classify(error)
        if fault is Fault.FORBIDDEN:
            fault = Fault.PERMANENT if self._bucket_readable() else Fault.DENIED
        if fault is Fault.GONE:
            self._skip(job, "deleted after it was listed (404); skipped for this epoch")
        elif fault is Fault.CHANGED:
            self._skip(job, "overwritten after it was listed (412); skipped for this epoch")
        elif fault is Fault.PERMANENT:
            self._skip(job, f"{describe(error)}; retrying cannot help: skipped for this epoch")
        elif fault is Fault.TRANSIENT and self._given_up(job, error):
            self._skip(
                job,
                f"failed {job.faults} times while the store served other requests "
                f"(download.retries {self.config.download.retries}), last: {describe(error)}",
            )
        else:
            self._pause(job, error, fault)

    def _pause(self, job: Job, error: BaseException, fault: Fault) -> None:
        """A fault retrying may fix: pause every download with a growing backoff, say why in
        status (and that the store looks unreachable once nothing got through for a while),
        and fetch ``job`` again after the pause."""
        now = time.monotonic()
        if self.consecutive_faults == 0:
            self.faults_since = now
        self.consecutive_faults += 1
        delay = min(BACKOFF_MAX, 2.0 ** min(self.consecutive_faults, 6))
        reason = "access denied" if fault is Fault.DENIED else "store errors"
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            reason = f"download.cache_dir {self.layout.cache} is full"
        elif now - self.faults_since >= UNREACHABLE_AFTER:
            reason = f"store unreachable for {now - self.faults_since:.0f}s, {reason}"
        self.pause_reason = f"{reason} ({describe(error)}), retrying in {delay:.0f}s"
        self.paused_until = now + delay
        key = escape_key(job.obj.key)
        log.warning("%s: %s; pausing downloads for %.0fs", key, describe(error), delay)
        self.ctx.error(job.obj.key, describe(error))
        self.counters["retries"] += 1
        self._retry(job, delay=delay, count_attempt=False)

    def _given_up(self, job: Job, error: BaseException) -> bool:
        """Whether ``job`` has failed more than ``download.retries`` times while the store
        demonstrably worked (another object downloaded since its previous failure, or the
        bucket still lists): the store works, this object does not, and waiting for it would
        hold the epoch open for ever. Throttling, a full cache disk and a store down for
        everyone only pause."""
        if is_throttling(error) or (isinstance(error, OSError) and error.errno == errno.ENOSPC):
            return False
        published = self.counters["objects_downloaded"]
        others_done = 0 <= job.published_at_fault < published
        job.published_at_fault = published
        if others_done or self._bucket_readable():
            job.faults += 1
        return job.faults > self.config.download.retries

    def _bucket_readable(self) -> bool:
        """Whether the source can still be listed (asked at most every ``PROBE_INTERVAL``)."""
        when, readable = self._probed
        now = time.monotonic()
        if now - when >= PROBE_INTERVAL:
            if self._probe_client is None:
                # One quick try: the main loop waits for it, and must keep reporting.
                self._probe_client = make_client(self.config, pool=1, attempts=1, timeout=5)
            readable = bucket_readable(self._probe_client, self.config)
            self._probed = (now, readable)
        return readable

    def _resize(self, job: Job, error: SizeChanged) -> None:
        """The object is not the listed size: fetch it again at its real size, which the loop
        admits against ``download.window`` before any byte lands; skipped if its size changes
        on every fetch."""
        job.attempt += 1
        if job.attempt >= MAX_INTEGRITY_ATTEMPTS:
            self._skip(job, f"its size changed on each of {job.attempt} fetches ({error})")
            return
        log.warning(
            "s3://%s/%s: %s (a stale source.manifest size?); fetching it again at its real size",
            self.config.source.bucket,
            escape_key(job.obj.key),
            error,
        )
        job.obj = replace(job.obj, size=error.actual)
        job.part_size = None
        self.counters["retries"] += 1
        self._retry(job, delay=0, count_attempt=False)

    def _note_unverified(self, job: Job) -> None:
        """Count an object published with only its size checked; say why once per reason."""
        if job.unverified is None:
            return
        self.counters["objects_unverified"] += 1
        if job.unverified not in self.unverified_reasons:
            self.unverified_reasons.add(job.unverified)
            log.warning(
                "objects like s3://%s/%s are checked for size only: %s",
                self.config.source.bucket,
                job.obj.key,
                job.unverified,
            )

    def _transfer_done(self, job: Job) -> None:
        """The transfer's ``done``, on one of its threads: write a fetched object's meta there,
        in parallel, so the main loop that feeds every request spends less of its time on file
        creates (each one gives up the GIL and waits to get it back from 32 busy threads).
        A meta without its object is swept at start-up, so writing it early is safe."""
        if job.error is None:
            try:
                self._write_meta(job)
                self.meta_written.add(job.name)
            except OSError:
                pass  # _publish writes it again, and fails loudly if it must
        self.results.put(job)

    def _write_meta(self, job: Job) -> None:
        meta: dict[str, object] = {
            "key": job.obj.key,
            "size": job.obj.size,
            "etag": job.obj.etag,
            "epoch": job.epoch,
        }
        if job.records_ok:
            meta["records_ok"] = True  # the writer skips its read-through (writer._validate)
        # A first write needs no temp name + rename (one of ~6 syscalls per object): a writer
        # opens a meta only once its object is in ready/, after this returned (the order
        # below), and a first meta left partial by a crash belongs to an object not yet
        # logged, which the start-up sweep removes (_recover). A meta that exists (a refetch
        # of a logged object, rewritten once verified) is replaced atomically: a crash must
        # not leave a logged object with a partial meta.
        path, data = self.layout.meta_file(job.name), json.dumps(meta).encode()
        if not write_new(path, data):
            write_atomic(Path(path), data)

    def _try_publish(self, job: Job) -> OSError | None:
        """Publish; a full cache disk (ENOSPC) is returned as the job's error, to be retried
        after a pause like a store error — the object was not logged, so nothing is lost."""
        try:
            self._publish(job)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            Path(self.layout.meta_file(job.name)).unlink(missing_ok=True)
            return exc
        return None

    def _publish(self, job: Job) -> None:
        if job.name in self.meta_written:  # by _transfer_done, after verifying (records_ok)
            self.meta_written.discard(job.name)
        else:
            self._write_meta(job)
        self._log(job, "P")
        if self.keeper is not None:
            room = self.window.limit - self.window.used
            self.keeper.downloaded(job.epoch, job.obj, job.tmp, reserve=max(0, room))
        os.rename(job.tmp, f"{self._ready_dir}/{job.name}")
        self.counters["objects_downloaded"] += 1
        self.counters["bytes_downloaded"] += job.obj.size
        self._mark_done(job)

    def _skip(self, job: Job, reason: str) -> None:
        self.window.release(job.name)  # given up: the room it kept for a retry (_discard)
        key = escape_key(job.obj.key)
        log.error("skipping s3://%s/%s: %s", self.config.source.bucket, key, reason)
        self.ctx.error(job.obj.key, reason)
        self.counters["errors"] += 1
        self.counters["objects_skipped"] += 1
        self._log(job, "S")
        self._mark_done(job)

    def _discard(self, job: Job) -> None:
        """Remove what a failed fetch left. Its room in the window stays reserved until the
        object is published or skipped: a retry that gave it up could find the window full of
        later objects — of the next epoch, which writers hold until this one ends — and wait
        for ever (the soak's stall)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(job.tmp)
        if job.name in self.meta_written:  # written early by _transfer_done, now not wanted
            self.meta_written.discard(job.name)
            Path(self.layout.meta_file(job.name)).unlink(missing_ok=True)

    def _retry(self, job: Job, *, delay: float, count_attempt: bool = True) -> None:
        if count_attempt:
            job.attempt += 1
        job.next_part = 0
        self.retry_queue.append((time.monotonic() + delay, job))

    def _next_retry(self, now: float) -> Job | None:
        for i, (due, job) in enumerate(self.retry_queue):
            if due <= now:
                del self.retry_queue[i]
                return job
        return None

    def _log(self, job: Job, kind: str) -> None:
        digest = parse_object_name(job.name)
        assert digest is not None
        fd = self.log_fds.get(job.epoch)
        if fd is None:  # kept open: one write per object, not open + write + close
            fd = self.log_fds[job.epoch] = open_append(self._log_path(job.epoch))
        os.write(fd, f"{kind} {digest[2]}\n".encode("ascii"))

    def _mark_done(self, job: Job) -> None:
        progress = self.epochs[job.epoch]
        progress.mark(job.seq)
        if job.epoch == self.counters["epoch"]:
            self.counters["epoch_objects_done"] = progress.done
            self.counters["epoch_bytes_done"] += job.obj.size
        self._maybe_mark_downloaded(job.epoch)

    def _maybe_mark_downloaded(self, epoch: int) -> None:
        progress = self.epochs[epoch]
        if progress.scheduled and progress.done >= progress.total:
            fd = self.log_fds.pop(epoch, None)
            if fd is not None:
                os.close(fd)  # nothing more to log; the supervisor removes it once complete
            if self.keeper is not None:
                self.keeper.save()
            marker = self.layout.downloaded_marker(epoch)
            if not marker.exists():
                write_atomic(marker, json.dumps({"objects": progress.total}).encode())
                log.info("epoch %d: all %d objects downloaded", epoch, progress.total)

    # --- download.keep (keeper.py) --------------------------------------------------------------

    def _plan_keep(self) -> None:
        """Choose what to keep; with ``download.keep: 0``, drop what an earlier run kept."""
        download = self.config.download
        bucket = self.config.source.bucket
        keeper = Keeper(self.layout, bucket, download.keep, download.part_size, self.counters)
        keeper.plan(self.share)
        self.keeper = keeper if download.keep else None

    def _refresh_keep(self) -> None:
        """List again before an epoch that may serve kept copies: a copy stands in only for an
        object unchanged since (invariant 10). If the listing fails, serve none this epoch."""
        keeper = self.keeper
        if keeper is None or not keeper.store.entries:
            return
        client = make_client(self.config, pool=8)
        # Nothing is scheduled until the listing ends: status says so meanwhile, then shows
        # what the loop was doing (serving kept copies sets no activity of its own).
        previous, self.counters["activity"] = self.counters["activity"], Activity.LISTING
        try:
            listing = ShareTable.of(list_share(client, self.config, listed=self._listed))
        except Exception as exc:  # the store's error, whatever its type: downloads still work
            log.warning(
                "download.keep: listing again failed (%s); no kept copy is used this epoch", exc
            )
            keeper.trusted = False
            return
        finally:
            self.counters["activity"] = previous
        keeper.refresh(self.share, listing)

    def _serve_kept(self, job: Job) -> bool | None:
        """Publish ``job`` from its kept copy: True if done, False if it must be downloaded,
        None if the hand-over ledger is full for now (the loop waits, as for the window)."""
        name = self.keeper.usable(job.obj) if self.keeper is not None else None
        if self.keeper is None or name is None:
            if self.keeper is not None and self.keeper.wants(job.obj) and self._fetching(job):
                # The previous epoch is still downloading it, to keep it: wait for that copy
                # instead of fetching the same bytes twice.
                self._wait(0.05)
                return None
            return False
        if not self.handoff.fits(job.obj.size):
            self.counters["activity"] = Activity.WAITING_FOR_WINDOW
            self._wait(0.05)
            return None
        if not self.keeper.hand_over(name, job.obj, job.tmp):
            return False
        self.handoff.reserve(job.name, job.obj.size)
        try:
            self._write_meta(job)
            self._log(job, "P")
        except OSError as exc:  # ENOSPC: like a download that cannot be published
            job.error = exc
            self.handoff.release(job.name)
            self._handle(job)
            return True
        os.rename(job.tmp, self.layout.cache_ready / job.name)
        self.keeper.hit(job.epoch, job.obj)
        self._mark_done(job)
        return True

    def _fetching(self, job: Job) -> bool:
        """Whether the same object is being downloaded for an earlier epoch (local names end in
        the hash of bucket and key). Only requests in flight count: one waiting for a retry is
        resubmitted by this loop, which must not wait for it."""
        if job.epoch == self.first_epoch:
            return False  # no earlier epoch in this run: skip the scan of every request
        digest = object_digest(job.name)
        return any(name.endswith(digest) for name in self.active)

    def _reset_windows(self, held: dict[str, int]) -> None:
        """Charge what is on disk (after a start-up or a lost inotify event) to the window,
        except kept objects handed to the writers, which the hand-over ledger holds."""
        kept = {n: s for n, s in held.items() if n in self.linked}
        self.window.reset({n: s for n, s in held.items() if n not in kept})
        self.handoff.reset(kept)
        self.linked.clear()
