"""Which objects ``download.keep`` keeps across epochs: pure functions, no I/O.

Every epoch reads each object of the host's share exactly once, in an order known in advance.
Over such a pass no policy can hit more than C bytes per epoch with C bytes of room: a hit in
epoch e+1 is an object on disk when e+1 starts (at most C bytes), since an object fetched during
e+1 is not read again in e+1. A *fixed* subset of the share, as large as fits in C, reaches that
bound in every epoch after the first, whatever the order (hits >= C - one object's size), and
it never evicts, so it never re-downloads what it kept. LRU, the policy of the usual caches,
evicts each object shortly before its next use: with one full pass per epoch it hits about
C/S x C/S of the bytes under shuffling and nothing at all with a repeated order
(``lru_epoch_hits`` simulates it for the benchmark's comparison).

The subset is chosen by a stable hash of the key alone (not of ``epochs.seed``), so a new job
with another seed on the same ``cache_dir`` reuses what an earlier one kept, and an object added
to the bucket displaces at most the objects that rank after it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from prefetchd.seeds import stable_hash


def keep_rank(key: str) -> int:
    """Where ``key`` stands in the order objects are chosen for keeping (lower first)."""
    return stable_hash("keep", key)


def choose_kept(ranks: Sequence[int], sizes: Sequence[int], capacity: int) -> bytearray:
    """Flags (one byte per object, 1 = keep) of the objects to keep in ``capacity`` bytes.

    Objects are taken by ascending rank while they fit; one that does not fit is passed over
    and smaller ones after it may still fill the room. The kept bytes never exceed
    ``capacity``, and fall short of ``min(capacity, sum(sizes))`` by less than the largest
    object.
    """
    flags = bytearray(len(sizes))
    room = capacity
    for i in sorted(range(len(sizes)), key=ranks.__getitem__):
        if room <= 0:
            break
        if sizes[i] <= room:
            flags[i] = 1
            room -= sizes[i]
    return flags


def kept_bytes(flags: Sequence[int], sizes: Sequence[int]) -> int:
    return sum(size for flag, size in zip(flags, sizes, strict=True) if flag)


def hit_bound(capacity: int, share: int, slack: float = 0.05) -> float:
    """The least byte hit ratio an epoch after the first must reach: min(1, C/S) - slack."""
    return min(1.0, capacity / share) - slack if share else 1.0


def subset_epoch_hits(
    orders: Iterable[Sequence[int]], sizes: Sequence[int], flags: Sequence[int]
) -> list[int]:
    """Bytes hit in each epoch by the fixed subset ``flags``: nothing in the first epoch (the
    store starts empty), then every kept object read."""
    hits: list[int] = []
    kept: set[int] = set()
    for order in orders:
        hit = 0
        for i in order:
            if i in kept:
                hit += sizes[i]
            elif flags[i]:
                kept.add(i)
        hits.append(hit)
    return hits


def lru_epoch_hits(
    orders: Iterable[Sequence[int]], sizes: Sequence[int], capacity: int
) -> list[int]:
    """Bytes hit in each epoch by a least-recently-used store of ``capacity`` bytes that
    admits every object read (what Mountpoint's and MosaicML Streaming's caches do)."""
    store: OrderedDict[int, int] = OrderedDict()
    used = 0
    hits: list[int] = []
    for order in orders:
        hit = 0
        for i in order:
            if i in store:
                store.move_to_end(i)
                hit += sizes[i]
                continue
            if sizes[i] > capacity:
                continue
            while used + sizes[i] > capacity:
                _, evicted = store.popitem(last=False)
                used -= evicted
            store[i] = sizes[i]
            used += sizes[i]
        hits.append(hit)
    return hits
