"""Moving bytes from the store into local files with the C engine (``download.client: native``).

``prefetchd.kernel._http.Engine`` is one C thread running epoll over up to
``download.concurrency`` keep-alive HTTP/1.1 connections to the store (plain HTTP only: an
https endpoint is a ``ConfigError`` naming the key — use crt for https). It signs each GET
(SigV4, in C), writes the body with ``pwrite`` into the ``.part`` file ``prepare()`` created,
at the part's offset, and takes the body's CRC32 or CRC32C (whichever the response's
``x-amz-checksum-*`` header names) as it arrives. Python submits one request per part and
takes the finished ones in batches (issue 28: awscrt cost the daemon ~0.25 ms of Python per
small object, most of it per-request setup and a GIL hand-over per callback): made
``on_caller`` (the downloader's), on the thread that submits, in ``poll`` and while
``submit_parts`` waits for a slot, so one Python thread does an object's whole work and the
GIL is never handed between two busy threads (a thread of its own for completions cost ~9
futex calls per object, ``strace``); else on a thread of this transfer (``native-wait``).

- An object that fits in one part (``parts.object_part_size``) is one plain GET with
  ``x-amz-checksum-mode: ENABLED``; a FULL_OBJECT CRC it is answered with is compared with the
  CRC the engine took (``job.received``): verification reads nothing back. Larger objects are
  ranged GETs (``budget.split_ranges``), one slot each, on several connections; they are
  verified like the classic client's (``verify.settle``).
- The slots (``slots.Slots``) keep ``download.concurrency`` and the adaptive limit; the
  budgets (``Pacer``) count each request and its bytes before it is submitted, retries too.
- Retries: connection faults (refused, reset, closed mid-response, silent for
  ``IDLE_TIMEOUT``), 5xx and throttling are tried again up to ``download.retries`` times after
  an exponential backoff with jitter capped at ``hooks.MAX_RETRY_DELAY`` (2 s), counted in
  ``job.retries``; each attempt's outcome goes to the signals (``outcome.report_outcome``).
  What outlives them becomes ``job.error`` as ``store.classify()`` expects (``client_error``:
  the S3 XML Code; ``StoreConnectionError`` for no answer).
- A size other than the listed one is refused by the engine before a byte is written, and
  becomes ``SizeChanged`` (the downloader admits the real size and fetches again).
- Finishing (``verify.settle`` and ``done``) runs where completions are taken for an object
  verified without a request and at most ``INLINE_MAX`` bytes; anything else (a HEAD, hashing
  a large file) on ``FINISHERS`` threads, so that it does not hold up the other completions
  (made ``on_caller``, a finisher then ends the caller's wait: ``Engine.interrupt``).
- Credentials: botocore's chain (``store.session``), as for crt; refreshable ones are read
  again every ``CREDENTIALS_EVERY`` seconds and pushed to the engine when they changed (botocore
  renews them before they expire). Never logged.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import os
import random
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import botocore.exceptions
from botocore.credentials import Credentials, RefreshableCredentials

from prefetchd.budget import split_ranges
from prefetchd.config import Config
from prefetchd.download.checksums import response_checksum
from prefetchd.download.endpoint import Endpoint, endpoint_for, resolved_url
from prefetchd.download.finishers import Finishers
from prefetchd.download.hooks import MAX_RETRY_DELAY
from prefetchd.download.jobs import Done, Job
from prefetchd.download.outcome import client_error, report_outcome
from prefetchd.download.parts import object_part_size
from prefetchd.download.signals import Signals
from prefetchd.download.slots import Slots
from prefetchd.download.store import Fault, classify, forget_credentials, make_client
from prefetchd.download.store import session as store_session
from prefetchd.download.verify import IntegrityError, SizeChanged, Verifier, settle, stored_size
from prefetchd.errors import ConfigError
from prefetchd.kernel import _http, choice
from prefetchd.layout import Layout
from prefetchd.logs import redact_url
from prefetchd.spares import Spares

log = logging.getLogger(__name__)

DEFAULT_REGION = "us-east-1"
CONNECT_TIMEOUT = 10.0  # seconds, like the classic and crt clients
IDLE_TIMEOUT = 60.0  # seconds without a byte of an answer: botocore's read timeout
SHUTDOWN_WAIT = 15.0  # seconds for cancelled requests to report, inside the supervisor's grace
FINISHERS = 4  # threads that verify what needs a HEAD or hashing a large file
INLINE_MAX = 1024 * 1024  # the largest object finished on the native-wait thread
CREDENTIALS_EVERY = 1.0  # seconds between looks at refreshable credentials
WAIT = 0.2  # the longest native-wait sleeps in the engine when nothing is due
# Made on_caller: completions are gathered (``Engine.wait``'s ``least`` and ``hold``) so that a
# wake of the caller carries several objects behind a network that spreads them out in time
# (one wake per object cost the downloader ~0.14 ms per small object more paced than on
# loopback: futex, context switch, cold caches; issue 28); meanwhile the requests queued in the
# engine beyond the wire's limit keep every connection busy. At most QUEUED_MAX queued, half
# of download.concurrency (so a small concurrency keeps few files prepared ahead), and a wake
# waits for half of those or for HOLD seconds, whichever comes first.
QUEUED_MAX = 16
HOLD = 0.004

# What the engine's errno means when the store did not answer (a fault to retry).
_NETWORK = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset by the store",
    errno.ECONNABORTED: "connection closed mid-response",
    errno.EPIPE: "connection closed (broken pipe)",
    errno.ETIMEDOUT: "timed out waiting for the store",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.EPROTO: "malformed HTTP response",
    errno.E2BIG: "HTTP response headers too large",
}

if (_address := choice.crc32c_address()) is not None:  # without it, CRC32C answers read back
    _http.set_crc32c(_address)


class StoreConnectionError(ConnectionError):
    """No (whole) answer from the store: ``errno`` says why, in words ``hooks.trouble`` knows."""


@dataclass(eq=False)
class _Part:
    """One GET of a job: its whole object (``ranged`` False) or the bytes ``start`` ..
    ``start + length - 1``; the engine's tag for it."""

    job: Job
    start: int
    length: int
    ranged: bool
    attempts: int = 0  # retries so far
    settled: bool = False  # counted in its job's parts_left (never twice)


class NativeTransfer:
    """GETs on one ``_http.Engine``. Owns the engine, the settling of its completions (retries,
    credentials too: on the caller's thread made ``on_caller``, else on a ``native-wait``
    thread of its own), the finisher threads and the slots. ``done(job)`` is called once per
    job, where completions are settled or on a finisher thread, with ``job.error`` set if it
    was not fetched."""

    def __init__(
        self,
        config: Config,
        done: Done,
        signals: Signals | None = None,
        *,
        on_caller: bool = False,
    ) -> None:
        src, dl = config.source, config.download
        self._config = config
        self._signals = signals or Signals.of(config)
        self._done = done
        self._bucket = src.bucket
        self._part_size = dl.part_size
        self._concurrency = dl.concurrency
        self._retries = dl.retries
        queued = min(QUEUED_MAX, dl.concurrency // 2) if on_caller else 0
        self._slots = Slots(dl.concurrency + queued, self._signals.limit, extra=queued)
        self._gather = max(1, queued // 2)  # completions a wait of the caller gathers
        self._wire = dl.concurrency  # the engine's limit on requests on the wire
        self._held: set[int] = set()  # jobs holding a slot the budget has not let start yet
        self._spares = Spares.shared(Layout.of(config).cache_tmp)
        session = store_session(src.profile, src.region)
        region = src.region or session.get_config_variable("region") or DEFAULT_REGION
        self._credentials: Credentials | None = session.get_credentials()
        url = src.endpoint_url or resolved_url(session, region)
        resolved = "" if src.endpoint_url else url
        self._endpoint = endpoint_for(src.bucket, src.endpoint_url, resolved, src.addressing_style)
        if self._endpoint.tls:
            raise ConfigError(
                f"download.client: 'native' speaks plain HTTP only and the endpoint "
                f"{redact_url(url)!r} is https: use crt for https"
            )
        self._endpoints: dict[str, Endpoint] = {
            s.bucket: endpoint_for(s.bucket, src.endpoint_url, resolved, src.addressing_style)
            for s in config.sources
        }
        address, port = _address_of(url)
        self._engine = _http.Engine(
            address, port, dl.concurrency, CONNECT_TIMEOUT, IDLE_TIMEOUT, region
        )
        self._pushed: tuple[str, str, str | None] | None = None
        self._credentials_at = 0.0
        self._push_credentials()
        self._verifier = Verifier(
            make_client(config, pool=FINISHERS, signals=self._signals), src.bucket, src.format
        )
        self._finisher: Finishers[_Part] = Finishers(FINISHERS, "native-done")
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._parts = 0  # parts submitted and not settled (under _lock)
        self._closing = False
        self._due: list[tuple[float, int, _Part]] = []  # retries by time (the settling thread's)
        self._order = itertools.count()
        self._on_caller = on_caller
        self._stopped = False  # shut down: poll() has nothing more to settle
        self._thread: threading.Thread | None = None
        if not on_caller:
            self._thread = threading.Thread(target=self._wait_loop, name="native-wait", daemon=True)
            self._thread.start()

    # --- main thread --------------------------------------------------------------------------

    def prepare(self, job: Job) -> None:
        """Create the temp file of ``job`` and plan its parts (main thread)."""
        size = job.obj.size
        part = object_part_size(size, self._part_size, self._concurrency)
        job.ranges = split_ranges(size, part) if size > part else []
        job.next_part = 0
        job.parts_left = max(1, len(job.ranges))
        job.error = None
        job.retries = 0
        job.lookups = 0
        job.md5 = None
        job.answered = None
        job.received = None
        job.fd = self._spares.create(job.tmp, readable=True)
        if job.ranges:  # parts land out of order
            os.ftruncate(job.fd, size)

    def submit_parts(self, job: Job, timeout: float) -> bool:
        """Start as many of ``job``'s requests as slots and budgets allow; True once all are."""
        count = max(1, len(job.ranges))
        while job.next_part < count:
            if id(job) not in self._held:
                if not self._acquire(timeout):
                    return False
                self._held.add(id(job))
                timeout = 0
            part = self._part(job, job.next_part)
            if not self._budget_allows(part, timeout):
                return False
            self._held.discard(id(job))
            job.next_part += 1
            with self._lock:
                self._parts += 1
            self._send(part)
            timeout = 0
        return True

    def poll(self, timeout: float) -> bool:
        """Made ``on_caller``: settle the requests that finished, on this thread (``done`` is
        called here), waiting up to ``timeout`` seconds for a batch of them (gathered: see
        ``HOLD``); True. Else False at once: the ``native-wait`` thread settles them."""
        if not self._on_caller:
            return False
        if not self._stopped:
            self._round(timeout, self._gather, HOLD)
        return True

    def refresh_credentials(self) -> None:
        """Sign later requests with the credential chain resolved again (files re-read)."""
        forget_credentials()
        session = store_session(self._config.source.profile, self._config.source.region)
        self._credentials = session.get_credentials()
        self._push_credentials(force=True)
        client = make_client(self._config, pool=FINISHERS, signals=self._signals)
        self._verifier = Verifier(client, self._bucket, self._config.source.format)

    def shutdown(self) -> None:
        """Cancel what is queued or in flight, wait for every job's done(), stop the threads."""
        with self._lock:
            self._closing = True
        self._engine.cancel_all()
        if self._thread is None:  # on_caller: the cancelled requests are settled here
            self._settle_all()
        else:
            with self._idle:
                if not self._idle.wait_for(lambda: self._parts == 0, timeout=SHUTDOWN_WAIT):
                    log.warning("%d requests still running after %.0fs", self._parts, SHUTDOWN_WAIT)
            self._thread.join(timeout=SHUTDOWN_WAIT)
        self._stopped = True
        self._engine.close()
        self._finisher.shutdown()

    def _settle_all(self) -> None:
        """Settle on this thread until no part is left (``SHUTDOWN_WAIT`` at most)."""
        deadline = time.monotonic() + SHUTDOWN_WAIT
        while True:
            with self._lock:
                left = self._parts
            remaining = deadline - time.monotonic()
            if not left:
                return
            if remaining <= 0:
                log.warning("%d requests still running after %.0fs", left, SHUTDOWN_WAIT)
                return
            self._round(min(WAIT, remaining))

    def _acquire(self, timeout: float) -> bool:
        """A request slot, waiting up to ``timeout`` seconds; made ``on_caller``, the wait
        settles what finishes meanwhile (which is what frees slots)."""
        if not self._on_caller:
            return self._slots.acquire(timeout=timeout)
        deadline = 0.0
        while not self._slots.acquire(timeout=0):
            if timeout <= 0:
                return False
            now = time.monotonic()
            deadline = deadline or now + timeout
            if now >= deadline:
                return False
            self._round(deadline - now, self._gather, HOLD)
        return True

    def _part(self, job: Job, index: int) -> _Part:
        if not job.ranges:
            return _Part(job, 0, job.obj.size, ranged=False)
        start, end = job.ranges[index]
        return _Part(job, start, end - start + 1, ranged=True)

    def _budget_allows(self, part: _Part, timeout: float) -> bool:
        pacer = self._signals.pacer
        return not pacer.active or pacer.admit(1, part.length, timeout)

    def _send(self, part: _Part) -> None:
        """Hand ``part`` to the engine (or, without credentials, fail it off this thread)."""
        job = part.job
        if self._credentials is None:  # what botocore raises per request in the classic client
            with job.lock:
                job.error = job.error or botocore.exceptions.NoCredentialsError()
            self._finisher.submit(self._settle_elsewhere, part)
            return
        endpoint = self._endpoints.get(job.bucket, self._endpoint) if job.bucket else self._endpoint
        end = part.start + part.length - 1
        self._engine.submit(
            part,
            endpoint.host,
            endpoint.path(job.obj.key),
            job.fd,
            part.start,
            part.length,
            job.obj.size,
            range=f"bytes={part.start}-{end}" if part.ranged else None,
            if_match=f'"{job.obj.etag}"' if job.obj.etag else None,
            checksum_mode=not part.ranged,
        )

    # --- the native-wait thread ---------------------------------------------------------------

    def _wait_loop(self) -> None:
        while True:
            self._round(WAIT)
            with self._lock:
                if self._closing and self._parts == 0:
                    return

    def _round(self, timeout: float, least: int = 1, hold: float = 0.0) -> None:
        """Settle every completion the engine has once ``least`` are there or the oldest has
        waited ``hold`` seconds (waiting up to ``timeout`` seconds, less if a retry is due
        sooner), send the retries now due, push renewed credentials, give the engine the
        adaptive limit."""
        if self._due:
            timeout = max(0.0, min(timeout, self._due[0][0] - time.monotonic()))
        for done in self._engine.wait(timeout, least, hold):
            try:
                self._completed(done)
            except Exception as exc:  # never lose a part: it is settled with the error
                part: _Part = done.tag
                log.exception("finishing a GET of %s failed", part.job.obj.key)
                if not part.settled:
                    with part.job.lock:
                        part.job.error = part.job.error or exc
                    self._settle_part(part)
        if self._due:
            self._resend_due()
        if self._pushed is None or isinstance(self._credentials, RefreshableCredentials):
            self._push_credentials()
        allowed = self._signals.limit.allowed
        if allowed != self._wire:  # throttled, or recovering: on the wire, not just queued
            self._wire = allowed
            self._engine.set_limit(allowed)

    def _completed(self, done: _http.Completion) -> None:
        part: _Part = done.tag
        job = part.job
        error = self._error_of(part, done)
        if done.err != errno.ECANCELED:
            report_outcome(self._signals, error)
        if error is None:
            if not part.ranged:
                job.answered = response_checksum(done.headers, job.obj.etag)
                job.received = done.crc
            self._settle_part(part)
            return
        if self._retryable(error) and part.attempts < self._retries and not self._closing:
            part.attempts += 1
            with job.lock:
                job.retries += 1
            delay = min(MAX_RETRY_DELAY, random.uniform(0, 2.0 ** (part.attempts - 1)))
            heapq.heappush(self._due, (time.monotonic() + delay, next(self._order), part))
            log.debug("GET %s again in %.2fs after %s", job.obj.key, delay, error)
            return
        with job.lock:
            job.error = job.error or error
        self._settle_part(part)

    def _resend_due(self) -> None:
        """Send the retries whose backoff is over (and the budgets allow); when closing, end
        them with the error they had."""
        now = time.monotonic()
        while self._due and (self._due[0][0] <= now or self._closing):
            _, _, part = heapq.heappop(self._due)
            if self._closing:
                with part.job.lock:
                    part.job.error = part.job.error or OSError(errno.ECANCELED, "shut down")
                self._settle_part(part)
                continue
            wait = self._signals.pacer.delay(1, part.length) if self._signals.pacer.active else 0
            if wait > 0:
                heapq.heappush(self._due, (now + wait, next(self._order), part))
                return
            self._send(part)

    @staticmethod
    def _error_of(part: _Part, done: _http.Completion) -> BaseException | None:
        """What one attempt's completion means: None when its bytes all arrived."""
        status, err, written = done.status, done.err, done.written
        if err == 0 and 200 <= status < 300:
            if written != part.length:
                return IntegrityError(
                    f"body ended after {written} of {part.length} bytes at offset {part.start}"
                )
            return None
        if err == 0:
            return client_error(status, done.body)
        if err == errno.EMSGSIZE and status:
            return _size_error(part, done.headers)
        if err in _NETWORK:
            return StoreConnectionError(err, _NETWORK[err])
        return OSError(err, os.strerror(err))  # this side: a full disk, a cancel

    @staticmethod
    def _retryable(error: BaseException) -> bool:
        if isinstance(error, StoreConnectionError):
            return True
        return isinstance(error, botocore.exceptions.ClientError) and (
            classify(error) is Fault.TRANSIENT
        )

    def _settle_part(self, part: _Part) -> None:
        """``part`` is done (fetched or failed): its job's last one finishes the job."""
        part.settled = True
        job = part.job
        with job.lock:
            job.parts_left -= 1
            last = job.parts_left == 0
        if not last:
            self._slots.release(1)
            self._part_settled()
            return
        # A GET answered with a checksum of its own (job.answered) needs no request to verify:
        # said first, so that the common small object skips needs_request's own look.
        if job.error is not None or (
            job.obj.size <= INLINE_MAX
            and (job.answered is not None or not self._verifier.needs_request(job))
        ):
            self._finish(part)
            return
        try:
            self._finisher.submit(self._finish_elsewhere, part)
        except RuntimeError:  # shut down after waiting too long for this request
            self._finish(part)

    def _finish_elsewhere(self, part: _Part) -> None:
        """``_finish`` on a finisher thread, then ``_wake``."""
        try:
            self._finish(part)
        finally:
            self._wake()

    def _settle_elsewhere(self, part: _Part) -> None:
        """``_settle_part`` on a finisher thread, then ``_wake``."""
        try:
            self._settle_part(part)
        finally:
            self._wake()

    def _wake(self) -> None:
        """Made ``on_caller``: end the caller's wait in the engine, so that it takes the job a
        finisher settled (and its free slot) now, not at the wait's timeout."""
        if self._on_caller and not self._stopped:
            self._engine.interrupt()

    def _finish(self, last: _Part) -> None:
        """Verify the object of ``last`` (its job's last part), hand it over, then free the
        part's slot."""
        job = last.job
        try:
            settle(job, self._verifier)
        finally:
            try:
                self._done(job)
            finally:
                self._slots.release(1)
                self._part_settled()

    def _part_settled(self) -> None:
        with self._lock:
            self._parts -= 1
            if self._closing:
                self._idle.notify_all()

    def _push_credentials(self, force: bool = False) -> None:
        """Give the engine the credentials to sign with when they changed; refreshable ones
        are looked at every ``CREDENTIALS_EVERY`` seconds (botocore renews them in time)."""
        credentials = self._credentials
        if credentials is None:
            return
        now = time.monotonic()
        if not force and (
            self._pushed is not None
            and (
                not isinstance(credentials, RefreshableCredentials)
                or now - self._credentials_at < CREDENTIALS_EVERY
            )
        ):
            return
        self._credentials_at = now
        frozen = credentials.get_frozen_credentials()
        current = (frozen.access_key or "", frozen.secret_key or "", frozen.token)
        if current != self._pushed:
            self._engine.set_credentials(*current)
            self._pushed = current


def _size_error(part: _Part, headers: dict[str, str]) -> IntegrityError:
    """A 2xx the engine refused before writing: the store holds another size (``SizeChanged``),
    or answered a range with something else."""
    job = part.job
    length = headers.get("content-length", "")
    whole = None if part.ranged else (int(length) if length.isdigit() else None)
    actual = stored_size(headers.get("content-range"), whole)
    if actual is not None and actual != job.obj.size:
        return SizeChanged(job.obj.size, actual)
    return IntegrityError(
        f"expected {part.length} bytes at offset {part.start}, store sent {length or 'more'}"
    )


def _address_of(url: str) -> tuple[str, int]:
    """The numeric address and port the engine connects to (resolved once, here)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or 80
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(
            f"source.endpoint_url: cannot resolve {host!r} for download.client native: {exc}"
        ) from None
    return str(found[0][4][0]), port
