"""Which objects this host reads, and in which order each epoch: pure functions.

Hosts split the key space by a hash of the key, so every host decides alone (no coordinator)
and adding a key to the bucket never moves other keys between hosts. Each epoch's order is the
key-sorted share shuffled with a generator seeded from ``(seed, epoch)``, so the same seed,
hosts and data give the same order on every run (docs/reliability.md, invariant 6).
"""

from __future__ import annotations

import fnmatch
import random
import re
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prefetchd.seeds import epoch_seed, stable_hash


@dataclass(frozen=True, slots=True)
class SourceObject:
    """One object of the source as listed: its full key, size and ETag (if the store gave one)."""

    key: str
    size: int
    etag: str | None = None


def host_of(key: str, num_workers: int) -> int:
    """The worker index (0..num_workers-1) that owns ``key``."""
    return stable_hash("host", key) % num_workers


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
