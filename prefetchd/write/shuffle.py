"""Records of one object in a seeded random order, in bounded memory (pure)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator


def shuffled_records(
    records: Iterable[bytes], rng: random.Random, *, max_records: int, max_bytes: int
) -> Iterator[bytes]:
    """``records`` in a seeded random order, holding at most ``max_records`` records and
    ``max_bytes`` bytes (or one record, if that is larger) at a time.

    An object that fits is shuffled uniformly; a larger one is shuffled within a sliding
    buffer, like ``tf.data.Dataset.shuffle``. The same records and generator state give the
    same order every time, which crash recovery relies on (it resumes by counting records).
    """
    buffer: list[bytes] = []
    held = 0
    for record in records:
        buffer.append(record)
        held += len(record)
        while len(buffer) > max_records or held > max_bytes:
            i = rng.randrange(len(buffer))
            buffer[i], buffer[-1] = buffer[-1], buffer[i]
            out = buffer.pop()
            held -= len(out)
            yield out
    rng.shuffle(buffer)
    yield from buffer
