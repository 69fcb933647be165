"""The checksum arithmetic: digests, composites, part layouts and what a store's answer means."""

from __future__ import annotations

import base64
import hashlib
import zlib

import pytest

from prefetchd.download import checksums
from prefetchd.download.checksums import (
    MD5,
    Expected,
    composite,
    digest_of,
    is_plain_md5,
    multipart_etag,
    parse_checksum,
    part_layout,
    records_checked,
    response_checksum,
)

CHECK = b"123456789"  # the CRC catalogue's check input


@pytest.mark.parametrize(
    ("algorithm", "value"),
    [
        ("CRC32", 0xCBF43926),
        ("CRC32C", 0xE3069283),
        ("CRC64NVME", 0xAE8B14860A799888),
    ],
)
def test_crcs_match_the_catalogue_check_values(algorithm: str, value: int) -> None:
    size = 8 if algorithm == "CRC64NVME" else 4
    assert digest_of([CHECK], algorithm) == value.to_bytes(size, "big")


@pytest.mark.parametrize("algorithm", ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256", MD5])
def test_a_digest_does_not_depend_on_how_the_bytes_are_chunked(algorithm: str) -> None:
    data = bytes(range(256)) * 1000
    chunks: list[bytes | memoryview] = [data[:1], memoryview(data)[1:70_000], data[70_000:]]
    assert digest_of(chunks, algorithm) == digest_of([data], algorithm)


def test_the_fast_crc32_gives_zlibs_values_whatever_the_chunks() -> None:
    """ISA-L's CRC32 where ``isal`` installs, zlib's where it does not: the same values."""
    data = bytes(range(256)) * 5000 + b"tail"
    for cut in (0, 1, 4095, 70_000, len(data)):
        chunks: list[bytes | memoryview] = [memoryview(data)[:cut], data[cut:]]
        assert digest_of(chunks, "CRC32") == zlib.crc32(data).to_bytes(4, "big")
    assert vars(checksums)["_crc32"] is not zlib.crc32, "isal is a dependency: its CRC32 is used"


def test_sha_digests_are_hashlibs() -> None:
    assert digest_of([CHECK], "SHA256") == hashlib.sha256(CHECK).digest()
    assert digest_of([CHECK], "SHA1") == hashlib.sha1(CHECK).digest()


def test_composite_md5_is_the_multipart_etag_formula() -> None:
    parts = [b"a" * 5, b"b" * 5, b"c" * 2]
    part_md5s = [hashlib.md5(p).digest() for p in parts]
    expected = hashlib.md5(b"".join(part_md5s)).digest()
    assert composite(part_md5s, MD5) == expected


def test_composite_crc_is_the_crc_of_the_part_crcs() -> None:
    parts = [b"x" * 10, b"y" * 3]
    crcs = [digest_of([p], "CRC32C") for p in parts]
    assert composite(crcs, "CRC32C") == digest_of([crcs[0] + crcs[1]], "CRC32C")
    assert composite(crcs, "CRC32C") != digest_of([b"".join(parts)], "CRC32C")


def test_plain_md5_etags_and_multipart_etags_are_told_apart() -> None:
    md5 = hashlib.md5(b"x").hexdigest()
    assert is_plain_md5(md5)
    assert not is_plain_md5(f"{md5}-3") and not is_plain_md5(None) and not is_plain_md5("abc")
    assert multipart_etag(f"{md5}-3") == (bytes.fromhex(md5), 3)
    assert multipart_etag(md5) is None
    assert multipart_etag(f"{md5}-0") is None and multipart_etag("nothex-2") is None


@pytest.mark.parametrize(
    ("size", "parts", "first", "layout"),
    [
        (12, 3, 5, (5, 5, 2)),
        (15, 3, 5, (5, 5, 5)),
        (7, 1, 7, (7,)),
        (8, 2, 5, (5, 3)),
    ],
)
def test_part_layout_of_equal_parts_and_a_shorter_last(
    size: int, parts: int, first: int, layout: tuple[int, ...]
) -> None:
    assert part_layout(size, parts, first) == layout


@pytest.mark.parametrize(
    ("size", "parts", "first"),
    [
        (16, 3, 5),  # the last part would be larger than the first
        (10, 3, 5),  # ... or empty
        (7, 1, 6),  # one part must be the whole object
        (7, 0, 7),
        (7, 2, 0),
    ],
)
def test_part_layout_that_cannot_add_up_is_none(size: int, parts: int, first: int) -> None:
    assert part_layout(size, parts, first) is None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_checksum_with_a_stated_type_and_part_suffix() -> None:
    digest = bytes(32)
    stored = parse_checksum("SHA256", f"{b64(digest)}-3", "COMPOSITE", 3)
    assert stored is not None and stored.composite and stored.parts == 3
    assert stored.digest == digest
    full = parse_checksum("CRC32C", b64(bytes(4)), "FULL_OBJECT", 3)
    assert full is not None and not full.composite and full.parts is None


def test_checksum_type_inferred_when_the_store_does_not_say() -> None:
    """moto answers a HEAD with the bare value and, for SHA algorithms, no type."""
    assert parse_checksum("SHA256", b64(bytes(32)), None, 3).composite  # type: ignore[union-attr]
    assert not parse_checksum("SHA256", b64(bytes(32)), None, None).composite  # type: ignore[union-attr]
    assert not parse_checksum("CRC64NVME", b64(bytes(8)), None, 3).composite  # type: ignore[union-attr]
    assert parse_checksum("CRC32", f"{b64(bytes(4))}-2", None, None).composite  # type: ignore[union-attr]


def test_a_gets_full_object_checksum_is_taken_from_its_headers() -> None:
    """What S3 and SeaweedFS answer a whole-object GET with ``x-amz-checksum-mode: ENABLED``."""
    crc = response_checksum({"x-amz-checksum-crc32": "fuQrNw=="}, "0" * 32)
    assert crc is not None and crc.algorithm == "CRC32" and not crc.composite
    assert crc.digest == base64.b64decode("fuQrNw==")
    nvme = {"x-amz-checksum-crc64nvme": b64(bytes(8)), "x-amz-checksum-type": "FULL_OBJECT"}
    stored = response_checksum(nvme, "0" * 32 + "-3")  # S3 keeps CRC64NVME whole even then
    assert stored is not None and stored.algorithm == "CRC64NVME"


@pytest.mark.parametrize(
    ("headers", "etag"),
    [
        ({}, "0" * 32),  # a store that sends none (moto), or a ranged GET
        ({"x-amz-checksum-crc32": f"{b64(bytes(4))}-3"}, "0" * 32 + "-3"),  # composite
        ({"x-amz-checksum-crc32c": b64(bytes(4)), "x-amz-checksum-type": "COMPOSITE"}, None),
        ({"x-amz-checksum-sha256": b64(bytes(32))}, "0" * 32 + "-2"),  # multipart, no type
        ({"x-amz-checksum-crc32": "not base64!"}, "0" * 32),
    ],
)
def test_a_get_without_a_usable_whole_object_checksum_gives_none(
    headers: dict[str, str], etag: str | None
) -> None:
    """Only a FULL_OBJECT checksum of the whole object can be checked without the part sizes."""
    assert response_checksum(headers, etag) is None


@pytest.mark.parametrize("value", ["not base64!", b64(bytes(5)), ""])
def test_checksum_that_is_not_a_digest_is_rejected(value: str) -> None:
    assert parse_checksum("CRC32", value, "FULL_OBJECT", None) is None


def test_expected_describes_digests_as_the_store_shows_them() -> None:
    md5 = hashlib.md5(b"x").digest()
    assert Expected(MD5, md5, "ETag").describe(md5) == md5.hex()
    assert Expected("CRC32", bytes(4), "x").describe(bytes(4)) == "AAAAAA=="


def test_only_uncompressed_tfrecord_input_is_verified_by_its_records() -> None:
    assert records_checked("tfrecord", "a/b.tfrecord")
    assert not records_checked("tfrecord", "a/b.tfrecord.gz")
    assert not records_checked("tfrecord", "a/b.zst")
    assert not records_checked("raw", "a/b.bin")
