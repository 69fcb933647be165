"""``tfrecord``: every record of every input TFRecord file, CRC checked, passed through as is.

``.gz`` objects are GZIP TFRecord files (what ``TFRecordWriter`` writes with
``compression_type="GZIP"``); ``.zst`` objects are zstd-compressed TFRecord files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from random import Random

from prefetchd.errors import CorruptObject
from prefetchd.tfrecord import FramingError, index_records, read_record_at, read_records
from prefetchd.write.formats.compressed import compression_of, open_object


class TFRecordFormat:
    def records(self, key: str, path: str) -> Iterator[bytes]:
        with open_object(key, path) as stream:
            try:
                yield from read_records(stream)
            except FramingError as exc:
                raise CorruptObject(key, f"not a valid TFRecord file {exc}") from None

    def shuffled(self, key: str, path: str, rng: Random) -> Iterator[bytes] | None:
        """Every record in a uniformly random order, holding 8 bytes per record: the frames
        are indexed, the offsets shuffled, and each record read where it lies. None for a
        compressed object (it cannot be read out of order)."""
        if compression_of(key) is not None:
            return None
        return self._shuffled(key, path, rng)

    def _shuffled(self, key: str, path: str, rng: Random) -> Iterator[bytes]:
        fd = os.open(path, os.O_RDONLY)
        try:
            try:
                offsets = index_records(fd, os.fstat(fd).st_size)
                rng.shuffle(offsets)
                for offset in offsets:
                    yield read_record_at(fd, offset)
            except FramingError as exc:
                raise CorruptObject(key, f"not a valid TFRecord file {exc}") from None
        finally:
            os.close(fd)
