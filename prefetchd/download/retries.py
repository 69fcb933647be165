"""What happens to a fetch that failed: fetched again (now, or after a pause), or skipped.

A corrupt copy is fetched again: skipped after ``MAX_INTEGRITY_ATTEMPTS`` corrupt fetches when
the last two hashed the same (the store holds those bytes: fetching again cannot help), after
``MAX_CORRUPT_FETCHES`` when each was corrupt in its own way (something on the way flips bits
now and then: a few percent of fetches of a large object can be hit, and three in a row is then
an everyday event in a big dataset). An object of another size is fetched again at its real
size; a fault retrying may fix (throttling, 5xx, a full cache disk, a store
down for everyone) pauses every download with a growing backoff; an object that cannot be
fetched (deleted, overwritten, forbidden while the bucket lists) or that keeps failing while
the store serves others is skipped for the epoch.

A pause for store errors or refused credentials ends early once the probe (``probe.py``) gets
an answer: after an outage of any length downloads resume within about a second of the store
answering again, not at the end of a backoff that grew for minutes. Refused credentials
(ExpiredToken, InvalidAccessKeyId, SignatureDoesNotMatch...) are resolved again for every probe
(files re-read); once the store takes them the transfer signs with them
(``refresh_credentials``) and downloads resume, nothing skipped. A pause for throttling is not
probed (the store answers, and asked for less) and a full cache disk has nothing to ask the
store.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from prefetchd.budget import Window
from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.download.jobs import Job
from prefetchd.download.probe import Probe
from prefetchd.download.publish import Publisher
from prefetchd.download.store import (
    Fault,
    S3Client,
    bucket_readable,
    classify,
    describe,
    is_throttling,
    make_client,
)
from prefetchd.download.verify import IntegrityError, SizeChanged
from prefetchd.logs import escape_key
from prefetchd.messages.counters import DownloaderCounters

log = logging.getLogger(__name__)

MAX_INTEGRITY_ATTEMPTS = 3  # corrupt fetches, the last two alike: the store's bytes are bad
MAX_CORRUPT_FETCHES = 6  # corrupt fetches, each its own way: bounded all the same
BACKOFF_MAX = 60.0
PROBE_INTERVAL = 10.0  # seconds a "can we still list the bucket?" answer is trusted
UNREACHABLE_AFTER = 60.0  # seconds of nothing but store errors before status says so


class Retries:
    """Owns the failed fetches: the queue of jobs to fetch again with the time each is due
    (``queue``), the pause every download takes after a store fault (``paused_until``, the
    growing backoff of ``consecutive_faults``, the reason status shows), and the decision to
    skip an object retrying cannot fix (``failed``)."""

    def __init__(
        self,
        ctx: ChildContext,
        counters: DownloaderCounters,
        window: Window,
        publisher: Publisher,
    ) -> None:
        self.ctx = ctx
        self.config: Config = ctx.config
        self.counters = counters
        self.window = window
        self.publisher = publisher
        self.queue: list[tuple[float, Job]] = []
        self.consecutive_faults = 0  # reset by every object published
        self.faults_since = 0.0  # monotonic time of the first of the consecutive faults
        self.paused_until = 0.0
        self.paused_at = 0.0  # monotonic time of the last fault that paused downloads
        self.pause_reason: str | None = None
        self.pause_kind = ""  # "store" | "denied" | "throttled" | "disk"
        # A pause was ended by the probe since the last object published: the next one is
        # waited out (a store whose listing answers while its GETs fail must not be asked
        # again every second).
        self.ended_early = False
        self.probe: Probe | None = None  # set by the downloader with its signals
        # The transfer's, once it exists: called when fresh credentials work again.
        self.refresh_credentials: Callable[[], None] = lambda: None
        self._probe_client: S3Client | None = None
        self._probed: tuple[float, bool] = (-PROBE_INTERVAL, False)  # (when, readable)

    def retry(self, job: Job, *, delay: float, count_attempt: bool = True) -> None:
        if count_attempt:
            job.attempt += 1
        job.next_part = 0
        self.queue.append((time.monotonic() + delay, job))

    def next_due(self, now: float) -> Job | None:
        for i, (due, job) in enumerate(self.queue):
            if due <= now:
                del self.queue[i]
                return job
        return None

    def prefer_held(self, waiting: Job, now: float) -> Job:
        """A job that waits for room gives way to a due retry that still holds its own room: a
        later object, perhaps of the next epoch, must never wait in front of an earlier one
        whose room is kept for it (``Publisher.discard``), or neither would ever start. The
        job put back is taken again as a retry due now, before any new job."""
        for i, (due, job) in enumerate(self.queue):
            if due <= now and job.name in self.window.held:
                self.queue[i] = (now, waiting)
                return job
        return waiting

    def failed(self, job: Job) -> None:
        """``job`` settled with ``job.error`` (and what it left is removed): fetch it again,
        at once or after a pause, or skip it."""
        error = job.error
        assert error is not None
        if isinstance(error, SizeChanged):
            self._resize(job, error)
            return
        if isinstance(error, IntegrityError):
            self.counters["integrity_failures"] += 1
            job.corrupt += 1
            limit = MAX_INTEGRITY_ATTEMPTS if error.repeated else MAX_CORRUPT_FETCHES
            if job.corrupt < limit:
                log.warning("re-fetching %s: %s", escape_key(job.obj.key), error)
                self.counters["retries"] += 1
                self.retry(job, delay=0.5)
            else:
                self.publisher.skip(job, f"corrupt after {job.corrupt} fetches: {error}")
            return
        fault = classify(error)
        if fault is Fault.FORBIDDEN:
            fault = Fault.PERMANENT if self._bucket_readable() else Fault.DENIED
        if fault is Fault.GONE:
            self.publisher.skip(job, "deleted after it was listed (404); skipped for this epoch")
        elif fault is Fault.CHANGED:
            self.publisher.skip(
                job, "overwritten after it was listed (412); skipped for this epoch"
            )
        elif fault is Fault.PERMANENT:
            self.publisher.skip(
                job, f"{describe(error)}; retrying cannot help: skipped for this epoch"
            )
        elif fault is Fault.TRANSIENT and self._given_up(job, error):
            self.publisher.skip(
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
        self.pause_kind = "denied" if fault is Fault.DENIED else "store"
        if fault is Fault.DENIED:
            reason = "access denied, waiting for valid credentials"
        elif is_throttling(error):
            self.pause_kind = "throttled"
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            reason = f"download.cache_dir {self.ctx.layout.cache} is full"
            self.pause_kind = "disk"
        elif now - self.faults_since >= UNREACHABLE_AFTER:
            reason = f"store unreachable for {now - self.faults_since:.0f}s, {reason}"
        self.pause_reason = f"{reason} ({describe(error)}), retrying in {delay:.0f}s"
        self.paused_until = now + delay
        self.paused_at = now
        key = escape_key(job.obj.key)
        log.warning("%s: %s; pausing downloads for %.0fs", key, describe(error), delay)
        self.ctx.error(job.obj.key, describe(error))
        self.counters["retries"] += 1
        self.retry(job, delay=delay, count_attempt=False)

    def ends_early(self, now: float) -> bool:
        """While paused: probe the store (store errors, refused credentials), and end the
        pause at once, every queued fetch due now, if it answered since the pause began - once
        per run of faults (``ended_early``, cleared by ``published``)."""
        probe = self.probe
        if probe is None or self.ended_early or self.pause_kind in ("throttled", "disk"):
            return False
        probe.kick(fresh=self.pause_kind == "denied")
        if probe.answered_at <= self.paused_at:
            return False
        if self.pause_kind == "denied":
            self.refresh_credentials()
            log.warning("the store takes the credentials resolved again; downloads resume")
        else:
            log.warning("the object store answers again; downloads resume")
        self.paused_until = now
        self.ended_early = True
        self.queue = [(min(due, now), job) for due, job in self.queue]
        return True

    def published(self) -> None:
        """An object was published: the store works, faults start counting afresh."""
        self.consecutive_faults = 0
        self.ended_early = False

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
            skip = f"its size changed on each of {job.attempt} fetches ({error})"
            self.publisher.skip(job, skip)
            return
        log.warning(
            "s3://%s/%s: %s (a stale source.manifest size?); fetching it again at its real size",
            self.config.sources[job.source].bucket,
            escape_key(job.obj.key),
            error,
        )
        job.obj = replace(job.obj, size=error.actual)
        job.part_size = None
        self.counters["retries"] += 1
        self.retry(job, delay=0, count_attempt=False)
