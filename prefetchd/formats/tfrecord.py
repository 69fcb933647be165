"""``tfrecord``: every record of every input TFRecord file, CRC checked, passed through as is.

``.gz`` objects are GZIP TFRecord files (what ``TFRecordWriter`` writes with
``compression_type="GZIP"``); ``.zst`` objects are zstd-compressed TFRecord files.
"""

from __future__ import annotations

from collections.abc import Iterator

from prefetchd.errors import CorruptObject
from prefetchd.formats.compressed import open_object
from prefetchd.tfrecord import FramingError, read_records


class TFRecordFormat:
    def records(self, key: str, path: str) -> Iterator[bytes]:
        with open_object(key, path) as stream:
            try:
                yield from read_records(stream)
            except FramingError as exc:
                raise CorruptObject(key, f"not a valid TFRecord file {exc}") from None
