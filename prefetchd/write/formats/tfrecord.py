"""``tfrecord``: every record of every input TFRecord file, CRC checked, passed through as is.

``.gz`` objects are GZIP TFRecord files (what ``TFRecordWriter`` writes with
``compression_type="GZIP"``); ``.zst`` objects are zstd-compressed TFRecord files.

An uncompressed object is indexed (length CRCs checked, 8 bytes per record kept) and its frames
are copied into the shard as they lie, a batch per call: a valid frame re-framed would be the
same bytes. The downloader verified every frame before it published the object, and the data
CRC is checked again on the copy anyway: it costs about 0.05 CPU-s per GB with the hardware
CRC32C, and a bit flipped in the cache must not reach a trainer unnoticed.

A record over ``output.max_record_size`` raises ``RecordTooLarge`` before it is read: from its
frame header in a compressed object, from the index (the largest gap between two frames, looked
for only when the file is larger than the limit) in an uncompressed one.
"""

from __future__ import annotations

import operator
import os
from array import array
from collections.abc import Iterator

from prefetchd.config import DEFAULT_MAX_RECORD_SIZE
from prefetchd.errors import CorruptObject
from prefetchd.kernel import choice
from prefetchd.kernel.framing import FRAME_OVERHEAD, FramingError, RecordTooLong, read_records
from prefetchd.write.formats.compressed import compression_of, open_object
from prefetchd.write.frames import BATCH_BYTES, Frames, batched
from prefetchd.write.quarantine import RecordTooLarge


class TFRecordFormat:
    """Uncompressed objects are indexed, then read ``batch_bytes`` of frames at a time (in file
    order, or a seeded whole-object order); compressed ones are streamed."""

    def __init__(
        self, max_record_size: int = DEFAULT_MAX_RECORD_SIZE, batch_bytes: int = BATCH_BYTES
    ) -> None:
        self.max_record_size = max_record_size
        self.batch_bytes = batch_bytes

    def read_whole_first(self, key: str, path: str) -> bool:
        """An uncompressed object is indexed (every length checked) before its first frame,
        and its first batch of frames (data CRCs checked) is all of it up to ``batch_bytes``.
        A larger one can fail a data CRC after frames were taken (an object the store holds
        corrupt: the downloader publishes it when its MD5 ETag matches)."""
        return compression_of(key) is None and os.path.getsize(path) <= self.batch_bytes

    def records(self, key: str, path: str) -> Iterator[bytes]:
        limit = self.max_record_size
        with open_object(key, path) as stream:
            try:
                yield from read_records(stream, max_length=limit)
            except RecordTooLong as exc:
                raise RecordTooLarge(
                    key, f"record at byte {exc.offset}", exc.length, limit
                ) from None
            except FramingError as exc:
                raise CorruptObject(key, f"not a valid TFRecord file {exc}") from None

    def frames(self, key: str, path: str) -> Iterator[Frames]:
        """The frames in file order; an uncompressed file's copied as they lie."""
        if compression_of(key) is not None:
            return batched(self.records(key, path))
        return self._read(key, path, None)

    def shuffled_frames(self, key: str, path: str, seed: int) -> Iterator[Frames] | None:
        """Every frame in a uniformly random order (seeded), holding 8 bytes per record. None
        for a compressed object: it cannot be read out of order."""
        if compression_of(key) is not None:
            return None
        return self._read(key, path, seed)

    def _read(self, key: str, path: str, seed: int | None) -> Iterator[Frames]:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            try:
                offsets = choice.KERNEL.index_file(fd, size)
                count = len(offsets) // 8
                if size > self.max_record_size:
                    self._check_lengths(key, offsets, size)
                if seed is None:
                    order = array("I", range(count)).tobytes()
                else:
                    order, _ = choice.KERNEL.permutation(count, seed)
                start = 0
                while start < count:
                    data, ends, start = choice.KERNEL.read_frames(
                        fd, size, offsets, order, start, self.batch_bytes
                    )
                    yield Frames.of(data, ends)
            except ValueError as exc:
                error = choice.framing_error(exc)
                raise CorruptObject(key, f"not a valid TFRecord file {error}") from None
        finally:
            os.close(fd)

    def _check_lengths(self, key: str, offsets: bytes, size: int) -> None:
        """Raise ``RecordTooLarge`` if a frame of the index is over the limit (the gaps are
        computed by ``map``: no Python code runs per record)."""
        starts = memoryview(offsets).cast("Q")
        ends = array("Q", starts[1:])
        ends.append(size)
        longest = max(map(operator.sub, ends, starts), default=0) - FRAME_OVERHEAD
        if longest > self.max_record_size:
            raise RecordTooLarge(key, "a record", longest, self.max_record_size, exact=True)
