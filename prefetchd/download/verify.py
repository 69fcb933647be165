"""Verifying a downloaded object end to end before it is published (the I/O around
``checksums``); both transfer backends call ``settle`` after an object's last request.

The rule, cheapest first:

1. the size, always;
2. uncompressed ``tfrecord`` input: every record's CRC32C — no request, and ~20 times cheaper than
   an MD5 (if the CRCs fail, the object's whole checksum below decides between a re-fetch and
   corrupt input);
3. a FULL_OBJECT checksum the GET answered with (``job.answered``: the crt client asks for it
   on objects it fetches in one request; S3 stores one for every object uploaded since 2025,
   boto3 and SeaweedFS send CRC32): that CRC of the file — no request, and 4-30 times cheaper
   than the MD5 (~0.17 ms of a core per 118 KiB object, a third of what the whole download
   costs in the awscrt ceiling). The native client takes that CRC while the body arrives
   (``job.received``): then the file is not read back at all;
4. a plain MD5 ETag (single-part uploads): the MD5 of the file — no request;
5. anything else (multipart uploads, SSE-KMS): one HEAD with ``ChecksumMode=ENABLED`` learns
   the S3 additional checksum. A FULL_OBJECT checksum is checked over the file. A COMPOSITE
   checksum, or without any checksum the multipart ETag (MD5 of the part MD5s), needs the
   part sizes: a second HEAD with ``PartNumber=1`` gives part 1's size and the part count, the
   rest is inferred (``checksums.part_layout``) and asked for part by part only if it cannot
   add up, or when a re-fetch hashes to the same wrong digest (a wrong guess, not a flip).
   What was learnt is kept on the job, so a re-fetch asks again for nothing.

An object none of these cover (a KMS-encrypted multipart upload without a checksum, CRC64NVME
without awscrt) is published checked for size only, and ``job.unverified`` says why: the
downloader counts it (``objects_unverified``) and logs each reason once. Every HEAD is counted
in ``job.lookups`` (status ``verify_requests``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import botocore.exceptions

from prefetchd.download.checksums import (
    ALGORITHMS,
    MD5,
    Expected,
    StoredChecksum,
    composite,
    digest_of,
    is_plain_md5,
    multipart_etag,
    parse_checksum,
    part_layout,
    records_checked,
    unavailable,
)
from prefetchd.kernel import choice
from prefetchd.kernel.framing import FramingError

if TYPE_CHECKING:
    from prefetchd.download.jobs import Job
    from prefetchd.download.store import S3Client

log = logging.getLogger(__name__)

# Files are hashed through one buffer per thread, reused: a new buffer per read cost each small
# object an allocation, and its first touch page faults, on the CRT's event-loop threads.
_READ = 1024 * 1024
_buffers = threading.local()
_KMS = ("aws:kms", "aws:kms:dsse")  # their ETags are not MD5s of the bytes
_NO_PARTS = "the store does not tell the part sizes of multipart uploads"


class IntegrityError(Exception):
    """What arrived is not what the store holds (size or checksum); the object is re-fetched.
    ``repeated``: it hashed to the same wrong digest as the fetch before (the store holds those
    bytes, or something on the way changes them the same way every time)."""

    def __init__(self, message: str, *, repeated: bool = False) -> None:
        super().__init__(message)
        self.repeated = repeated


class SizeChanged(IntegrityError):
    """The store holds ``actual`` bytes, not the ``listed`` ones (a stale ``source.manifest``
    size, or an object replaced where no ETag pins it), learnt from the first response's
    headers: nothing past the listed size was written. The downloader admits the real size
    against ``download.window`` and fetches the object again."""

    def __init__(self, listed: int, actual: int) -> None:
        super().__init__(f"the store holds {actual} bytes, not the {listed} listed")
        self.listed = listed
        self.actual = actual


def stored_size(content_range: str | None, content_length: int | None) -> int | None:
    """The object's whole size from a GET's headers: the total of ``Content-Range``
    (``bytes 0-99/1234`` or ``bytes */1234``) for a ranged answer, else ``Content-Length``;
    None when neither tells (``bytes 0-99/*``)."""
    if content_range:
        total = content_range.rpartition("/")[2].strip()
        return int(total) if total.isdigit() else None
    return content_length if content_length is not None and content_length >= 0 else None


class Verifier:
    """Checks fetched objects against what the store says they hold. One per transfer backend;
    ``verify`` may run on several threads at once, each with its own job."""

    def __init__(self, client: S3Client, bucket: str, format: str) -> None:
        self._client = client
        self._bucket = bucket
        self._format = format

    def wants_md5(self, job: Job) -> bool:
        """Whether a running MD5 of the body will be used: a plain MD5 ETag, and no cheaper
        TFRecord CRC check."""
        obj = job.obj
        return is_plain_md5(obj.etag) and not records_checked(job.format or self._format, obj.key)

    def needs_request(self, job: Job) -> bool:
        """Whether ``verify(job)`` may ask the store (a HEAD): neither TFRecord CRCs, nor a
        checksum the GET answered with, nor a plain MD5 ETag cover the object, and what does was
        not learnt on an earlier fetch — or was, but that fetch hashed wrong and the part sizes
        may have to be confirmed (``_check``)."""
        obj = job.obj
        if records_checked(job.format or self._format, obj.key) or self._whole(job) is not None:
            return False
        return not job.looked_up or job.bad_digest is not None

    def verify(self, job: Job) -> None:
        """Check that ``job.fd`` (still open) holds the listed object. ``job.md5`` is a running
        MD5 of the whole body, or None to read the file back. Raises ``IntegrityError``, or the
        store's error if a HEAD fails (classified like a GET's)."""
        obj = job.obj
        size = os.fstat(job.fd).st_size
        if size != obj.size:
            raise IntegrityError(f"local file has {size} bytes, listing said {obj.size}")
        if records_checked(job.format or self._format, obj.key):
            self._check_records(job)
            return
        whole = self._whole(job)
        if whole is not None:
            self._check_whole(job, whole)
            return
        if not job.looked_up:
            found = self._lookup(job)
            job.looked_up = True
            if isinstance(found, Expected):
                job.expected = found
            else:
                job.unverified = found
        if job.expected is not None:
            self._check(job, job.expected)

    def _whole(self, job: Job) -> Expected | None:
        """What the whole object must hash to without asking the store: the FULL_OBJECT
        checksum its GET answered with (a CRC), else a plain MD5 ETag; None if neither is known."""
        answered = job.answered  # only ever one this process can compute
        if answered is not None:
            source = f"x-amz-checksum-{answered.algorithm.lower()} of the GET"
            return Expected(answered.algorithm, answered.digest, source)
        if is_plain_md5(job.obj.etag):
            assert job.obj.etag is not None
            return Expected(MD5, bytes.fromhex(job.obj.etag), "ETag")
        return None

    def _check_whole(self, job: Job, expected: Expected) -> None:
        if expected.algorithm == MD5 and job.md5 is not None:
            got = job.md5.digest()  # hashed as the body arrived (classic)
        elif job.received is not None and job.received[0] == expected.algorithm:
            got = job.received[1]  # the CRC taken as the body arrived (native)
        else:
            got = _file_digest(job.fd, expected.algorithm, None)
        _compare(job, expected, got)

    def _check_records(self, job: Job) -> None:
        """Every record's CRC (CRC32C: ~20 times cheaper than an MD5, which costs a core-second per
        GB). If they fail, the whole object's checksum (``_whole``), when there is one, tells a
        transfer fault (re-fetch) from an object stored that way: that one is published, and
        the writer quarantines it with its key in status like any corrupt input."""
        job.records_ok = False
        try:
            _check_frames(job.fd, job.obj.size)
            job.records_ok = True
        except FramingError as exc:
            whole = self._whole(job)
            if whole is None:
                what = str(exc)
                repeated, job.bad_frames = what == job.bad_frames, what
                message = f"TFRecord CRC check failed {exc}"
                raise IntegrityError(message, repeated=repeated) from None
            self._check_whole(job, whole)  # raises IntegrityError unless the store holds these

    # --- what the store says ------------------------------------------------------------------

    def _lookup(self, job: Job) -> Expected | str:
        """What ``job``'s bytes must hash to, or why nothing beyond their size can be checked."""
        obj = job.obj
        head = self._head(job, ChecksumMode="ENABLED")
        etag = multipart_etag(obj.etag)
        stored, unavailable = _stored_checksum(head, etag[1] if etag else None)
        if stored is not None and not stored.composite:
            source = f"x-amz-checksum-{stored.algorithm.lower()} (FULL_OBJECT)"
            return Expected(stored.algorithm, stored.digest, source)
        if stored is not None:
            parts = stored.parts or (etag[1] if etag else None)
            layout = self._layout(job, parts)
            if layout is None:
                return _NO_PARTS  # the ETag's composite would need them too
            source = f"x-amz-checksum-{stored.algorithm.lower()} (COMPOSITE)"
            return Expected(stored.algorithm, stored.digest, source, *layout)
        if etag is not None and not _encrypted(head):
            layout = self._layout(job, etag[1])
            if layout is not None:
                return Expected(MD5, etag[0], "multipart ETag", *layout)
            return _NO_PARTS
        if unavailable is not None:
            return unavailable
        return "no MD5 ETag (multipart or KMS-encrypted) and no S3 checksum"

    def _layout(self, job: Job, parts: int | None) -> tuple[tuple[int, ...], bool] | None:
        """``(part sizes, exact)`` of ``job``'s upload; None if the store will not say."""
        size = job.obj.size
        if parts == 1:
            return (size,), True
        try:
            head = self._head(job, PartNumber=1)
        except botocore.exceptions.ClientError as exc:
            if not _unsupported(exc):
                raise
            return None  # a store without ?partNumber: answered, not to be retried for ever
        count = int(head.get("PartsCount") or 0)
        if count < 1 or (parts is not None and count != parts):
            return None  # PartNumber ignored, or a part count that contradicts the ETag
        first = int(head["ContentLength"])
        inferred = part_layout(size, count, first)
        if inferred is not None:
            return inferred, count <= 2  # two parts: part 1 and the total fix the last one
        exact = self._part_sizes(job, count, first)
        return (exact, True) if exact is not None else None

    def _part_sizes(self, job: Job, count: int, first: int) -> tuple[int, ...] | None:
        """Every part's size, one HEAD each (only for unequal parts); None if they do not add
        up to the object's size."""
        sizes = [first]
        for number in range(2, count + 1):
            sizes.append(int(self._head(job, PartNumber=number)["ContentLength"]))
        return tuple(sizes) if sum(sizes) == job.obj.size else None

    def _head(self, job: Job, **extra: Any) -> dict[str, Any]:
        args: dict[str, Any] = {"Bucket": job.bucket or self._bucket, "Key": job.obj.key, **extra}
        # The same object the GETs fetched. Not on a part's HEAD: moto answers it with the
        # part's own ETag, so If-Match would fail (412) on an unchanged object. A part size
        # from a newer object only fails the check, and the re-fetch's If-Match then says 412.
        if job.obj.etag and "PartNumber" not in extra:
            args["IfMatch"] = f'"{job.obj.etag}"'
        job.lookups += 1
        reply: dict[str, Any] = self._client.head_object(**args)
        job.retries += int(reply.get("ResponseMetadata", {}).get("RetryAttempts", 0))
        return reply

    # --- the bytes ----------------------------------------------------------------------------

    def _check(self, job: Job, expected: Expected) -> None:
        got = _file_digest(job.fd, expected.algorithm, expected.parts)
        # The same wrong digest twice is likelier a wrong guess at the part sizes than the same
        # corruption twice: confirm them before blaming the bytes (a one-off flip costs nothing).
        if got != expected.digest and not expected.exact and got == job.bad_digest:
            exact = self._exact(job, expected)
            if exact.parts != expected.parts:
                got = _file_digest(job.fd, exact.algorithm, exact.parts)
            job.expected = expected = exact
        _compare(job, expected, got)

    def _exact(self, job: Job, expected: Expected) -> Expected:
        """``expected`` with its inferred part sizes confirmed part by part, so a mismatch is
        blamed on the bytes only once the layout is known to be right."""
        assert expected.parts is not None
        sizes = self._part_sizes(job, len(expected.parts), expected.parts[0])
        if sizes is None:
            raise IntegrityError(f"the parts the store reports do not add up to {job.obj.size}")
        return dataclasses.replace(expected, parts=sizes, exact=True)


def settle(job: Job, verifier: Verifier) -> None:
    """After the last request of ``job``: verify what arrived (unless a request already
    failed), record any failure in ``job.error``, and close the file."""
    try:
        if job.error is None:
            verifier.verify(job)
    except BaseException as exc:
        job.error = exc
    finally:
        os.close(job.fd)
        job.fd = -1


def _compare(job: Job, expected: Expected, got: bytes) -> None:
    if got == expected.digest:
        return
    repeated = got == job.bad_digest
    again = " (the same as the previous fetch)" if repeated else ""
    job.bad_digest = got
    raise IntegrityError(
        f"{expected.algorithm} {expected.describe(got)}{again} does not match the "
        f"{expected.source} {expected.describe(expected.digest)}",
        repeated=repeated,
    )


def _stored_checksum(
    head: dict[str, Any], etag_parts: int | None
) -> tuple[StoredChecksum | None, str | None]:
    """The additional checksum a HEAD reported (the first this process can compute), and why
    one it reported cannot be used, if so."""
    why = None
    for algorithm in ALGORITHMS:
        value = head.get(f"Checksum{algorithm}")
        if not value:
            continue
        stored = parse_checksum(algorithm, str(value), head.get("ChecksumType"), etag_parts)
        if stored is None:
            why = f"the store's {algorithm} checksum is not a valid {algorithm} digest"
            continue
        why = unavailable(algorithm)
        if why is None:
            return stored, None
    return None, why


def _unsupported(exc: botocore.exceptions.ClientError) -> bool:
    """A store's "I do not do that" (to ``?partNumber``), as opposed to a transient error."""
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = exc.response.get("Error", {}).get("Code")
    return status in (400, 405, 416, 501) and code not in ("RequestTimeout", "SlowDown")


def _encrypted(head: dict[str, Any]) -> bool:
    return head.get("ServerSideEncryption") in _KMS or bool(head.get("SSECustomerAlgorithm"))


def _file_digest(fd: int, algorithm: str, parts: tuple[int, ...] | None) -> bytes:
    """``algorithm`` over the whole file, or the composite of its parts."""
    if parts is None:
        return digest_of(_chunks(fd, 0, os.fstat(fd).st_size), algorithm)
    digests, offset = [], 0
    for size in parts:
        digests.append(digest_of(_chunks(fd, offset, size), algorithm))
        offset += size
    return composite(digests, algorithm)


def _chunks(fd: int, offset: int, length: int) -> Iterator[memoryview]:
    """``length`` bytes of ``fd`` from ``offset``, read into this thread's buffer: each chunk
    is valid until the next one is read (``digest_of`` hashes it before asking for more)."""
    buffer: memoryview | None = getattr(_buffers, "view", None)
    if buffer is None:
        buffer = _buffers.view = memoryview(bytearray(_READ))
    end = offset + length
    while offset < end:
        got = os.preadv(fd, [buffer[: min(_READ, end - offset)]], offset)
        if not got:
            raise IntegrityError(f"local file ended at byte {offset}, expected {end}")
        yield buffer[:got]
        offset += got


def _check_frames(fd: int, size: int) -> None:
    """Every TFRecord frame's CRCs, in file order (the C kernel reads 1 MiB at a time without
    the GIL: no Python, no syscall per record). Raises ``FramingError``."""
    try:
        choice.KERNEL.check_file(fd, size)
    except ValueError as exc:
        raise choice.framing_error(exc) from None
