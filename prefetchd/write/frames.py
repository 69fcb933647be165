"""A batch of ready TFRecord frames: the unit the writer's stages hand each other (pure).

Formats turn an object into batches, the in-object shuffle reorders them, the writer mixes the
batches of its open objects into a shard. Per-record work happens inside one call per batch
(``choice.KERNEL``), so the Python cost per record is a small constant divided by the batch size.
"""

from __future__ import annotations

import functools
import itertools
import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prefetchd.kernel import choice
from prefetchd.kernel.framing import FOOTER_SIZE, HEADER_SIZE

BATCH_BYTES = 1024 * 1024  # formats cut their batches at about this many bytes


def as_ends(buffer: Any) -> memoryview:
    """A buffer of native uint64 (``bytes`` or ``array('Q')``) as an indexable memoryview."""
    return memoryview(buffer).cast("B").cast("Q")


@dataclass(frozen=True)
class Frames:
    """``data``: complete TFRecord frames back to back; ``ends[i]``: where frame ``i`` ends."""

    data: bytes
    ends: memoryview

    @classmethod
    def of(cls, data: bytes, ends: Any) -> Frames:
        return cls(data, as_ends(ends))

    def __len__(self) -> int:
        return len(self.ends)

    def start(self, i: int) -> int:
        """Where frame ``i`` starts in ``data``."""
        return self.ends[i - 1] if i else 0

    def largest(self) -> int:
        """The size of the largest frame (``map`` does the work: no Python code per frame)."""
        starts = itertools.chain((0,), self.ends[:-1])
        return max(map(operator.sub, self.ends, starts), default=0)

    @functools.cached_property
    def largest_frame(self) -> int:
        """``largest()``, worked out once per batch (the writer asks before each step)."""
        return self.largest()

    def frame_size(self, i: int) -> int:
        return self.ends[i] - self.start(i)

    def payloads(self) -> Iterator[bytes]:
        """Each frame's record data (for tests and the record-level API; not the hot path)."""
        view = memoryview(self.data)
        for i in range(len(self)):
            yield bytes(view[self.start(i) + HEADER_SIZE : self.ends[i] - FOOTER_SIZE])


EMPTY = Frames.of(b"", b"")


def without(batches: Iterable[Frames], skip: Sequence[Sequence[int]]) -> Iterator[Frames]:
    """``batches`` less the records whose index (counted over all batches) lies in one of the
    sorted ranges ``skip``: an object resumed on another host, those records already trained
    (``exactly_once/trained_objects.py``). Work per kept run of records, not per record."""
    first = 0  # index of the batch's first record
    for frames in batches:
        count = len(frames)
        keep, at = [], 0
        for a, b in skip:
            lo, hi = max(a - first, 0), min(b - first, count)
            if lo >= hi:
                continue
            if at < lo:
                keep.append((at, lo))
            at = max(at, hi)
        if at < count:
            keep.append((at, count))
        first += count
        if keep == [(0, count)]:
            yield frames
            continue
        data, ends, offset = [], array("Q"), 0
        for a, b in keep:
            start = frames.start(a)
            data.append(frames.data[start : frames.ends[b - 1]])
            shift = offset - start
            ends.extend(e + shift for e in frames.ends[a:b])
            offset += frames.ends[b - 1] - start
        if ends:
            yield Frames.of(b"".join(data), ends)


def batched(records: Iterable[bytes], max_bytes: int = BATCH_BYTES) -> Iterator[Frames]:
    """``records`` framed, in batches of about ``max_bytes`` (for formats that yield records
    one at a time: plugins, ``tar``, compressed ``tfrecord``)."""
    pending: list[bytes] = []
    size = 0
    for record in records:
        pending.append(record)
        size += len(record)
        if size >= max_bytes:
            # let go of the records before handing on their frames: a suspended generator
            # would otherwise hold a large record twice
            batch = Frames.of(*choice.KERNEL.frame_records(pending))
            pending, size = [], 0
            yield batch
    if pending:
        yield Frames.of(*choice.KERNEL.frame_records(pending))
