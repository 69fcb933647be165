"""``raw``: each object is one sample -> a tf.train.Example with ``key`` and ``data`` (bytes).

A ``.gz`` or ``.zst`` object's ``data`` is its decompressed content; ``key`` is the object key.
"""

from __future__ import annotations

from collections.abc import Iterator

from prefetchd.write import core
from prefetchd.write.example import encode_example, sorted_features
from prefetchd.write.formats.compressed import open_object
from prefetchd.write.frames import Frames


class RawFormat:
    def records(self, key: str, path: str) -> Iterator[bytes]:
        with open_object(key, path) as f:
            data = f.read()
        yield encode_example({"key": key.encode("utf-8", "surrogateescape"), "data": data})

    def frames(self, key: str, path: str) -> Iterator[Frames]:
        """The one record of ``records``, framed in one call (one copy of the data)."""
        with open_object(key, path, buffered=False) as f:
            data = f.read()
        sample = sorted_features({"key": key.encode("utf-8", "surrogateescape"), "data": data})
        yield Frames.of(*core.IMPL.frame_examples([sample]))
