"""Transparent decompression of input objects whose key ends in ``.gz`` or ``.zst``.

Every built-in format reads its object through ``open_object``, which streams: memory is one
decompression window and a read buffer, whatever the object's size. Damaged compressed data
(bad header, bad checksum, truncated stream) surfaces as ``CorruptObject`` naming the key.

zstd's streaming reader returns end-of-file on a truncated frame instead of failing, so a
``.zst`` object's frame structure (headers, block sizes, end mark) is walked first: a cheap
pass of seeks over the compressed bytes that finds truncation and garbage at the end.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import zlib
from collections.abc import Iterator
from typing import BinaryIO, cast

from prefetchd.errors import CorruptObject

_BUFFER = 1024 * 1024
SUFFIXES = (".gz", ".zst")
_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = 0x184D2A50  # the low 4 bits are free


def compression_of(key: str) -> str | None:
    """``"gzip"``, ``"zstd"`` or None, from the key's suffix."""
    if key.endswith(".gz"):
        return "gzip"
    if key.endswith(".zst"):
        return "zstd"
    return None


def strip_compression(key: str) -> str:
    """The key without its compression suffix (``a.jsonl.gz`` -> ``a.jsonl``)."""
    for suffix in SUFFIXES:
        if key.endswith(suffix):
            return key[: -len(suffix)]
    return key


def zstd_problem(f: BinaryIO) -> str | None:
    """What is wrong with the frame structure of a zstd file, or None if every frame is whole.

    Follows RFC 8878: frames (or skippable frames) back to back up to the end of the file.
    Block contents are not decompressed here; their checksums are checked while reading.
    """
    size = os.fstat(f.fileno()).st_size
    pos = 0
    f.seek(0)
    while pos < size:
        head = f.read(4)
        if len(head) < 4:
            return f"truncated frame header at byte {pos}"
        magic = int.from_bytes(head, "little")
        if magic & 0xFFFFFFF0 == _SKIPPABLE_MAGIC:
            length = f.read(4)
            if len(length) < 4:
                return f"truncated skippable frame at byte {pos}"
            pos += 8 + int.from_bytes(length, "little")
        elif magic == _ZSTD_MAGIC:
            problem, pos = _zstd_frame_end(f, pos + 4)
            if problem:
                return problem
        else:
            return f"not a zstd frame at byte {pos}"
        if pos > size:
            return f"truncated: the frame ends at byte {pos}, the file at {size}"
        f.seek(pos)
    f.seek(0)
    return None


def _zstd_frame_end(f: BinaryIO, pos: int) -> tuple[str | None, int]:
    """``(problem, position after the frame)`` for a frame whose magic ended at ``pos``."""
    descriptor = f.read(1)
    if not descriptor:
        return f"truncated frame header at byte {pos}", pos
    d = descriptor[0]
    single_segment = bool(d & 0x20)
    fcs_size = (1 if single_segment else 0, 2, 4, 8)[d >> 6]
    header = 1 + (0 if single_segment else 1) + (0, 1, 2, 4)[d & 3] + fcs_size
    pos += header
    f.seek(pos)
    while True:
        block = f.read(3)
        if len(block) < 3:
            return f"truncated: block header missing at byte {pos}", pos
        value = int.from_bytes(block, "little")
        last, kind, length = value & 1, (value >> 1) & 3, value >> 3
        if kind == 3:
            return f"reserved block type at byte {pos}", pos
        pos += 3 + (1 if kind == 1 else length)
        f.seek(pos)
        if last:
            return None, pos + (4 if d & 0x04 else 0)


def _decompression_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [gzip.BadGzipFile, EOFError, zlib.error]
    with contextlib.suppress(ImportError):
        import zstandard

        errors.append(zstandard.ZstdError)
    return tuple(errors)


@contextlib.contextmanager
def open_object(key: str, path: str, *, buffered: bool = True) -> Iterator[BinaryIO]:
    """The object's bytes as a buffered binary stream, decompressed when the key says so.
    ``buffered=False`` is for callers that only make large reads: an uncompressed object is
    then read straight into their buffers, without a 1 MiB buffer to fill and copy out of.

    Raises ``CorruptObject(key, ...)`` for damaged compressed data, also from reads made
    inside the ``with`` block.
    """
    kind = compression_of(key)
    buffering = _BUFFER if buffered or kind is not None else 0
    with open(path, "rb", buffering=buffering) as raw:
        try:
            if kind == "gzip":
                with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                    yield cast(BinaryIO, stream)
            elif kind == "zstd":
                yield from _zstd_stream(key, raw)
            else:
                yield raw
        except _decompression_errors() as exc:
            what = "gzip" if kind == "gzip" else "zstd"
            raise CorruptObject(key, f"bad {what} data: {type(exc).__name__}: {exc}") from None


def _zstd_stream(key: str, raw: BinaryIO) -> Iterator[BinaryIO]:
    import zstandard

    problem = zstd_problem(raw)
    if problem:
        raise CorruptObject(key, f"bad zstd data: {problem}")
    reader = zstandard.ZstdDecompressor().stream_reader(
        raw, read_size=_BUFFER, read_across_frames=True
    )
    with io.BufferedReader(reader, buffer_size=_BUFFER) as stream:
        yield cast(BinaryIO, stream)
