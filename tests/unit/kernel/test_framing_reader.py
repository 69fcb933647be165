"""``iter_records``: the buffered reader behind ``prefetchd.records()``.

It must read exactly what the unbuffered ``read_records`` reads (which test_tfrecord.py checks
against TensorFlow), wherever the chunk boundaries fall, find the same errors at the same
offsets, and do a bounded amount of work per record (counted, not timed).
"""

from __future__ import annotations

import gzip
import io
import random
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from prefetchd.kernel.framing import FRAME_OVERHEAD, FramingError, frame, iter_records, read_records

_rng = random.Random(20261203)
RECORDS = [
    b"",
    b"a",
    bytes(range(256)),
    _rng.randbytes(1000),
    b"",
    _rng.randbytes(70_000),  # longer than the small buffers below
    b"last",
]


class CountingReader(io.BytesIO):
    """A stream that counts its ``read()`` calls."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads = 0

    def read(self, size: int | None = -1, /) -> bytes:
        self.reads += 1
        return super().read(size)


class ShortReader(io.RawIOBase):
    """A raw stream that returns at most 5 bytes per read, as a pipe or socket may."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1, /) -> bytes:
        size = 5 if size < 0 else min(size, 5)
        chunk = bytes(self.data[self.pos : self.pos + size])
        self.pos += len(chunk)
        return chunk


def framed(records: list[bytes]) -> bytes:
    return b"".join(frame(r) for r in records)


@pytest.mark.parametrize("buffer_size", [1, 7, 12, 13, 1000, 4096, 1 << 20])
def test_reads_every_record_whatever_the_buffer_size(buffer_size: int) -> None:
    data = framed(RECORDS)
    assert list(iter_records(io.BytesIO(data), buffer_size=buffer_size)) == RECORDS


def test_short_reads_do_not_look_like_truncation() -> None:
    stream: Any = ShortReader(framed(RECORDS))
    assert list(iter_records(stream, buffer_size=64)) == RECORDS


def test_reads_gzip_streams() -> None:
    data = gzip.compress(framed(RECORDS))
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
        assert list(iter_records(stream, buffer_size=4096)) == RECORDS  # type: ignore[arg-type]


def test_empty_stream_has_no_records() -> None:
    assert list(iter_records(io.BytesIO(b""))) == []


def corruptions() -> Iterator[tuple[str, bytes]]:
    data = framed(RECORDS)
    second = FRAME_OVERHEAD + len(RECORDS[0])  # where the second frame starts
    flipped = bytearray(data)
    flipped[second + 12] ^= 0x01  # a data byte of the second record
    yield "data CRC", bytes(flipped)
    flipped = bytearray(data)
    flipped[second + 2] ^= 0x40  # its length
    yield "length CRC", bytes(flipped)
    yield "truncated data", data[: second + 12 + 1]
    yield "truncated header", data[: second + 5]


@pytest.mark.parametrize(("what", "data"), list(corruptions()))
@pytest.mark.parametrize("buffer_size", [16, 1 << 20])
def test_finds_the_same_errors_as_the_unbuffered_reader(
    what: str, data: bytes, buffer_size: int
) -> None:
    with pytest.raises(FramingError) as expected:
        list(read_records(io.BytesIO(data)))
    got: list[bytes] = []
    with pytest.raises(FramingError) as raised:
        got.extend(iter_records(io.BytesIO(data), buffer_size=buffer_size))
    assert raised.value.offset == expected.value.offset, what
    assert raised.value.reason == expected.value.reason, what
    assert got == RECORDS[:1], f"{what}: the records before the bad frame are delivered"


def test_one_read_call_per_buffer_not_per_record() -> None:
    records = [_rng.randbytes(_rng.randrange(0, 200)) for _ in range(20_000)]
    data = framed(records)
    stream = CountingReader(data)
    assert list(iter_records(stream, buffer_size=256 * 1024)) == records
    # every full buffer, plus the empty read that finds the end
    assert stream.reads <= len(data) // (256 * 1024) + 2, stream.reads


def test_a_bounded_number_of_python_calls_per_record() -> None:
    """Regression guard for the reader's cost: Python-level and C calls made per record,
    counted with a profile hook (no timing)."""
    records = [b"x" * 100] * 5000
    stream = io.BytesIO(framed(records))
    calls = 0

    def count(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    reader = iter_records(stream)
    sys.setprofile(count)
    try:
        n = sum(1 for _ in reader)
    finally:
        sys.setprofile(None)
    assert n == len(records)
    # 8: the generator's resumption, two unpack_from, two CRC32Cs and their masks, and
    # the consuming generator expression here (and a few calls per buffer refill)
    assert calls <= 8 * n + 100, f"{calls / n:.2f} calls per record"
