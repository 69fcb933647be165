"""The verification rule with a fake store: which objects cost a request, what each is checked
against, and that a corrupt byte is caught whichever promise covers the object."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from prefetchd.download.checksums import digest_of, parse_checksum
from prefetchd.download.jobs import Job
from prefetchd.download.order import SourceObject
from prefetchd.download.verify import IntegrityError, Verifier
from prefetchd.kernel.framing import frame

PART = 5 * 1024


class FakeStore:
    """``head_object`` of one object uploaded in ``parts``, with an optional checksum."""

    def __init__(self, parts: list[bytes], headers: dict[str, Any] | None = None) -> None:
        self.parts = parts
        self.headers = headers or {}
        self.heads: list[dict[str, Any]] = []

    def head_object(self, **args: Any) -> dict[str, Any]:
        self.heads.append(args)
        number = args.get("PartNumber")
        if number is None:
            extra = self.headers if args.get("ChecksumMode") == "ENABLED" else {}
            return {"ContentLength": sum(map(len, self.parts)), **extra}
        return {"ContentLength": len(self.parts[number - 1]), "PartsCount": len(self.parts)}


def multipart_etag(parts: list[bytes]) -> str:
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    return f"{hashlib.md5(md5s).hexdigest()}-{len(parts)}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def fetched(tmp_path: Path) -> Iterator[Any]:
    """``fetched(body, etag, key=...) -> Job`` with ``body`` in an open file, as after a GET."""
    jobs: list[Job] = []

    def make(body: bytes, etag: str | None, key: str = "data/x.bin") -> Job:
        path = tmp_path / f"{len(jobs)}.part"
        path.write_bytes(body)
        job = Job(0, 0, SourceObject(key, len(body), etag), "e0-0-x", path)
        job.fd = os.open(path, os.O_RDONLY)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        if job.fd >= 0:
            os.close(job.fd)


def flipped(body: bytes, at: int) -> bytes:
    return body[:at] + bytes([body[at] ^ 0x40]) + body[at + 1 :]


PARTS = [os.urandom(PART), os.urandom(PART), os.urandom(1000)]
BODY = b"".join(PARTS)


def test_single_part_objects_cost_no_request(fetched: Any) -> None:
    store = FakeStore([b"x"])
    job = fetched(b"hello", hashlib.md5(b"hello").hexdigest())
    Verifier(store, "b", "raw").verify(job)
    bad = fetched(b"hellp", hashlib.md5(b"hello").hexdigest())
    with pytest.raises(IntegrityError, match="MD5"):
        Verifier(store, "b", "raw").verify(bad)
    assert store.heads == [] and job.lookups == 0 and job.unverified is None


def test_a_checksum_the_get_answered_with_is_checked_instead_of_the_md5(fetched: Any) -> None:
    """The crt client's single-request GETs ask for the object's checksum: a CRC of the file
    (CRC32: 4 times cheaper than an MD5, CRC32C 30 times), no request, and the MD5 not hashed
    (here an ETag the bytes do not match would fail it)."""
    store = FakeStore([BODY])
    verifier = Verifier(store, "b", "raw")
    for algorithm in ("CRC32", "CRC32C", "CRC64NVME", "SHA256"):
        stored = parse_checksum(algorithm, b64(digest_of([BODY], algorithm)), None, None)
        job = fetched(BODY, "f" * 32)
        job.answered = stored
        assert not verifier.needs_request(job)
        verifier.verify(job)
        bad = fetched(flipped(BODY, 7000), "f" * 32)
        bad.answered = stored
        with pytest.raises(IntegrityError, match=f"x-amz-checksum-{algorithm.lower()} of the GET"):
            verifier.verify(bad)
    # A multipart object needs no HEAD either when its GET carried a whole-object checksum.
    job = fetched(BODY, multipart_etag(PARTS))
    job.answered = parse_checksum("CRC32C", b64(digest_of([BODY], "CRC32C")), None, None)
    assert not verifier.needs_request(job)
    verifier.verify(job)
    assert store.heads == [] and job.lookups == 0 and job.unverified is None


def test_tfrecord_crcs_that_fail_are_told_apart_by_the_gets_checksum(fetched: Any) -> None:
    """As with an MD5 ETag: bytes the store holds that way are published (for the writer to
    quarantine), bytes changed in transit are fetched again."""
    stored = flipped(RECORDS, 5000)
    verifier = Verifier(FakeStore([stored]), "b", "tfrecord")
    job = fetched(stored, "0" * 32 + "-2", key="x.tfrecord")
    job.answered = parse_checksum("CRC32", b64(digest_of([stored], "CRC32")), None, None)
    verifier.verify(job)
    assert not job.records_ok
    bad = fetched(stored, "0" * 32 + "-2", key="x.tfrecord")
    bad.answered = parse_checksum("CRC32", b64(digest_of([RECORDS], "CRC32")), None, None)
    with pytest.raises(IntegrityError, match="x-amz-checksum-crc32"):
        verifier.verify(bad)


RECORDS = b"".join(frame(os.urandom(n)) for n in (3000, 1, 7000, 500))


def test_tfrecord_input_is_verified_by_its_crcs_without_a_request_or_an_md5(
    fetched: Any,
) -> None:
    """Record CRCs cover uncompressed TFRecord input: no HEAD, even for a multipart upload, and
    no MD5 (a core-second per GB) even when the ETag is one."""
    store = FakeStore([RECORDS])
    verifier = Verifier(store, "b", "tfrecord")
    md5 = hashlib.md5(RECORDS).hexdigest()
    for etag in ("0" * 32 + "-2", md5):
        job = fetched(RECORDS, etag, key="data/x.tfrecord")
        verifier.verify(job)
        assert job.records_ok, "the writer is told it need not read the object through again"
    assert store.heads == []
    assert not verifier.wants_md5(fetched(RECORDS, md5, key="data/x.tfrecord"))
    assert verifier.wants_md5(fetched(RECORDS, md5, key="data/x.tfrecord.gz"))
    # a job of another source carries its own format (sources:)
    other = fetched(RECORDS, md5, key="data/x.tfrecord")
    other.format = "raw"
    assert verifier.wants_md5(other)
    with pytest.raises(IntegrityError, match="TFRecord CRC"):
        verifier.verify(fetched(flipped(RECORDS, 5000), "0" * 32 + "-2", key="x.tfrecord"))


def test_bad_records_with_a_matching_md5_are_corrupt_input_not_a_bad_transfer(
    fetched: Any,
) -> None:
    """The MD5 ETag tells the two apart when the CRCs fail: bytes the store holds that way pass
    (the writer quarantines the object, key in status); bytes changed in transit are fetched
    again."""
    stored = flipped(RECORDS, 5000)
    verifier = Verifier(FakeStore([stored]), "b", "tfrecord")
    job = fetched(stored, hashlib.md5(stored).hexdigest(), key="x.tfrecord")
    verifier.verify(job)
    assert not job.records_ok, "published, but the writer must read it through (quarantine)"
    with pytest.raises(IntegrityError, match="MD5"):
        verifier.verify(fetched(stored, hashlib.md5(RECORDS).hexdigest(), key="x.tfrecord"))


def test_multipart_etag_is_verified_with_the_part_sizes_from_part_one(fetched: Any) -> None:
    store = FakeStore(PARTS)
    etag = multipart_etag(PARTS)
    verifier = Verifier(store, "b", "raw")
    job = fetched(BODY, etag)
    verifier.verify(job)
    assert job.expected is not None and job.expected.parts == (PART, PART, 1000)
    assert [h.get("PartNumber") for h in store.heads] == [None, 1]
    assert store.heads[0]["IfMatch"] == f'"{etag}"'  # the object the GETs fetched
    bad = fetched(flipped(BODY, PART + 7), etag)
    with pytest.raises(IntegrityError, match="multipart ETag"):
        verifier.verify(bad)


def test_a_refetch_asks_the_store_nothing_again(fetched: Any) -> None:
    store = FakeStore(PARTS)
    verifier = Verifier(store, "b", "raw")
    job = fetched(flipped(BODY, 3), multipart_etag(PARTS))
    with pytest.raises(IntegrityError):
        verifier.verify(job)
    asked = len(store.heads)
    job.tmp.write_bytes(BODY)  # the re-fetch brought the right bytes
    job.lookups = 0
    verifier.verify(job)
    assert len(store.heads) == asked and job.lookups == 0


def test_the_same_wrong_digest_twice_is_said_so(fetched: Any) -> None:
    store = FakeStore(PARTS)
    verifier = Verifier(store, "b", "raw")
    job = fetched(flipped(BODY, 3), multipart_etag(PARTS))
    with pytest.raises(IntegrityError) as first:
        verifier.verify(job)
    with pytest.raises(IntegrityError) as second:
        verifier.verify(job)
    assert "previous fetch" not in str(first.value)
    assert "the same as the previous fetch" in str(second.value)
    assert not first.value.repeated and second.value.repeated  # skipped sooner (retries.py)
    other = fetched(flipped(BODY, 4), multipart_etag(PARTS))
    other.bad_digest = job.bad_digest
    with pytest.raises(IntegrityError) as third:
        verifier.verify(other)
    assert not third.value.repeated, "bits flipped another way: not the store's bytes"


def test_records_failing_their_crcs_the_same_way_twice_are_said_so(fetched: Any) -> None:
    """TFRecord input with no whole-object checksum to ask: the same frame failing again is
    the store's bytes (skipped sooner), another frame failing is bits flipped on the way."""
    verifier = Verifier(FakeStore([RECORDS]), "b", "tfrecord")
    job = fetched(flipped(RECORDS, 5000), "0" * 32 + "-2", key="x.tfrecord")
    repeated = []
    for _ in range(2):
        with pytest.raises(IntegrityError, match="TFRecord CRC") as caught:
            verifier.verify(job)
        repeated.append(caught.value.repeated)
    assert repeated == [False, True]
    elsewhere = fetched(flipped(RECORDS, 100), "0" * 32 + "-2", key="x.tfrecord")
    elsewhere.bad_frames = job.bad_frames
    with pytest.raises(IntegrityError, match="TFRecord CRC") as caught:
        verifier.verify(elsewhere)
    assert not caught.value.repeated


def test_full_object_checksum_takes_one_request(fetched: Any) -> None:
    crc = digest_of([BODY], "CRC32C")
    store = FakeStore(PARTS, {"ChecksumCRC32C": b64(crc), "ChecksumType": "FULL_OBJECT"})
    verifier = Verifier(store, "b", "raw")
    job = fetched(BODY, multipart_etag(PARTS))
    verifier.verify(job)
    assert len(store.heads) == 1 and job.expected is not None
    assert job.expected.algorithm == "CRC32C" and job.expected.parts is None
    with pytest.raises(IntegrityError, match="x-amz-checksum-crc32c"):
        verifier.verify(fetched(flipped(BODY, 10), multipart_etag(PARTS)))


def test_composite_checksum_is_verified_over_the_parts(fetched: Any) -> None:
    """Also for a KMS-encrypted object, whose ETag says nothing about its bytes."""
    sha = digest_of([b"".join(digest_of([p], "SHA256") for p in PARTS)], "SHA256")
    headers = {"ChecksumSHA256": f"{b64(sha)}-3", "ServerSideEncryption": "aws:kms"}
    store = FakeStore(PARTS, headers)
    verifier = Verifier(store, "b", "raw")
    job = fetched(BODY, "0123456789abcdef0123456789abcdef-3")
    verifier.verify(job)
    assert job.expected is not None and job.expected.algorithm == "SHA256"
    assert job.expected.parts == (PART, PART, 1000)
    with pytest.raises(IntegrityError, match="COMPOSITE"):
        verifier.verify(fetched(flipped(BODY, 2 * PART + 1), job.obj.etag))


def test_unequal_parts_are_asked_for_one_by_one(fetched: Any) -> None:
    parts = [os.urandom(PART), os.urandom(PART + 100), os.urandom(PART)]  # last > first
    body = b"".join(parts)
    store = FakeStore(parts)
    job = fetched(body, multipart_etag(parts))
    Verifier(store, "b", "raw").verify(job)
    assert [h.get("PartNumber") for h in store.heads] == [None, 1, 2, 3]
    assert job.expected is not None and job.expected.parts == (PART, PART + 100, PART)


def test_an_inferred_layout_is_confirmed_before_a_mismatch_is_blamed_on_the_bytes(
    fetched: Any,
) -> None:
    """Parts of 5, 3 and 5 KiB add up like 5, 5 and 3: inferred wrong, the bytes are fine. The
    first mismatch may be a flip and is re-fetched; the same digest again asks for the parts."""
    parts = [os.urandom(PART), os.urandom(3 * 1024), os.urandom(PART)]
    body = b"".join(parts)
    store = FakeStore(parts)
    verifier = Verifier(store, "b", "raw")
    job = fetched(body, multipart_etag(parts))
    with pytest.raises(IntegrityError):
        verifier.verify(job)
    assert len(store.heads) == 2
    verifier.verify(job)  # the re-fetch: same bytes, same digest
    assert [h.get("PartNumber") for h in store.heads] == [None, 1, 2, 3]
    assert job.expected is not None and job.expected.exact
    assert job.expected.parts == (PART, 3 * 1024, PART)


def test_kms_multipart_without_checksum_is_size_only_and_says_why(fetched: Any) -> None:
    store = FakeStore(PARTS, {"ServerSideEncryption": "aws:kms"})
    job = fetched(BODY, "0123456789abcdef0123456789abcdef-3")
    Verifier(store, "b", "raw").verify(job)
    assert job.expected is None and job.unverified is not None
    assert "no S3 checksum" in job.unverified and job.lookups == 1


def test_size_is_checked_first(fetched: Any) -> None:
    job = fetched(b"abc", None)
    job.obj = SourceObject("k", 4, None)
    with pytest.raises(IntegrityError, match="3 bytes, listing said 4"):
        Verifier(FakeStore([]), "b", "raw").verify(job)


class NoPartNumberStore(FakeStore):
    def head_object(self, **args: Any) -> dict[str, Any]:
        if "PartNumber" in args:
            error: Any = {"Error": {"Code": "InvalidArgument"}, "ResponseMetadata": {}}
            error["ResponseMetadata"]["HTTPStatusCode"] = 400
            raise botocore.exceptions.ClientError(error, "HeadObject")
        return super().head_object(**args)


def test_a_store_without_part_number_heads_gets_size_only_not_endless_retries(
    fetched: Any,
) -> None:
    job = fetched(BODY, multipart_etag(PARTS))
    Verifier(NoPartNumberStore(PARTS), "b", "raw").verify(job)
    assert job.expected is None and job.unverified is not None
    assert "part sizes" in job.unverified
