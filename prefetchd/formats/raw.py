"""``raw``: each object is one sample -> a tf.train.Example with ``key`` and ``data`` (bytes)."""

from __future__ import annotations

from collections.abc import Iterator

from prefetchd.example import encode_example


class RawFormat:
    def records(self, key: str, path: str) -> Iterator[bytes]:
        with open(path, "rb") as f:
            data = f.read()
        yield encode_example({"key": key.encode("utf-8", "surrogateescape"), "data": data})
