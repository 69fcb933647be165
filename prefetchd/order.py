"""Which objects this host reads, and in which order each epoch: pure functions.

Hosts split the key space by a hash of the key, so every host decides alone (no coordinator)
and adding a key to the bucket never moves other keys between hosts. Each epoch's order is the
key-sorted share shuffled with a generator seeded from ``(seed, epoch)``, so the same seed,
hosts and data give the same order on every run (DESIGN.md invariant 6).
"""

from __future__ import annotations

import fnmatch
import hashlib
import random
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceObject:
    """One object of the source as listed: its full key, size and ETag (if the store gave one)."""

    key: str
    size: int
    etag: str | None = None


def _hash64(*parts: object) -> int:
    text = "\x00".join(str(p) for p in parts).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def host_of(key: str, num_workers: int) -> int:
    """The worker index (0..num_workers-1) that owns ``key``."""
    return _hash64("host", key) % num_workers


def in_share(key: str, num_workers: int, worker_index: int) -> bool:
    return num_workers == 1 or host_of(key, num_workers) == worker_index


def matches(relative_key: str, patterns: Iterable[str]) -> bool:
    """Whether the key below the prefix matches any include glob (``*`` also crosses ``/``)."""
    return any(fnmatch.fnmatchcase(relative_key, p) for p in patterns)


def matcher(patterns: Iterable[str]) -> Callable[[str], bool]:
    """``matches`` with the patterns compiled once, for listings of millions of keys."""
    patterns = list(patterns)
    if "*" in patterns:
        return lambda _key: True
    match = re.compile("|".join(fnmatch.translate(p) for p in patterns)).match
    return lambda key: match(key) is not None


def epoch_seed(seed: int, epoch: int) -> int:
    return _hash64("epoch", seed, epoch)


def epoch_order(
    objects: Sequence[SourceObject], *, seed: int, epoch: int, shuffle: bool
) -> list[SourceObject]:
    """This epoch's download order: independent of the order the listing arrived in."""
    ordered = sorted(objects, key=lambda o: o.key)
    return [
        ordered[i] for i in epoch_permutation(len(ordered), seed=seed, epoch=epoch, shuffle=shuffle)
    ]


def epoch_permutation(count: int, *, seed: int, epoch: int, shuffle: bool) -> array[int]:
    """Positions ``0..count-1`` (into the key-sorted share) in this epoch's order.

    The same permutation ``epoch_order`` applies, as 8 bytes per object instead of a list.
    """
    order = array("Q", range(count))
    if shuffle:
        random.Random(epoch_seed(seed, epoch)).shuffle(order)
    return order


def mixing_rng(seed: int, epoch: int, writer: int) -> random.Random:
    """The generator a writer uses to pick which open object gives the next record."""
    return random.Random(_hash64("mix", seed, epoch, writer))


def object_rng(seed: int, epoch: int, key: str) -> random.Random:
    """The generator that shuffles the records inside one object in one epoch."""
    return random.Random(_hash64("records", seed, epoch, key))


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
