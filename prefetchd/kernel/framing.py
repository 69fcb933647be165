"""TFRecord framing, done here so the daemon never imports TensorFlow.

A TFRecord file is a sequence of frames::

    uint64 length            (little endian)
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

The mask is TensorFlow's: rotate the CRC right by 15 bits and add 0xa282ead8 (mod 2**32).
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
HEADER = struct.Struct("<QI")
FOOTER = struct.Struct("<I")
HEADER_SIZE = HEADER.size
FOOTER_SIZE = FOOTER.size
FRAME_OVERHEAD = HEADER_SIZE + FOOTER_SIZE
_CHUNK = 16 * 1024 * 1024


class FramingError(ValueError):
    """The bytes are not a valid TFRecord frame; ``offset`` is where the bad frame starts."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"at byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class RecordTooLong(FramingError):
    """A frame whose (CRC-checked) length is over the reader's ``max_length``."""

    def __init__(self, offset: int, length: int) -> None:
        super().__init__(offset, f"record of {length} bytes is over the limit")
        self.length = length


def masked_crc(data: bytes | memoryview) -> int:
    crc: int = google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def frame_header(length: int) -> bytes:
    """The 12 bytes that precede a record of ``length`` bytes."""
    length_bytes = struct.pack("<Q", length)
    return length_bytes + FOOTER.pack(masked_crc(length_bytes))


def frame(data: bytes) -> bytes:
    """One complete frame around ``data``."""
    return frame_header(len(data)) + data + FOOTER.pack(masked_crc(data))


def _read_at_most(stream: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes, read in bounded chunks: a corrupt length that happens to pass its CRC
    must end as a truncated frame, not as a huge allocation (MemoryError, OverflowError)."""
    if n <= _CHUNK:
        return stream.read(n)
    parts = []
    while n > 0:
        part = stream.read(min(n, _CHUNK))
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def read_records(
    stream: BinaryIO, *, start_offset: int = 0, max_length: int | None = None
) -> Iterator[bytes]:
    """Yield each record's data from ``stream``, checking both CRCs of every frame.

    Raises ``FramingError`` on a bad CRC or a truncated frame, ``RecordTooLong`` (before
    reading it) for a record over ``max_length``; a clean end of stream between frames ends
    the iteration.
    """
    offset = start_offset
    while True:
        header = stream.read(HEADER_SIZE)
        if not header:
            return
        if len(header) < HEADER_SIZE:
            raise FramingError(offset, "truncated record header")
        length, length_crc = HEADER.unpack(header)
        if masked_crc(header[:8]) != length_crc:
            raise FramingError(offset, "length CRC mismatch (not a TFRecord, or corrupt)")
        if max_length is not None and length > max_length:
            raise RecordTooLong(offset, length)
        data = _read_at_most(stream, length)
        footer = stream.read(FOOTER_SIZE)
        if len(data) < length or len(footer) < FOOTER_SIZE:
            raise FramingError(offset, f"truncated record (expected {length} bytes of data)")
        if masked_crc(data) != FOOTER.unpack(footer)[0]:
            raise FramingError(offset, "data CRC mismatch")
        offset += FRAME_OVERHEAD + length
        yield data


def index_records(fd: int, size: int) -> array[int]:
    """The start offset of every frame of a TFRecord file of ``size`` bytes open as ``fd``.

    Checks each length CRC and that the frames end exactly at the end of the file (data CRCs
    are checked where the frames are read). Costs one 12-byte ``pread`` and 8 bytes per record.
    Raises ``FramingError``.
    """
    offsets = array("Q")
    pos = 0
    while pos < size:
        header = os.pread(fd, HEADER_SIZE, pos)
        if len(header) < HEADER_SIZE:
            raise FramingError(pos, "truncated record header")
        length, length_crc = HEADER.unpack(header)
        if masked_crc(header[:8]) != length_crc:
            raise FramingError(pos, "length CRC mismatch (not a TFRecord, or corrupt)")
        end = pos + FRAME_OVERHEAD + length
        if end > size:
            raise FramingError(pos, f"truncated record (expected {length} bytes of data)")
        offsets.append(pos)
        pos = end
    return offsets


READ_BUFFER = 1024 * 1024  # bytes each read() of ``iter_records`` asks for


def iter_records(stream: BinaryIO, *, buffer_size: int = READ_BUFFER) -> Iterator[bytes]:
    """Like ``read_records``, but reads ``stream`` in ``buffer_size`` chunks and cuts the
    frames out of memory: one ``read()`` per chunk instead of three per record, which is what
    a trainer reading small records from a RAM disk would otherwise pay for.

    Both CRCs of every frame are checked; raises ``FramingError`` (with the frame's offset) on a
    bad CRC or a truncated frame. A clean end of stream between frames ends the iteration.
    """
    # The loop is the per-record cost of every records() user: it makes 7 calls per record
    # (tests/unit/kernel/test_framing_reader.py counts them), so CRCs go straight to
    # google_crc32c.
    crc = google_crc32c.value
    buf = b""
    size = pos = 0  # len(buf); where the next frame starts in buf
    base = 0  # offset of buf[0] in the stream
    while True:
        if size - pos < HEADER_SIZE:
            base, buf, pos = base + pos, _refill(stream, buf[pos:], HEADER_SIZE, buffer_size), 0
            size = len(buf)
            if not size:
                return
            if size < HEADER_SIZE:
                raise FramingError(base, "truncated record header")
        length, length_crc = HEADER.unpack_from(buf, pos)
        if _mask(crc(buf[pos : pos + 8])) != length_crc:
            raise FramingError(base + pos, "length CRC mismatch (not a TFRecord, or corrupt)")
        end = pos + FRAME_OVERHEAD + length
        if end > size:
            need = FRAME_OVERHEAD + length
            base, buf, pos = base + pos, _refill(stream, buf[pos:], need, buffer_size), 0
            end, size = need, len(buf)
            if end > size:
                raise FramingError(base, f"truncated record (expected {length} bytes of data)")
        data = buf[pos + HEADER_SIZE : end - FOOTER_SIZE]
        if _mask(crc(data)) != FOOTER.unpack_from(buf, end - FOOTER_SIZE)[0]:
            raise FramingError(base + pos, "data CRC mismatch")
        pos = end
        yield data


def _mask(crc: int) -> int:
    """TensorFlow's mask of a CRC32C (see the module docstring)."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def _refill(stream: BinaryIO, head: bytes, need: int, buffer_size: int) -> bytes:
    """``head`` followed by more of ``stream``: at least ``need`` bytes in all unless the stream
    ends first. Reads at least ``buffer_size`` bytes at a time; a record longer than that is
    read whole, in ``_read_at_most``'s bounded chunks (a corrupt length that passed its CRC
    ends as a truncated frame, not as a huge allocation)."""
    parts = [head]
    have = len(head)
    while True:
        more = _read_at_most(stream, max(need - have, buffer_size))
        parts.append(more)
        have += len(more)
        if not more or have >= need:
            return b"".join(parts)
