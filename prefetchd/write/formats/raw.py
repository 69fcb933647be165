"""``raw``: each object is one sample -> a tf.train.Example with ``key`` and ``data`` (bytes).

A ``.gz`` or ``.zst`` object's ``data`` is its decompressed content; ``key`` is the object key.
"""

from __future__ import annotations

from collections.abc import Iterator

from prefetchd.write.example import encode_example
from prefetchd.write.formats.compressed import open_object


class RawFormat:
    def records(self, key: str, path: str) -> Iterator[bytes]:
        with open_object(key, path) as f:
            data = f.read()
        yield encode_example({"key": key.encode("utf-8", "surrogateescape"), "data": data})
