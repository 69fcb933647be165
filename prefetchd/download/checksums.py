"""What a downloaded object's bytes must hash to, and the arithmetic to check it (pure).

Three kinds of promise come from the store, and each is checked end to end on the assembled
file, because boto3 does not verify ranged downloads by itself:

- a plain ETag (32 hex digits) is the MD5 of the whole object (single-part upload, no SSE-KMS);
- a multipart ETag ``"<hex>-N"`` is the MD5 of the N part MD5s concatenated (AWS, Ceph RGW,
  MinIO, SeaweedFS and moto alike, for objects not encrypted with KMS or SSE-C);
- an S3 additional checksum (``x-amz-checksum-<algorithm>``): FULL_OBJECT is the checksum of the
  whole byte stream; COMPOSITE (``"<base64>-N"``) is the checksum of the N part checksums
  concatenated, like the multipart ETag.

Composite values need the part boundaries of the upload. S3 tells only the size of a part you
ask for, so ``part_layout`` infers them from part 1's size — equal parts and a shorter last one,
which is what every common uploader does — and the caller confirms them part by part before
blaming a mismatch on the bytes.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import google_crc32c

try:  # ISA-L's CRC32 (carry-less multiply): ~13x zlib's on this machine, the same values
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # a platform without an isal wheel: zlib's, slower, the same values
    _crc32 = zlib.crc32

MD5 = "MD5"
# S3's additional checksum algorithms, as boto3 spells them (``ChecksumCRC32C`` ...).
ALGORITHMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256")
# each algorithm with the GET response header that carries it (per object: no string built)
_ANSWER_HEADERS = tuple(
    (algorithm, f"x-amz-checksum-{algorithm.lower()}") for algorithm in ALGORITHMS
)
_DIGEST_SIZES = {"CRC32": 4, "CRC32C": 4, "CRC64NVME": 8, "SHA1": 20, "SHA256": 32, MD5: 16}
_MULTIPART_ETAG = re.compile(r"^([0-9a-f]{32})-([1-9][0-9]{0,4})$")
_COMPOSITE_SUFFIX = re.compile(r"^(.*)-([1-9][0-9]{0,4})$")
_RECORD_CHECKED_SUFFIXES = (".gz", ".zst")


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...

    def digest(self) -> bytes: ...


@dataclass(frozen=True)
class Expected:
    """What the object's bytes must hash to: ``digest`` by ``algorithm``, over the whole object
    (``parts`` is None) or as the composite of the parts whose sizes ``parts`` lists.
    ``exact`` is False while the part sizes are inferred from part 1 (``part_layout``)."""

    algorithm: str
    digest: bytes
    source: str  # for messages: "ETag", "x-amz-checksum-sha256 (COMPOSITE)" ...
    parts: tuple[int, ...] | None = None
    exact: bool = True

    def describe(self, digest: bytes) -> str:
        return _text(self.algorithm, digest)


@dataclass(frozen=True)
class StoredChecksum:
    """An additional checksum as a HEAD answered it: the algorithm, the raw digest, whether it is
    COMPOSITE, and the part count its ``-N`` suffix named (if it had one)."""

    algorithm: str
    digest: bytes
    composite: bool
    parts: int | None


def is_plain_md5(etag: str | None) -> bool:
    """An ETag that is the MD5 of the whole object (single-part upload, no SSE-KMS)."""
    return etag is not None and len(etag) == 32 and all(c in "0123456789abcdef" for c in etag)


def records_checked(format: str, key: str) -> bool:
    """Whether the downloader checks every TFRecord CRC of this object before publishing it
    (uncompressed ``tfrecord`` input): then the CRCs verify it end to end, with no request."""
    return format == "tfrecord" and not key.endswith(_RECORD_CHECKED_SUFFIXES)


def multipart_etag(etag: str | None) -> tuple[bytes, int] | None:
    """``(md5_of_part_md5s, parts)`` of a multipart ETag ``"<hex>-N"``, else None."""
    found = _MULTIPART_ETAG.match(etag or "")
    if found is None:
        return None
    return bytes.fromhex(found.group(1)), int(found.group(2))


def parse_checksum(
    algorithm: str, value: str, stated_type: str | None, etag_parts: int | None
) -> StoredChecksum | None:
    """A stored checksum from a HEAD's ``Checksum<ALG>`` value and ``ChecksumType``; None if the
    value is not valid base64 of the algorithm's digest size.

    Stores differ in what they say: AWS and SeaweedFS send ``<b64>-N`` and the type; moto sends
    the bare value and, for SHA algorithms, no type. Without a stated type, a ``-N`` suffix means
    COMPOSITE; otherwise a multipart object (``etag_parts``) is COMPOSITE unless the algorithm
    is CRC64NVME (S3 keeps that one FULL_OBJECT only), and a single-part one FULL_OBJECT.
    """
    suffix = _COMPOSITE_SUFFIX.match(value)
    parts = int(suffix.group(2)) if suffix else None
    encoded = suffix.group(1) if suffix else value
    try:
        digest = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        return None
    if len(digest) != _DIGEST_SIZES[algorithm]:
        return None
    if stated_type in ("COMPOSITE", "FULL_OBJECT"):
        composite = stated_type == "COMPOSITE"
    elif parts is not None:
        composite = True
    else:
        composite = etag_parts is not None and algorithm != "CRC64NVME"
    return StoredChecksum(algorithm, digest, composite, parts)


def response_checksum(headers: Mapping[str, str], etag: str | None) -> StoredChecksum | None:
    """The whole object's checksum that a GET answered with (``x-amz-checksum-mode: ENABLED``;
    ``headers`` by lower-case name), if it is a valid FULL_OBJECT one this process can compute;
    None otherwise. S3 and
    SeaweedFS send it only for a GET of the whole object (no Range, no partNumber); a COMPOSITE
    one needs the part sizes, which only HEADs tell (``verify.Verifier``)."""
    parts = multipart_etag(etag)
    stated = headers.get("x-amz-checksum-type")
    for algorithm, header in _ANSWER_HEADERS:
        value = headers.get(header)
        if not value or unavailable(algorithm) is not None:
            continue
        stored = parse_checksum(algorithm, value, stated, parts[1] if parts else None)
        if stored is not None and not stored.composite:
            return stored
    return None


def part_layout(size: int, parts: int, first: int) -> tuple[int, ...] | None:
    """The part sizes of a ``size``-byte object uploaded in ``parts`` parts, the first of
    ``first`` bytes, assuming equal parts and a last one no larger; None if that cannot add
    up (the uploader used unequal parts, so each must be asked for)."""
    if parts < 1 or first < 1:
        return None
    if parts == 1:
        return (size,) if first == size else None
    last = size - (parts - 1) * first
    if not 0 < last <= first:
        return None
    return (first,) * (parts - 1) + (last,)


def new_hasher(algorithm: str) -> Hasher:
    """A running hash for ``algorithm``; raises ``UnavailableAlgorithm`` when CRC64NVME is asked
    for without awscrt (the ``crt`` extra)."""
    if algorithm in (MD5, "SHA1", "SHA256"):
        return hashlib.new(algorithm.lower(), usedforsecurity=False)
    if algorithm == "CRC32":
        return _Crc(_crc32, 4)
    if algorithm == "CRC32C":
        return _Crc(_crc32c, 4)
    if algorithm == "CRC64NVME":
        return _Crc(_crc64nvme(), 8)
    raise ValueError(f"unknown checksum algorithm {algorithm!r}")


class UnavailableAlgorithm(Exception):
    """This process cannot compute the algorithm (CRC64NVME needs awscrt)."""


@functools.cache  # what is installed does not change while the process runs; asked per object
def unavailable(algorithm: str) -> str | None:
    """Why this process cannot compute ``algorithm`` (``UnavailableAlgorithm``), or None."""
    try:
        new_hasher(algorithm)
    except UnavailableAlgorithm as exc:
        return str(exc)
    return None


def digest_of(chunks: Iterable[bytes | memoryview], algorithm: str) -> bytes:
    hasher = new_hasher(algorithm)
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.digest()


def composite(part_digests: Iterable[bytes], algorithm: str) -> bytes:
    """The composite of part digests: ``algorithm`` over their concatenation (how both the
    multipart ETag and a COMPOSITE checksum are formed)."""
    return digest_of([b"".join(part_digests)], algorithm)


def _text(algorithm: str, digest: bytes) -> str:
    """A digest the way the store shows it: hex for MD5 (ETags), base64 for checksums."""
    return digest.hex() if algorithm == MD5 else base64.b64encode(digest).decode("ascii")


class _Crc:
    """A running CRC over ``update(data, previous) -> int`` functions (zlib, awscrt)."""

    def __init__(self, update: Callable[[bytes | memoryview, int], int], size: int) -> None:
        self._update = update
        self._size = size
        self._value = 0

    def update(self, data: bytes | memoryview, /) -> None:
        self._value = self._update(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._size, "big")


def _crc32c(data: bytes | memoryview, previous: int) -> int:
    if isinstance(data, memoryview):
        data = bytes(data)  # google_crc32c takes read-only bytes only
    return int(google_crc32c.extend(previous, data))


def _crc64nvme() -> Callable[[bytes | memoryview, int], int]:
    try:
        from awscrt.checksums import crc64nvme
    except ImportError:
        raise UnavailableAlgorithm(
            "CRC64NVME checksums need awscrt: pip install 'prefetchd[crt]'"
        ) from None
    return crc64nvme  # type: ignore[no-any-return]
