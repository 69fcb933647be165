"""Moving bytes from the store into local files with awscrt (``download.client: crt``).

``awscrt.s3.S3Client`` is used directly: boto3's ``preferred_transfer_client='crt'`` ignores
``endpoint_url`` (boto3/crt.py). Each object is one GET_OBJECT meta request; the CRT splits it into
ranged GETs (see ``part_size`` below) and runs them on its own event-loop threads, outside the
GIL. The CRT writes the body itself (``recv_filepath``), in order, into the ``.part`` file
``prepare()`` created exclusively (as the classic backend does, so the downloader's start-up
sweep stays valid) and keeps open for verification. No Python runs per body chunk: an
``on_body`` callback took the GIL, and the CRT copied every chunk into a new ``bytes`` for it,
per part (issue #12: small objects cost the daemon too much CPU each).

Verification is the classic backend's (``verify.settle``: for an MD5 ETag, the file read back
and hashed). An object verified without a request and at most ``INLINE_MAX`` bytes is finished
on the event-loop thread that reported it, in its ``on_done``: handing it to another thread
cost more GIL hand-overs (futex calls) than the work itself. Any other object goes to
``FINISHERS`` threads of this transfer, with a botocore client of its own for the HEADs it
may need, so that neither a HEAD nor hashing a large file holds up an event loop.

CRT settings, and why:

- ``max_active_connections_override``: ``download.concurrency`` on the client, and on each
  request the slots its object holds (one per part, at most ``concurrency``), so requests in
  flight never exceed ``download.concurrency`` — the same bound the classic backend keeps.
- ``part_size``: ``download.part_size`` on the client; on each request the object's own part
  size (``parts.object_part_size``): finer for objects that would otherwise take only a few
  connections, so one object takes them all and objects complete early and in order.
- A ``Range`` header for the whole object (its size is known from the listing): the CRT then
  starts every part at once instead of fetching part 1 alone first to learn the size.
- An object that fits in one part is one plain GET (``S3RequestType.DEFAULT``, no Range) with
  ``x-amz-checksum-mode: ENABLED``: the store answers with the whole object's checksum (S3: what
  it stores for every object; SeaweedFS: the CRC32 boto3 uploads with), and verification checks
  that CRC instead of hashing the file with MD5 (``verify``). A GET_OBJECT meta request cannot
  do this in one request: without a Range it asks for part 1 as a range (no checksum), and its
  own full-object validation sends a HEAD first.
- ``memory_limit``: max(256 MiB, 2 x concurrency x part_size). The CRT buffers whole parts; its
  default (2 GiB and up) follows ``throughput_target_gbps``, not what this daemon is told to
  hold. 256 MiB is the least the CRT accepts.
- ``throughput_target_gbps``: left at the default; it only sizes connections and memory, both set
  explicitly above.
- ``retry_config``: STANDARD mode (exponential backoff, retry token bucket) with
  ``download.retries`` retries, or NONE when it is 0 — the CRT's counterpart of botocore's
  "standard" mode in the classic backend. What survives it is turned into the errors
  ``store.classify()`` knows. The longest backoff is 2 s, not the CRT's 20 s: ``cancel()``
  does not cut a backoff short, and a request sleeping 20 s at a time waits out most of a short
  outage after it ended (the classic client's cap is the same, ``hooks.MAX_RETRY_DELAY``); the
  longer waits are the downloader's pause, which a probe ends once the store answers.

The signals (``signals.py``): the slots keep the adaptive limit (an object takes at most
``limit.allowed`` of them); before an object starts, its requests (one per part) and bytes are
counted against the budgets (``Pacer.delay``: the main loop tries again later, it never sleeps
longer than its ``timeout``); each object's outcome goes to the adaptive limit and
``StoreHealth``. The CRT retries inside and does not report single attempts: throttling it rode
out is not seen, only what outlived its retries, and the probe (``probe.py``) tells an outage
while requests hang in its retries. ``refresh_credentials`` resolves the chain again and signs
later requests with a provider made from the new credentials.
- ``connect_timeout_ms``: 10 s, like the classic client.
- No CRT checksum validation: ranged parts carry no checksum, and the full-object mode may add a
  HeadObject per object; ``verify.Verifier`` checks every object like the classic backend, with
  a request only for objects that neither the GET's checksum, an MD5 ETag nor TFRecord CRCs
  cover.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import awscrt.auth
import awscrt.exceptions
import awscrt.http
import awscrt.io
import awscrt.s3
import botocore.exceptions
import botocore.session
from botocore.credentials import RefreshableCredentials

from prefetchd.config import Config
from prefetchd.download.checksums import response_checksum
from prefetchd.download.endpoint import endpoint_for, resolved_url
from prefetchd.download.finishers import Finishers
from prefetchd.download.jobs import Done, Job
from prefetchd.download.outcome import client_error, report_outcome
from prefetchd.download.parts import object_part_size, slots_for
from prefetchd.download.signals import Signals
from prefetchd.download.slots import Slots
from prefetchd.download.store import forget_credentials, make_client
from prefetchd.download.store import session as store_session
from prefetchd.download.verify import SizeChanged, Verifier, settle, stored_size
from prefetchd.layout import Layout
from prefetchd.spares import Spares

log = logging.getLogger(__name__)

DEFAULT_REGION = "us-east-1"
CONNECT_TIMEOUT_MS = 10_000
MIN_MEMORY_LIMIT = 256 * 1024**2  # the CRT refuses less
MAX_BACKOFF_S = 2  # a cancelled request still sits out its backoff before it reports
SHUTDOWN_WAIT = 15.0  # seconds for cancelled requests to report, inside the supervisor's grace
FINISHERS = 4  # threads that verify and hand over objects: a HEAD must not hold up the rest
# The largest object finished on an event-loop thread (``_finishes_inline``): hashing 1 MiB
# holds that loop's other connections up for about 2 ms.
INLINE_MAX = 1024 * 1024

STARTED = -1  # job.next_part once its request is made
_CRT_CODES = {
    "AWS_ERROR_S3_SLOW_DOWN": ("SlowDown", 503),
    "AWS_ERROR_S3_INTERNAL_ERROR": ("InternalError", 500),
}


@dataclass
class _Fetch:
    """One object's meta request, kept referenced until the CRT reports it done."""

    job: Job
    slots: int
    part: int  # its part size (``_object_part_size``)
    request: Any = None
    # Set on an event-loop thread when the response says the object is not the listed size:
    # the request is cancelled before its body is delivered, and this becomes job.error.
    refused: BaseException | None = None


class CrtTransfer:
    """GET_OBJECT meta requests on one ``awscrt.s3.S3Client``. ``done(job)`` is called once per
    job, from a thread of this transfer, with ``job.error`` set if the object was not fetched."""

    def __init__(self, config: Config, done: Done, signals: Signals | None = None) -> None:
        src, dl = config.source, config.download
        self._config = config
        self._signals = signals or Signals.of(config)
        self._done = done
        self._bucket = src.bucket
        self._part_size = dl.part_size
        self._concurrency = dl.concurrency
        self._slots = Slots(dl.concurrency, self._signals.limit)
        self._provider: Any = None  # after refresh_credentials: signs every request
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._active: dict[int, _Fetch] = {}
        self._draining = False  # shutdown() waits for _active to empty (under _lock)
        self._spares = Spares.shared(Layout.of(config).cache_tmp)  # the writers' emptied files
        # Verification and done() run here, never on a CRT event-loop thread.
        self._finisher: Finishers[_Fetch] = Finishers(FINISHERS, "crt-done")
        self._verifier = Verifier(
            make_client(config, pool=FINISHERS, signals=self._signals),
            src.bucket,
            config.source.format,
        )
        # botocore resolves region and credentials as the classic backend does (source.profile,
        # env, config files, SSO, instance roles) and refreshes temporary credentials, which the
        # CRT asks for on every signing (_credential_provider). They are never logged. The
        # process's one session (store.session): its S3 model is already loaded by the listing,
        # so resolving the endpoint does not parse it again.
        session = store_session(src.profile, src.region)
        region = src.region or session.get_config_variable("region") or DEFAULT_REGION
        self._credentials = session.get_credentials()
        resolved = "" if src.endpoint_url else resolved_url(session, region)
        self._endpoint = endpoint_for(
            self._bucket, src.endpoint_url, resolved, src.addressing_style
        )
        # Each bucket's endpoint (several sources may name several buckets of one store).
        self._endpoints = {
            s.bucket: endpoint_for(s.bucket, src.endpoint_url, resolved, src.addressing_style)
            for s in config.sources
        }
        provider = self._credential_provider()
        self._client = awscrt.s3.S3Client(
            region=region,
            signing_config=awscrt.s3.create_default_s3_signing_config(
                region=region, credential_provider=provider
            ),
            tls_mode=(
                awscrt.s3.S3RequestTlsMode.ENABLED
                if self._endpoint.tls
                else awscrt.s3.S3RequestTlsMode.DISABLED
            ),
            tls_connection_options=_tls_options(session) if self._endpoint.tls else None,
            part_size=dl.part_size,
            memory_limit=max(MIN_MEMORY_LIMIT, 2 * dl.concurrency * dl.part_size),
            max_active_connections_override=dl.concurrency,
            retry_config=_retry_config(dl.retries),
            connect_timeout_ms=CONNECT_TIMEOUT_MS,
        )

    def prepare(self, job: Job) -> None:
        """Create the temp file of ``job`` (main thread)."""
        job.ranges = []  # the CRT plans the parts itself
        job.next_part = 0  # here: concurrency slots taken so far
        job.parts_left = 1
        job.error = None
        job.retries = 0  # the CRT does not report its retries to Python
        job.lookups = 0
        job.md5 = None  # the CRT writes the file: verification reads it back
        job.answered = None
        # Created here, exclusively and private (from a spare inode where a writer left one:
        # spares.py); the CRT opens the same name to write it and this descriptor stays open to
        # verify what it wrote.
        job.fd = self._spares.create(job.tmp, readable=True)

    def submit_parts(self, job: Job, timeout: float) -> bool:
        """Take ``job``'s slots as they free up (at most as many as the adaptive limit
        allows), then start it once the budgets allow; True once it is started."""
        if job.next_part == STARTED:
            return True
        part = self._object_part_size(job)  # once per call: the slots, budget and request
        need = min(
            slots_for(job.obj.size, part, self._concurrency),
            max(1, self._signals.limit.allowed),
        )
        while job.next_part < need and self._slots.acquire(timeout=timeout):
            job.next_part += 1
            timeout = 0
        if job.next_part < need or not self._budget_allows(job, part, timeout):
            return False
        slots, job.next_part = job.next_part, STARTED
        self._start(_Fetch(job, slots, part))
        return True

    def poll(self, timeout: float) -> bool:
        """Nothing to settle here: this client's threads do (``Transfer.poll``)."""
        return False

    def refresh_credentials(self) -> None:
        """Sign later requests with the credential chain resolved again (files re-read)."""
        forget_credentials()
        session = store_session(self._config.source.profile, self._config.source.region)
        self._credentials = session.get_credentials()
        self._provider = self._credential_provider()
        client = make_client(self._config, pool=FINISHERS, signals=self._signals)
        self._verifier = Verifier(client, self._bucket, self._config.source.format)

    def shutdown(self) -> None:
        """Cancel what is in flight, wait for every job's done(), stop the finisher thread."""
        with self._lock:
            requests = [f.request for f in self._active.values() if f.request is not None]
        for request in requests:
            request.cancel()
        with self._idle:
            self._draining = True
            if not self._idle.wait_for(lambda: not self._active, timeout=SHUTDOWN_WAIT):
                log.warning(
                    "%d downloads still running after %.0fs", len(self._active), SHUTDOWN_WAIT
                )
        self._finisher.shutdown()

    # --- main thread --------------------------------------------------------------------------

    def _budget_allows(self, job: Job, part: int, timeout: float) -> bool:
        """Whether ``job``'s requests (one per ``part`` bytes) and bytes fit the budgets now,
        waiting up to ``timeout`` for them (``Pacer.admit``)."""
        pacer = self._signals.pacer
        if not pacer.active:
            return True
        size = job.obj.size
        return pacer.admit(max(1, -(-size // part)), size, timeout)

    def _object_part_size(self, job: Job) -> int:
        """Parts of this object: ``download.part_size``, or finer so that one object can take
        every connection (``object_part_size``)."""
        return object_part_size(job.obj.size, self._part_size, self._concurrency)

    def _start(self, fetch: _Fetch) -> None:
        job = fetch.job
        with self._lock:
            self._active[id(job)] = fetch
        if self._credentials is None:  # what botocore raises per request in the classic backend
            job.error = botocore.exceptions.NoCredentialsError()
            self._finisher.submit(self._finish, fetch)
            return
        endpoint = self._endpoints.get(job.bucket, self._endpoint) if job.bucket else self._endpoint
        headers = awscrt.http.HttpHeaders([("Host", endpoint.host)])
        if job.obj.etag:
            headers.add("If-Match", f'"{job.obj.etag}"')
        kind, part = awscrt.s3.S3RequestType.GET_OBJECT, fetch.part
        if 0 < job.obj.size <= part:
            # One plain GET, answered with the object's checksum (a CRC to check, not an MD5).
            kind = awscrt.s3.S3RequestType.DEFAULT
            headers.add("x-amz-checksum-mode", "ENABLED")
        elif job.obj.size:
            # The whole object as an explicit range: the CRT then starts every part at once,
            # instead of fetching part 1 alone to learn the size the listing already gave.
            headers.add("Range", f"bytes=0-{job.obj.size - 1}")
        try:
            fetch.request = self._client.make_request(
                type=kind,
                operation_name="GetObject",
                request=awscrt.http.HttpRequest("GET", endpoint.path(job.obj.key), headers),
                max_active_connections_override=fetch.slots,
                credential_provider=self._provider,
                part_size=part,
                recv_filepath=str(job.tmp),
                on_headers=functools.partial(self._on_headers, fetch),
                on_done=functools.partial(self._on_done, fetch),
            )
        except Exception as exc:  # carried to the caller in job.error
            job.error = exc
            self._finisher.submit(self._finish, fetch)

    # --- CRT event-loop threads ---------------------------------------------------------------

    def _credential_provider(self) -> Any:
        """What the CRT signs with. Credentials that never change (environment, config file)
        are handed over once; refreshable ones (instance roles, SSO, assume-role) through a
        delegate the CRT calls on every signing, so each request gets fresh ones. The
        delegate costs a call into Python, and the GIL, per request: per small object."""
        credentials = self._credentials
        if credentials is None or isinstance(credentials, RefreshableCredentials):
            return awscrt.auth.AwsCredentialsProvider.new_delegate(self._crt_credentials)
        frozen = credentials.get_frozen_credentials()
        return awscrt.auth.AwsCredentialsProvider.new_static(
            frozen.access_key, frozen.secret_key, frozen.token
        )

    def _crt_credentials(self) -> Any:
        assert self._credentials is not None
        frozen = self._credentials.get_frozen_credentials()
        return awscrt.auth.AwsCredentials(frozen.access_key, frozen.secret_key, frozen.token)

    def _on_headers(
        self, fetch: _Fetch, *, status_code: int, headers: list[tuple[str, str]], **_: Any
    ) -> None:
        """The first response's headers: the real size is checked before any body lands, so a
        stale listed size (or a store that ignores the Range and answers with a larger whole
        object) can never push the window (the bytes on disk) past its limit. A whole-object
        GET's checksum is kept for verification."""
        keep_thread_state()
        if status_code not in (200, 206):
            return
        job = fetch.job
        named = {name.lower(): value for name, value in headers}
        length = named.get("content-length", "")
        actual = stored_size(named.get("content-range"), int(length) if length.isdigit() else None)
        if actual is not None and actual != job.obj.size:
            self._refuse(fetch, SizeChanged(job.obj.size, actual))
        elif status_code == 200:
            job.answered = response_checksum(named, job.obj.etag)

    def _refuse(self, fetch: _Fetch, error: BaseException) -> None:
        """Stop writing ``fetch``'s bodies, and the request itself if it is started yet."""
        with fetch.job.lock:
            if fetch.refused is not None:
                return
            fetch.refused = error
        if fetch.request is not None:
            fetch.request.cancel()

    def _on_done(
        self,
        fetch: _Fetch,
        *,
        error: BaseException | None,
        status_code: int | None = None,
        error_body: bytes | None = None,
        **_: Any,
    ) -> None:
        keep_thread_state()
        job = fetch.job
        if fetch.refused is not None:
            job.error = fetch.refused  # whatever the cancelled request reports
        elif error is not None:
            job.error = store_error(error, status_code, error_body)
        report_outcome(self._signals, job.error)
        # A body shorter than the listed size fails verification (the file's size).
        if self._finishes_inline(job):
            self._finish(fetch)
            return
        try:
            self._finisher.submit(self._finish, fetch)
        except RuntimeError:  # shut down after waiting too long for this request
            self._finish(fetch)

    def _finishes_inline(self, job: Job) -> bool:
        """Whether ``job`` is finished on the event-loop thread that reported it: failed (only
        the file is closed), or small and verified without a request. A HEAD, or hashing a
        large file, goes to the finisher threads instead."""
        if job.error is not None:
            return True
        return job.obj.size <= INLINE_MAX and not self._verifier.needs_request(job)

    # --- finishing: on an event-loop thread (``_finishes_inline``) or a finisher thread ------

    def _finish(self, fetch: _Fetch) -> None:
        """Verify ``fetch``'s object, hand it over (``done``), then free its slots: the main
        loop, waiting for a slot, then wakes once and finds the object already handed over."""
        job = fetch.job
        try:
            settle(job, self._verifier)
        finally:
            try:
                self._done(job)
            finally:
                self._slots.release(fetch.slots)
                # The lock itself, not the Condition (a Python __enter__ per object); only
                # shutdown() waits on it.
                with self._lock:
                    self._active.pop(id(job), None)
                    if self._draining:
                        self._idle.notify_all()
                # The request's callbacks hold ``fetch``: a cycle only the cyclic GC would
                # free, after the in-flight ones were promoted to its oldest generation, whose
                # every collection then walked thousands of them. The CRT holds the request
                # itself until it is done.
                fetch.request = None


_kept = threading.local()


def keep_thread_state() -> None:
    """Keep the Python thread state of the CRT thread this runs on, from now on.

    The CRT's threads are not Python's: each call into Python (``on_headers``, ``on_done`` and
    the request's own shutdown, three per object) made a thread state and tore it down again —
    an allocation, a 16 KiB frame stack mapped, page faulted and unmapped, every time. One more
    ``PyGILState_Ensure``, never released, keeps it: later calls find it and only take the
    GIL. The CRT's event-loop threads are few and live as long as the process."""
    if not getattr(_kept, "held", False):
        ctypes.pythonapi.PyGILState_Ensure()
        _kept.held = True


def store_error(error: BaseException, status: int | None, body: bytes | None) -> BaseException:
    """A CRT failure as the error the classic backend would have raised, so
    ``store.classify()`` and ``store.describe()`` treat both backends alike."""
    # Throttling and 5xx that outlived the CRT's retries come as AWS_ERROR_S3_SLOW_DOWN /
    # AWS_ERROR_S3_INTERNAL_ERROR, often without the status: named as the store names them.
    crt_code, crt_status = _CRT_CODES.get(_crt_name(error), ("", 0))
    status = status or crt_status
    if status and (isinstance(error, awscrt.s3.S3ResponseError) or crt_code):
        return client_error(status, body, crt_code)
    if isinstance(error, awscrt.exceptions.AwsCrtError) and error.name.startswith(
        "AWS_AUTH_CREDENTIALS_PROVIDER"
    ):
        return botocore.exceptions.NoCredentialsError()
    if _crt_name(error) == "AWS_ERROR_NO_SPACE":
        # The CRT writes the file (recv_filepath): a full cache dir is the ENOSPC the
        # downloader pauses on, as when Python wrote it.
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return error


def _crt_name(error: BaseException) -> str:
    return error.name if isinstance(error, awscrt.exceptions.AwsCrtError) else ""


def _tls_options(session: botocore.session.Session) -> Any:
    """Default TLS, trusting the CA bundle botocore would (AWS_CA_BUNDLE, ca_bundle) if set."""
    bundle = session.get_config_variable("ca_bundle")
    if not bundle:
        return None
    options = awscrt.io.TlsContextOptions()
    options.override_default_trust_store_from_path(ca_filepath=str(bundle))
    return awscrt.io.ClientTlsContext(options).new_connection_options()


def _retry_config(retries: int) -> Any:
    if retries == 0:  # max_retries=0 would mean "the CRT default" (5)
        return awscrt.s3.S3RetryConfig(retry_mode=awscrt.s3.S3RetryMode.NONE)
    return awscrt.s3.S3RetryConfig(max_retries=retries, max_backoff_secs=MAX_BACKOFF_S)
