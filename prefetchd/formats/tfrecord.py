"""``tfrecord``: every record of every input TFRecord file, CRC checked, passed through as is."""

from __future__ import annotations

from collections.abc import Iterator

from prefetchd.errors import CorruptObject
from prefetchd.tfrecord import FramingError, read_records

_BUFFER = 1024 * 1024


class TFRecordFormat:
    def records(self, key: str, path: str) -> Iterator[bytes]:
        with open(path, "rb", buffering=_BUFFER) as stream:
            try:
                yield from read_records(stream)
            except FramingError as exc:
                raise CorruptObject(key, f"not a valid TFRecord file {exc}") from None
