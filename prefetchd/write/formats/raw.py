"""``raw``: each object is one sample -> a tf.train.Example with ``key`` and ``data`` (bytes).

A ``.gz`` or ``.zst`` object's ``data`` is its decompressed content; ``key`` is the object key.
An object larger than ``output.max_record_size`` (decompressed) raises ``RecordTooLarge``
before it is read whole: an uncompressed one by its size on disk, a compressed one after at
most ``max_record_size + 1`` bytes were inflated, so a decompression bomb costs one limit of
memory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prefetchd.config import DEFAULT_MAX_RECORD_SIZE
from prefetchd.kernel import choice
from prefetchd.kernel.example_encode import FeatureValue, encode_example, sorted_features
from prefetchd.write.formats.compressed import compression_of, open_object
from prefetchd.write.frames import Frames
from prefetchd.write.quarantine import RecordTooLarge


class RawFormat:
    # One record per object: any seed orders it the same (``formats.one_record``), so the
    # writer draws no seed for it and passes it through no block shuffle.
    one_record = True

    def __init__(self, max_record_size: int = DEFAULT_MAX_RECORD_SIZE) -> None:
        self.max_record_size = max_record_size

    def read_whole_first(self, key: str, path: str) -> bool:
        """One record per object: it is whole or it is not written."""
        return True

    def records(self, key: str, path: str) -> Iterator[bytes]:
        data = self._data(key, path, buffered=True)
        yield encode_example({"key": _key_bytes(key), "data": data})

    def frames(self, key: str, path: str) -> Iterator[Frames]:
        """The one record of ``records``, framed in one call (``one_frame``)."""
        yield self.one_frame(key, path)

    def one_frame(self, key: str, path: str | os.PathLike[str]) -> Frames:
        """``frames``' one batch, returned: the writer's lane for a one-record object takes it
        without a generator (``ObjectReader.start``). An uncompressed object is read straight
        into its frame (``frame_file_example``): no copy of its bytes in between."""
        if key[-3:] != ".gz" and key[-4:] != ".zst":  # ``compression_of(key) is None``
            batch = self._read_framed(key, path)
            if batch is not None:
                return batch
        data = self._data(key, os.fspath(path), buffered=False)
        sample = sorted_features({"key": _key_bytes(key), "data": data})
        frames = Frames.of(*choice.KERNEL.frame_examples([sample]))
        del data, sample  # not held twice while the writer holds the frame
        return frames

    def _read_framed(self, key: str, path: str | os.PathLike[str]) -> Frames | None:
        """The uncompressed object's frame, its bytes read into it; None if it changed size
        while it was read (``_data`` then reads it the general way)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size > self.max_record_size:
                self._checked_size(key, size)  # raises
            # sorted, as sorted_features; ``_key_bytes`` inline (once per small object)
            sample: list[tuple[bytes, FeatureValue | None]] = [
                (b"data", None),
                (b"key", key.encode("utf-8", "surrogateescape")),
            ]
            batch = choice.KERNEL.frame_file_example(sample, fd, size)
        finally:
            os.close(fd)
        if batch is None:
            return None
        data, ends = batch  # ``Frames.of(*batch)``, inline: per small object
        return Frames(data, memoryview(ends).cast("B").cast("Q"))

    def _checked_size(self, key: str, size: int) -> int:
        """An uncompressed object's ``size``; raises ``RecordTooLarge`` over the limit."""
        if size > self.max_record_size:
            raise RecordTooLarge(key, "raw object", size, self.max_record_size, exact=True)
        return size

    def _data(self, key: str, path: str, *, buffered: bool) -> bytes:
        """The object's (decompressed) bytes; raises ``RecordTooLarge`` over the limit."""
        limit = self.max_record_size
        most = limit  # bytes to ask for: the limit, or an uncompressed object's size
        if compression_of(key) is None:
            size = self._checked_size(key, os.stat(path).st_size)
            # read(n) allocates n bytes up front: ask for what is there (+1 to see growth),
            # not for the whole limit, which costs a 64 MiB allocation per small object
            most = size
        with open_object(key, path, buffered=buffered) as f:
            data = f.read(most + 1)
            if most < limit and len(data) > most:  # grew since the stat: read on, to the limit
                data += f.read(limit - len(data) + 1)
        if len(data) > limit:
            raise RecordTooLarge(key, "raw object (decompressed)", len(data), limit)
        return data


def _key_bytes(key: str) -> bytes:
    """The ``key`` feature: the object key's bytes (a key that was not UTF-8 keeps its own)."""
    return key.encode("utf-8", "surrogateescape")
