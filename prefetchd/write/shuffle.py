"""Records of one object in a seeded random order, in bounded memory (pure).

The rule (a block shuffle with carry-over): frames are added to a block while it holds fewer
than ``max_records`` frames and ``max_bytes`` bytes (a frame is its record plus 16 bytes of
framing; one frame always fits an empty block). When the next frame does not fit, the block is
permuted (seeded SplitMix64 Fisher-Yates, ``twin.permutation``), the first ``n - n // 2``
frames of the permutation are emitted and the other ``n // 2`` stay as the start of the next
block. At the end of the object the last block is emitted whole. So:

- an object that fits in one block is shuffled uniformly;
- a record is never emitted before ``max_records`` records after it were read;
- a record stays in the buffer for a geometric number of blocks (half leave each time), like
  ``tf.data.Dataset.shuffle``'s sliding buffer;
- blocks depend only on the sequence of records, never on how a format cut its batches, and
  the same records and seed give the same order every time, which crash recovery relies on
  (it resumes by counting records).

Memory: the block (at most ``max_bytes``, or one larger record) plus the input batch being cut.
An input batch whose cut part is larger than a normal batch (a large record went out of it) is
cut down to its uncut rest before the next batch is given, and a one-record block that is a
whole input batch goes out as it is, not copied: so a large record is held once, not twice,
while the writer holds the batch with it. What the iterator keeps between batches is reported
in a ``Holding`` (the writer's memory bound counts it).
"""

from __future__ import annotations

import bisect
import random
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prefetchd.kernel import choice
from prefetchd.write.frames import BATCH_BYTES, EMPTY, Frames, batched


@dataclass
class Holding:
    """The bytes a batch iterator keeps between the batches it gives (its block and its input
    batch), besides the batch it gave last: set each time it gives one."""

    bytes: int = 0


@dataclass
class _Block:
    """The frames gathered so far: whole or partial input batches as ``take`` parts."""

    parts: list[tuple[bytes, Any, int, int]] = field(default_factory=list)
    count: int = 0
    held: int = 0

    def room(self, max_records: int, max_bytes: int) -> tuple[int, int]:
        return max_records - self.count, max_bytes - self.held


def _fits(batch: Frames, lo: int, block: _Block, max_records: int, max_bytes: int) -> int:
    """How many frames of ``batch`` from ``lo`` on fit in ``block`` (one, if it is empty)."""
    records, room = block.room(max_records, max_bytes)
    base = batch.start(lo)
    hi = min(len(batch), lo + max(0, records))
    n = bisect.bisect_right(batch.ends, base + room, lo, hi) - lo
    return n if n or block.count else 1


def shuffled_frames(
    batches: Iterable[Frames],
    seed: int,
    *,
    max_records: int,
    max_bytes: int,
    holding: Holding | None = None,
) -> Iterator[Frames]:
    """``batches``' frames in the seeded block-shuffle order of this module's docstring;
    ``holding`` (if given) tracks what is kept between batches."""
    state = seed
    block = _Block()
    meter = holding if holding is not None else Holding()
    large = 2 * max(max_bytes, BATCH_BYTES)  # more cut than this: keep only the rest
    batch = EMPTY
    for batch in batches:
        lo = 0
        while lo < len(batch):
            n = _fits(batch, lo, block, max_records, max_bytes)
            if n:
                block.parts.append((batch.data, batch.ends, lo, lo + n))
                block.count += n
                block.held += batch.ends[lo + n - 1] - batch.start(lo)
                lo += n
            if lo < len(batch):  # the next frame does not fit: the block is full
                out, block, state = _emit(block, state, final=False)
                if batch.start(lo) > large:
                    batch, lo = _rest(batch, lo), 0
                meter.bytes = _kept(block, batch)
                yield out
    batch = EMPTY
    if block.count:
        out, block, state = _emit(block, state, final=True)
        meter.bytes = 0
        yield out


def _rest(batch: Frames, lo: int) -> Frames:
    """Frames ``lo..`` of ``batch`` in a batch of their own (so the cut part can be freed)."""
    n = len(batch) - lo
    order = array("I", range(n)).tobytes()
    return Frames.of(*choice.KERNEL.take([(batch.data, batch.ends, lo, len(batch))], order, 0, n))


def _kept(block: _Block, batch: Frames) -> int:
    """The bytes of the buffers ``block`` and ``batch`` keep alive (each buffer once)."""
    buffers = {id(data): len(data) for data, _, _, _ in block.parts}
    buffers[id(batch.data)] = len(batch.data)
    return sum(buffers.values())


def _emit(block: _Block, state: int, *, final: bool) -> tuple[Frames, _Block, int]:
    """Permute ``block``: the frames to emit now, the block carried over, the new state."""
    n = block.count
    data, ends, lo, hi = block.parts[0]
    if len(block.parts) == 1 and lo == 0 and hi == len(ends) and n == 1:
        # one record that is a whole input batch (a one-record object, or a large record a
        # format gave alone): nothing to move; a permutation of one draws nothing
        return Frames(data, ends), _Block(), state
    order, state = choice.KERNEL.permutation(n, state)
    emit = n if final else n - n // 2
    out = Frames.of(*choice.KERNEL.take(block.parts, order, 0, emit))
    carry = _Block()
    if emit < n:
        data, ends = choice.KERNEL.take(block.parts, order, emit, n)
        kept = Frames.of(data, ends)
        carry = _Block([(kept.data, kept.ends, 0, len(kept))], len(kept), len(kept.data))
    return out, carry, state


def shuffled_records(
    records: Iterable[bytes], rng: random.Random, *, max_records: int, max_bytes: int
) -> Iterator[bytes]:
    """``records`` in the seeded order ``shuffled_frames`` gives their frames (seeded by 64 bits
    of ``rng``), holding at most ``max_records`` records and ``max_bytes`` bytes of frames (or
    one frame, if that is larger) at a time."""
    framed = batched(records)
    for frames in shuffled_frames(
        framed, rng.getrandbits(64), max_records=max_records, max_bytes=max_bytes
    ):
        yield from frames.payloads()
