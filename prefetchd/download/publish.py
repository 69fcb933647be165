"""Publishing a fetched object to the writers, in three steps whose order makes a crash at any
point safe::

    meta/<obj>.json written  ->  "P <hash>" appended to the download log  ->  .tmp/<obj>.part
    renamed to ready/<obj>

A first meta is written without a temp name, complete before its log line; no reader opens it
before the rename, and one a crash left partial is of an object not yet logged, which start-up
deletes (``restart.py``). A meta rewritten (a refetched object's) is replaced atomically.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import queue
from json.encoder import encode_basestring_ascii as _quote
from pathlib import Path

from prefetchd.atomic import write_atomic
from prefetchd.budget import Window
from prefetchd.child.context import ChildContext
from prefetchd.config import REPLAYABLE, Config
from prefetchd.download.jobs import Job
from prefetchd.download.keeper import Keeper
from prefetchd.download.plan import EpochPlan
from prefetchd.exactly_once.download_log import PUBLISHED, SKIPPED, DownloadLog
from prefetchd.layout.names import META_SUFFIX
from prefetchd.logs import escape_key
from prefetchd.messages.counters import DownloaderCounters
from prefetchd.spares import Spares

log = logging.getLogger(__name__)


def render_meta(job: Job, mixed: bool) -> bytes:
    """``job``'s meta as ``json.dumps`` of ``{"key", "size", "etag", "epoch"}`` (then
    ``source`` with several sources, ``skip``, ``records_ok`` where set) would write it, to the
    byte, in one f-string instead of an encoder's three Python calls per object: the strings
    quoted by the same function ``json.dumps`` quotes them with (ASCII, ``\\u`` escapes)."""
    obj = job.obj
    etag = "null" if obj.etag is None else _quote(obj.etag)
    text = f'{{"key": {_quote(obj.key)}, "size": {obj.size}, "etag": {etag}, "epoch": {job.epoch}'
    if mixed:
        text += f', "source": {job.source}'  # the writer parses it by its source's format
    if job.skip:
        text += f', "skip": {json.dumps(job.skip)}'  # records trained before a resume elsewhere
    if job.records_ok:
        text += ', "records_ok": true'  # the writer skips its read-through (ObjectReader._validate)
    return (text + "}").encode("ascii")


class Publisher:
    """Owns the end of every fetch: the queue of settled jobs the transfer threads fill
    (``results``), the meta each one writes early (``meta_written``), publishing a verified
    object into ``ready/``, skipping one given up, and removing what a failed fetch left."""

    def __init__(
        self,
        ctx: ChildContext,
        counters: DownloaderCounters,
        window: Window,
        download_log: DownloadLog,
        plan: EpochPlan,
        keeper: Keeper | None,
    ) -> None:
        self.ctx = ctx
        self.config: Config = ctx.config
        self.layout = layout = ctx.layout
        self.counters = counters
        self.window = window
        self.download_log = download_log
        self.plan = plan
        self.keeper = keeper
        self.results: queue.SimpleQueue[Job] = queue.SimpleQueue()  # C; no Condition per put
        self.meta_written: set[str] = set()  # names whose meta a transfer thread wrote
        self.owed: list[Job] = []  # logged, not yet in ready/: the disk was full (settle_owed)
        self.unverified_reasons: set[str] = set()  # logged once each
        # Joined per object as text: a pathlib join and its str() cost more than the syscall.
        self._ready_dir = str(layout.cache_ready)
        self._meta_dir = f"{layout.cache_meta}/"
        self._mixed = self.config.mixed  # a property: read once, not per object
        self.spares = Spares.shared(layout.cache_tmp)  # the writers' emptied files, for metas

    def transfer_done(self, job: Job) -> None:
        """The transfer's ``done``, on one of its threads: write a fetched object's meta there,
        in parallel, so the main loop that feeds every request spends less of its time on file
        creates (each one gives up the GIL and waits to get it back from 32 busy threads).
        A meta without its object is swept at start-up, so writing it early is safe."""
        if job.error is None:
            try:
                self.write_meta(job)
                self.meta_written.add(job.name)
            except OSError:
                pass  # publish writes it again, and fails loudly if it must
        self.results.put(job)

    def write_meta(self, job: Job) -> None:
        # A first write needs no temp name + rename (one of ~6 syscalls per object), and takes
        # a spare inode where a writer left one (spares.py) instead of a new one: a writer
        # opens a meta only once its object is in ready/, after this returned (the order
        # in the module docstring), and a first meta left partial by a crash belongs to an
        # object not yet logged, which the start-up sweep removes. A meta that exists (a
        # refetch of a logged object, rewritten once verified) is replaced atomically: a crash
        # must not leave a logged object with a partial meta.
        path = f"{self._meta_dir}{job.name}{META_SUFFIX}"  # layout.meta_file's, inline
        data = render_meta(job, self._mixed)
        if not self.spares.write_new(path, data):
            write_atomic(Path(path), data)

    def try_publish(self, job: Job) -> OSError | None:
        """Publish; a full cache disk (ENOSPC) before the log line is returned as the job's
        error, to be retried after a pause like a store error — the object was not logged, so
        nothing is lost. Once logged, the object is published, as a restart would roll it
        forward: a full disk then only delays its rename into ``ready/`` (``owed``, rolled
        forward by ``settle_owed``) or its epoch's marker (``EpochPlan.markers_owed``), and
        never undoes it (its meta deleted under an object in ``ready/``, a second copy
        fetched). One function per object, not a wrapper and the steps: each call is per small
        object (issue 28)."""
        name = job.name
        try:
            meta_written = self.meta_written
            if name in meta_written:  # by transfer_done, after verifying (records_ok)
                meta_written.discard(name)
            else:
                self.write_meta(job)
            self.download_log.append(job.epoch, name, PUBLISHED)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            Path(self.layout.meta_file(name)).unlink(missing_ok=True)
            return exc
        if self.keeper is not None:  # keeping stops by itself on a full disk (keeper.py)
            room = self.window.limit - self.window.used
            self.keeper.downloaded(job.epoch, job.obj, job.tmp, max(0, room), job.source)
        self._roll_forward(job)
        return None

    def _roll_forward(self, job: Job, *, again: bool = False) -> None:
        """The logged ``job`` renamed into ``ready/`` and counted; kept in ``owed`` if the
        rename finds the disk full (a directory that needs another block), said once."""
        try:
            os.rename(job.tmp, f"{self._ready_dir}/{job.name}")
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            if not again:
                log.warning(
                    "the cache disk is full: %s is downloaded and logged, and goes into "
                    "ready/ once there is room (%s)",
                    job.name,
                    exc.strerror,
                )
            self.owed.append(job)
            return
        obj = job.obj
        counters = self.counters
        counters["objects_downloaded"] += 1
        counters["bytes_downloaded"] += obj.size
        figures = self.plan.figures  # SourceFigures.published's, inline
        figures.objects[job.source] += 1
        figures.bytes[job.source] += obj.size
        self.plan.mark_done(job)  # a marker a full disk holds back: EpochPlan.markers_owed

    def settle_owed(self) -> None:
        """Try again what a full disk held back after the log line: the renames into
        ``ready/`` (in their order), then the epochs' markers. The loop calls this while any
        is owed, and is not finished before none is."""
        owed, self.owed = self.owed, []
        for job in owed:
            self._roll_forward(job, again=True)
        plan = self.plan
        for epoch in sorted(plan.markers_owed):
            plan.maybe_mark_downloaded(epoch)

    def note_unverified(self, job: Job) -> None:
        """Count an object published with only its size checked; say why once per reason."""
        if job.unverified is None:
            return
        self.counters["objects_unverified"] += 1
        if job.unverified not in self.unverified_reasons:
            self.unverified_reasons.add(job.unverified)
            log.warning(
                "objects like s3://%s/%s are checked for size only: %s",
                self.config.sources[job.source].bucket,
                job.obj.key,
                job.unverified,
            )

    def skip(self, job: Job, reason: str) -> None:
        """Give ``job`` up for this epoch: say why, log it as skipped, free its room."""
        self.window.release(job.name)  # given up: the room it kept for a retry (discard)
        key = escape_key(job.obj.key)
        bucket = self.config.sources[job.source].bucket
        log.error("skipping s3://%s/%s: %s", bucket, key, reason)
        self.ctx.error(job.obj.key, reason)
        self.counters["errors"] += 1
        self.counters["objects_skipped"] += 1
        self.counters["bytes_skipped"] += job.obj.size
        tombstone = self.config.epochs.order == REPLAYABLE
        if tombstone:
            self._write_tombstone(job)
        self.download_log.append(job.epoch, job.name, SKIPPED)
        if tombstone:  # after the log line: a restart rolls a logged .part forward
            os.rename(job.tmp, f"{self._ready_dir}/{job.name}")
        self.plan.mark_done(job)

    def _write_tombstone(self, job: Job) -> None:
        """In the replayable order a skipped object still takes its turn: an empty file with a
        meta that says it was skipped, which the writer drops unread (write/replay.py)."""
        meta = {"key": job.obj.key, "epoch": job.epoch, "skipped": True}
        self.meta_written.discard(job.name)
        write_atomic(Path(self.layout.meta_file(job.name)), json.dumps(meta).encode())
        with open(job.tmp, "wb"):
            pass

    def discard(self, job: Job) -> None:
        """Remove what a failed fetch left. Its room in the window stays reserved until the
        object is published or skipped: a retry that gave it up could find the window full of
        later objects — of the next epoch, which writers hold until this one ends — and wait
        for ever (the soak's stall)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(job.tmp)
        if job.name in self.meta_written:  # written early by transfer_done, now not wanted
            self.meta_written.discard(job.name)
            Path(self.layout.meta_file(job.name)).unlink(missing_ok=True)
