"""The record shares a writer's draw by source aims at (``sources:``): ``SourceRates``.

The epoch's plan weighs the sources by bytes (``download/mixture.py``), and its download order
holds each source's bytes in proportion in any stretch; so records of source ``s`` arrive at a
rate proportional to its bytes times its records per byte. A writer that takes each source's
records at that rate keeps what it has open of each source steady, and any window of its
records holds each source in proportion (the draw: ``kernel.twin.source_picks``). Neither
number is in the plan as records, so both are estimated from what the writer has seen:

- a source's bytes: the listed sizes (the downloader's meta) of the objects of the epoch it
  opened, which follow the weights to within an object per source;
- its records per listed byte: the records per frame byte of the batches its objects gave,
  times how the frame bytes of its drained objects compare to their listed size (1 until one
  drains: uncompressed TFRecord frames are the listed bytes; tar headers, gzip are not).

Numbers per batch and per object, never per record.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from prefetchd.write.frames import Frames
from prefetchd.write.objects import OpenObject

RATE_SCALE = 1 << 32  # the rates of the sources present add up to about this


class SourceRates:
    """Per source: the records and frame bytes of the batches seen, the listed and frame
    bytes of its drained objects; per epoch: the listed bytes of the objects opened."""

    def __init__(self) -> None:
        self.seen_records: list[int] = []
        self.seen_bytes: list[int] = []
        self.drained_listed: list[int] = []
        self.drained_frames: list[int] = []
        self.opened: dict[int, list[int]] = {}  # epoch -> listed bytes opened, per source
        # The sources the lists above hold (their length): per object and per batch a
        # comparison with it, not a call (``_grow``, ``len``): one-record objects pay these
        # per object (``test_writer_batches``).
        self.sources = 0

    def _grow(self, source: int) -> None:
        while len(self.seen_records) <= source:
            for counts in (self.seen_records, self.seen_bytes):
                counts.append(0)
            for counts in (self.drained_listed, self.drained_frames):
                counts.append(0)
        self.sources = len(self.seen_records)

    def opened_object(self, obj: OpenObject) -> None:
        """``obj`` was opened: its listed bytes count for its source in its epoch."""
        source = obj.source
        if source >= self.sources:
            self._grow(source)
        per_source = self.opened.setdefault(obj.epoch, [])
        if source >= len(per_source):
            per_source.extend([0] * (source + 1 - len(per_source)))
        size = obj.meta.get("size")  # its listed size: a positive int, else unknown
        if isinstance(size, int) and size > 0:
            per_source[source] += size

    def batch(self, obj: OpenObject, frames: Frames) -> None:
        """``obj`` gave the mixer the batch ``frames``."""
        source = obj.source
        if source >= self.sources:
            self._grow(source)
        records, nbytes = len(frames.ends), len(frames.data)  # ``len(frames)``: no __len__
        self.seen_records[source] += records
        self.seen_bytes[source] += nbytes
        obj.seen_records += records
        obj.seen_bytes += nbytes

    def drained(self, obj: OpenObject) -> None:
        """``obj`` gave its last record: how its frames compare to its listed size."""
        size = obj.meta.get("size")  # its listed size: a positive int, else unknown
        if isinstance(size, int) and size > 0 and obj.seen_bytes:
            if obj.source >= self.sources:
                self._grow(obj.source)
            self.drained_listed[obj.source] += size
            self.drained_frames[obj.source] += obj.seen_bytes

    def state(self, open_objects: Iterable[OpenObject]) -> dict[str, object]:
        """What the estimates stand on, for a commit in the replayable order: a writer
        restarted from the commit reopens only the objects open then, each from its journalled
        position, so it must be given back the figures of the batches and objects before."""
        return {
            "seen": [self.seen_records, self.seen_bytes],
            "drained": [self.drained_listed, self.drained_frames],
            "opened": [[epoch, per_source] for epoch, per_source in self.opened.items()],
            "objects": [[o.name, o.seen_records, o.seen_bytes] for o in open_objects],
        }

    def restore(self, saved: object, open_objects: Iterable[OpenObject]) -> None:
        """Put back what ``state`` saved once the same objects are open again (their reopening
        counted afresh is replaced by what the uninterrupted writer had counted)."""
        if not isinstance(saved, dict):
            return
        (records, nbytes), (listed, frames) = saved["seen"], saved["drained"]
        self.seen_records, self.seen_bytes = list(map(int, records)), list(map(int, nbytes))
        self.drained_listed, self.drained_frames = list(map(int, listed)), list(map(int, frames))
        self.sources = len(self.seen_records)
        self.opened = {int(e): list(map(int, per)) for e, per in saved["opened"]}
        seen = {str(name): (int(r), int(b)) for name, r, b in saved["objects"]}
        for obj in open_objects:
            if obj.name in seen:
                obj.seen_records, obj.seen_bytes = seen[obj.name]

    def forget_before(self, epoch: int) -> None:
        for old in [e for e in self.opened if e < epoch]:
            del self.opened[old]

    def rates(self, epoch: int, sources: Iterable[int]) -> bytes | None:
        """Native uint64 per source index (up to the highest of ``sources``): each of
        ``sources``'s rate of records, scaled so they add up to about ``RATE_SCALE`` (each at
        least 1); None while one of them has no estimate yet (no listed bytes opened or no
        batch seen)."""
        present = sorted(set(sources))
        opened = self.opened.get(epoch, [])
        raw: dict[int, float] = {}
        for s in present:
            if s >= len(opened) or not opened[s] or not self.seen_bytes[s]:
                return None
            per_frame_byte = self.seen_records[s] / self.seen_bytes[s]
            listed_per_frame = (
                self.drained_listed[s] / self.drained_frames[s] if self.drained_frames[s] else 1.0
            )
            raw[s] = opened[s] * per_frame_byte / listed_per_frame
        total = sum(raw.values())
        rates = array("Q", [0] * (present[-1] + 1))
        for s, r in raw.items():
            rates[s] = max(1, round(r / total * RATE_SCALE))
        return rates.tobytes()
