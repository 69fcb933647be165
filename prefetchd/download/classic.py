"""The classic transfer client: botocore ``get_object`` calls in a bounded thread pool.

Small objects are one GET each, many at once; objects larger than ``download.part_size`` are
split into ranged GETs that run in parallel and write into the same pre-sized file with
``pwrite``. ``download.concurrency`` bounds the requests in flight. boto3 does not check a
ranged download end to end, so every object is verified after it is assembled
(``verify.settle``: size, then MD5 ETag, TFRecord CRCs or S3 checksums, whichever covers it).
``download.client: crt`` selects ``crt.CrtTransfer`` instead, which keeps the same
contract and verifies through the same ``verify.Verifier``.

The client's hooks (``hooks.observe``) keep the request budget on every attempt and report
throttling and failures to the ``Signals``; the byte budget is kept here, before each GET, and
the adaptive limit through the slots (``slots.Slots``). ``refresh_credentials`` makes a new
client from the credential chain resolved again, after the store refused the old ones.
"""

from __future__ import annotations

import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import botocore.exceptions
import urllib3.exceptions

from prefetchd.budget import split_ranges
from prefetchd.config import Config
from prefetchd.download.hooks import trouble
from prefetchd.download.jobs import Done, Job
from prefetchd.download.signals import Signals
from prefetchd.download.slots import Slots
from prefetchd.download.store import S3Client, forget_credentials, make_client
from prefetchd.download.verify import IntegrityError, SizeChanged, Verifier, settle, stored_size
from prefetchd.layout import Layout
from prefetchd.spares import Spares

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
_STREAM_ATTEMPTS = 3
# Errors while reading a response body: botocore has already returned, so it will not retry them.
_STREAM_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)


class ClassicTransfer:
    """A bounded pool of ``get_object`` calls. ``done(job)`` is called once per job, from a
    transfer thread, with ``job.error`` set if the object could not be fetched."""

    def __init__(self, config: Config, done: Done, signals: Signals | None = None) -> None:
        self._config = config
        self._signals = signals or Signals.of(config)
        self._client: S3Client = make_client(config, signals=self._signals)
        self._done = done
        n = config.download.concurrency
        self._slots = Slots(n, self._signals.limit)
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="get")
        self._part_size = config.download.part_size
        self._bucket = config.source.bucket
        self._verifier = Verifier(self._client, self._bucket, config.source.format)
        self._spares = Spares.shared(Layout.of(config).cache_tmp)  # the writers' emptied files

    def prepare(self, job: Job) -> None:
        """Create the temp file and plan the parts of ``job`` (main thread)."""
        size = job.obj.size
        part = job.part_size or self._part_size
        job.ranges = split_ranges(size, part) if size > part else []
        job.next_part = 0
        job.parts_left = max(1, len(job.ranges))
        job.error = None
        job.retries = 0
        job.lookups = 0
        job.md5 = None
        job.fd = self._spares.create(job.tmp, readable=True)  # read back for the MD5
        if job.ranges:  # parts land out of order; a single GET only appends
            os.ftruncate(job.fd, size)

    def submit_parts(self, job: Job, timeout: float) -> bool:
        """Start as many of ``job``'s requests as slots allow; True once all are started."""
        if not job.ranges:
            if job.next_part == 0 and self._slots.acquire(timeout=timeout):
                job.next_part = 1
                self._pool.submit(self._run, job, None)
            return job.next_part >= 1
        while not job.all_submitted and self._slots.acquire(timeout=timeout):
            rng = job.ranges[job.next_part]
            job.next_part += 1
            self._pool.submit(self._run, job, rng)
            timeout = 0
        return job.all_submitted

    def poll(self, timeout: float) -> bool:
        """Nothing to settle here: this client's threads do (``Transfer.poll``)."""
        return False

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def refresh_credentials(self) -> None:
        """Sign later requests with the credential chain resolved again (files re-read)."""
        forget_credentials()
        self._client = make_client(self._config, signals=self._signals)
        self._verifier = Verifier(self._client, self._bucket, self._config.source.format)

    # --- transfer threads ---------------------------------------------------------------------

    def _run(self, job: Job, rng: tuple[int, int] | None) -> None:
        try:
            if job.error is None:
                self._fetch(job, rng)
        except BaseException as exc:  # carried to the caller in job.error, never swallowed
            with job.lock:
                job.error = job.error or exc
        finally:
            self._slots.release(1)
            with job.lock:
                job.parts_left -= 1
                last = job.parts_left == 0
            if last:
                self._finish(job)

    def _fetch(self, job: Job, rng: tuple[int, int] | None) -> None:
        args: dict[str, Any] = {"Bucket": job.bucket or self._bucket, "Key": job.obj.key}
        if job.obj.etag:
            args["IfMatch"] = f'"{job.obj.etag}"'
        start, expected = 0, job.obj.size
        if rng is not None:
            start, end = rng
            args["Range"] = f"bytes={start}-{end}"
            expected = end - start + 1
        self._signals.pacer.wait(0, expected)  # the byte budget; requests: hooks.observe
        for attempt in range(_STREAM_ATTEMPTS):
            resp = self._client.get_object(**args)
            with job.lock:
                job.retries += int(resp["ResponseMetadata"].get("RetryAttempts", 0))
            _check_size(job, resp, ranged=rng is not None)
            if rng is None and self._verifier.wants_md5(job):
                job.md5 = hashlib.md5(usedforsecurity=False)  # restart the running hash too
            try:
                self._stream(job, resp, start, expected)
                return
            except _STREAM_ERRORS as exc:
                self._signals.health.failed(trouble(exc))
                if attempt + 1 == _STREAM_ATTEMPTS:
                    raise
                with job.lock:
                    job.retries += 1
                log.debug("re-reading %s from byte %d after %s", job.obj.key, start, exc)

    def _stream(self, job: Job, resp: dict[str, Any], start: int, expected: int) -> None:
        length = int(resp.get("ContentLength", -1))
        if length != expected:
            raise IntegrityError(
                f"expected {expected} bytes at offset {start}, store sent {length}"
            )
        body = resp["Body"]
        offset, got = start, 0
        try:
            while chunk := body.read(_CHUNK):
                _pwrite_all(job.fd, chunk, offset)
                if job.md5 is not None:
                    job.md5.update(chunk)
                offset += len(chunk)
                got += len(chunk)
        finally:
            body.close()
        if got != expected:
            raise IntegrityError(f"body ended after {got} of {expected} bytes at offset {start}")

    def _finish(self, job: Job) -> None:
        try:
            settle(job, self._verifier)
        finally:
            self._done(job)


def _check_size(job: Job, resp: dict[str, Any], *, ranged: bool) -> None:
    """Raise ``SizeChanged`` before a byte is written if the store holds another size than
    listed: the window admitted the listed size, so a bigger object must be admitted again."""
    length = resp.get("ContentLength")
    actual = stored_size(resp.get("ContentRange"), None if ranged else length)
    if actual is not None and actual != job.obj.size:
        resp["Body"].close()
        raise SizeChanged(job.obj.size, actual)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """``pwrite`` may write less than asked (a disk filling up) without raising: write the rest,
    so a full disk ends in ENOSPC instead of a silent hole in the file."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
