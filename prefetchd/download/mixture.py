"""Several sources in one epoch, by weight: which objects of each source epoch k reads, and in
which order. Pure functions of the listing's sizes, the weights, ``epochs.seed`` and k, so a
restart, another host or a resumed job computes the same plan (docs/sources.md).

**Streams.** Each source is an endless *stream*: its share of objects (sorted by key) in a
seeded order, *period* after period. Stream offsets are in bytes: the object at position i of
period m starts at ``m * S + (bytes before it in that period)``, S being the share's total.

**Epochs.** A weight is a share of an epoch's bytes. With weights ``w`` (normalized to sum 1)
epoch k is ``T`` bytes, ``T = max_s S_s / w_s`` (``on_exhausted: repeat``: every source gets
at least one period's bytes, the one that needs the most exactly one) or ``min_s S_s / w_s``
(``stop``: the epoch ends when the first source has given one period's bytes). Source s gives
``Q_s = w_s * T`` bytes: the objects whose stream offset lies in ``[start_s(k), start_s(k+1))``
(rounded up to whole bytes), where ``start_s(k)`` is the sum of ``Q_s`` over the epochs before
k (weights may change by epoch: ``weights_by_epoch``). So the windows of consecutive epochs
tile each stream: every object of every period is read in exactly one epoch, none is lost at an
epoch's end (what a source did not give in epoch k is the start of its part of epoch k+1), and
a source's share of an epoch's bytes is its weight to within one object.

**Orders.** A period starts a fresh seeded order only where an epoch's window starts on the
period's boundary; inside a window a period repeats the order of the one before. So a window is
a stretch of one periodic sequence: with ``stop`` (``Q_s <= S_s``) no object is read twice in
one epoch, with ``repeat`` (``Q_s >= S_s``) every object is read at least once in every epoch.
The source that sets T (with constant weights) has windows equal to periods: a fresh order
every epoch; another source keeps its order until one of its windows starts on a period's
boundary (the records inside each object, and the writers' mixing, change every epoch).

**Interleaving.** The epoch's objects are merged by where each one's middle falls in its
source's window, as a fraction of the window: a smooth schedule, so that any stretch of the
epoch holds each source's bytes in proportion (within about one object of each). Then the
order is *balanced* for the writers, which take objects by ``seq % writers``
(``write/arrivals.py``): left as merged, which objects of a source fall on even seqs is
chance, and over stretches of thousands of records a writer got a source's objects several
points above or below its share, which no draw inside a writer can smooth
(``bench.studies.mix_windows``: windows of 1,000 records 14 points off with two writers, 2
balanced). ``_balanced`` deals each source's objects alternately to the
even and odd positions, and again within each of those, ``BALANCE_LEVELS`` times: so with 2, 4
or 8 writers every writer gets each source's objects in turn, and an object moves at most a
few places from where the merge put it.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

from prefetchd.seeds import stable_hash

REPEAT, STOP = "repeat", "stop"
BALANCE_LEVELS = 3  # the order is balanced for 2, 4 and 8 writers


def epoch_weights(
    base: Sequence[float],
    names: Sequence[str],
    schedule: Sequence[tuple[int, Sequence[tuple[str, float]]]],
    epoch: int,
) -> tuple[Fraction, ...]:
    """The weights of ``epoch``, normalized to sum 1: the last schedule entry whose first epoch
    is at most ``epoch``, else ``base`` (the sources' own weights)."""
    weights = list(base)
    for first, entry in schedule:
        if first <= epoch:
            given = dict(entry)
            weights = [given[name] for name in names]
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    return tuple(w / total for w in exact)


def quotas(
    totals: Sequence[int], weights: Sequence[Fraction], on_exhausted: str
) -> tuple[Fraction, ...]:
    """Bytes each source gives to one epoch with these (normalized) weights."""
    lengths = [Fraction(size) / w for size, w in zip(totals, weights, strict=True)]
    epoch_bytes = max(lengths) if on_exhausted == REPEAT else min(lengths)
    return tuple(w * epoch_bytes for w in weights)


@dataclass(frozen=True)
class Streams:
    """The sources' sizes and weights over every epoch: where each epoch's window of each
    stream starts, and which seeded order each period has."""

    sizes: tuple[array[int], ...]  # each source's object sizes, in key order
    base: tuple[float, ...]
    names: tuple[str, ...]
    schedule: tuple[tuple[int, tuple[tuple[str, float], ...]], ...]
    on_exhausted: str
    seed: int
    shuffle: bool = True

    @property
    def totals(self) -> tuple[int, ...]:
        return tuple(sum(s) for s in self.sizes)

    def quotas(self, epoch: int) -> tuple[Fraction, ...]:
        weights = epoch_weights(self.base, self.names, self.schedule, epoch)
        return quotas(self.totals, weights, self.on_exhausted)

    def starts(self, epoch: int) -> tuple[Fraction, ...]:
        """Stream offsets (exact) where ``epoch``'s windows start: the sum of the quotas of
        the epochs before it, taken segment by segment of the schedule."""
        changes = sorted({0, *(first for first, _ in self.schedule if first < epoch), epoch})
        start = [Fraction(0)] * len(self.sizes)
        for a, b in itertools.pairwise(changes):
            for s, q in enumerate(self.quotas(a)):
                start[s] += q * (b - a)
        return tuple(start)

    def window(self, source: int, epoch: int) -> tuple[int, int]:
        """``[first, end)`` stream offsets of ``source`` in ``epoch``, in whole bytes."""
        return (
            math.ceil(self.starts(epoch)[source]),
            math.ceil(self.starts(epoch + 1)[source]),
        )

    def order_of(self, source: int, period: int) -> int:
        """Which seeded order ``period`` of ``source`` has: that of the last period at or
        before it whose start is also an epoch's start (no window straddles it), so a window
        never holds two orders."""
        total, target = self.totals[source], period * self.totals[source]
        safe, epoch = 0, 0
        while True:
            first = math.ceil(self.starts(epoch)[source])
            if first > target:
                return safe
            if first % total == 0:
                safe = first // total
            epoch += 1

    def window_order(self, source: int, epoch: int) -> int:
        """``order_of`` every period of ``epoch``'s window of ``source`` (one: no boundary
        inside a window starts an order), found from the epoch's start backwards."""
        total = self.totals[source]
        for before in range(epoch, -1, -1):
            first = math.ceil(self.starts(before)[source])
            if first % total == 0:
                return first // total
        return 0

    def permutation(self, source: int, order: int) -> array[int]:
        """Key-order positions of ``source`` in its seeded order number ``order``."""
        positions = array("Q", range(len(self.sizes[source])))
        if self.shuffle:
            random.Random(stable_hash("source", self.seed, source, order)).shuffle(positions)
        return positions

    def picks(self, source: int, epoch: int) -> Iterator[tuple[int, int, int]]:
        """``(period, row, offset in the window)`` of each object ``source`` gives ``epoch``."""
        first, end = self.window(source, epoch)
        if end <= first:
            return
        total, sizes = self.totals[source], self.sizes[source]
        positions = self.permutation(source, self.window_order(source, epoch))
        for period in range(first // total, (end - 1) // total + 1):
            offset = period * total
            for row in positions:
                if offset >= end:
                    break
                if offset >= first:
                    yield period, row, offset - first
                offset += sizes[row]


@dataclass
class EpochMix:
    """One epoch's objects in order: for each position, its source, period and key-order row
    in that source's share (13 bytes an object)."""

    sources: array[int]
    periods: array[int]
    rows: array[int]

    def __len__(self) -> int:
        return len(self.rows)

    def at(self, seq: int) -> tuple[int, int, int]:
        return self.sources[seq], self.periods[seq], self.rows[seq]


def epoch_mix(streams: Streams, epoch: int, *, balanced: bool = True) -> EpochMix:
    """``epoch``'s objects of every source, interleaved by where each one's middle falls in its
    source's window (a fraction of the window; ties go to the lower source index), then (with
    several sources, unless ``balanced`` is off: the study's control) balanced for the
    writers (``_balanced``)."""
    quota = streams.quotas(epoch)

    def keyed(source: int) -> Iterator[tuple[float, int, int, int]]:
        window = float(quota[source]) or 1.0
        sizes = streams.sizes[source]
        for period, row, at in streams.picks(source, epoch):
            yield (at + sizes[row] / 2) / window, source, period, row

    mix = EpochMix(array("B"), array("L"), array("Q"))
    for _, source, period, row in heapq.merge(*(keyed(s) for s in range(len(streams.sizes)))):
        mix.sources.append(source)
        mix.periods.append(period)
        mix.rows.append(row)
    if not balanced or len(streams.sizes) < 2:
        return mix
    return balanced_mix(mix)


def balanced_order(mix: EpochMix) -> array[int]:
    """The places of ``mix`` (in merged order) in the order balanced for the writers."""
    return _balanced(mix.sources, array("L", range(len(mix))), BALANCE_LEVELS)


def balanced_mix(mix: EpochMix) -> EpochMix:
    """``mix`` (in merged order) balanced for the writers (``_balanced``)."""
    order = balanced_order(mix)
    return EpochMix(
        array("B", (mix.sources[i] for i in order)),
        array("L", (mix.periods[i] for i in order)),
        array("Q", (mix.rows[i] for i in order)),
    )


def _balanced(sources: array[int], order: array[int], levels: int) -> array[int]:
    """``order`` (positions, ascending) with each source's positions dealt alternately to the
    even and the odd places (the first of a pair to the shorter side), each side balanced the
    same way ``levels - 1`` more times, then the two zipped back together.

    The sides' lengths differ only by the sources' unpaired last positions (a pair adds one to
    each), so moving unpaired ones across makes the even side as long as the odd one or one
    longer without unbalancing any source (its unpaired position is alone on either side): the
    zip then puts every position of a side on places of one parity, at every level (a longer
    odd side, or one longer by two, put its last positions on places of both)."""
    if levels == 0 or len(order) < 2:
        return order
    halves = (array("L"), array("L"))
    pending: dict[int, int] = {}  # source -> the side its unpaired position went to
    unpaired: dict[int, int] = {}  # source -> that position
    for i in order:
        source = sources[i]
        side = pending.pop(source, None)
        if side is None:
            side = pending[source] = 0 if len(halves[0]) <= len(halves[1]) else 1
            unpaired[source] = i
        else:
            side = 1 - side
            del unpaired[source]
        halves[side].append(i)
    for source, side in pending.items():
        here, there = halves[side], halves[1 - side]
        if len(here) - len(there) > (1 if side == 0 else 0):
            i = unpaired[source]
            del here[bisect.bisect_left(here, i)]
            there.insert(bisect.bisect_left(there, i), i)
    even, odd = (_balanced(sources, half, levels - 1) for half in halves)
    out = array("L")
    for a, b in zip(even, odd, strict=False):
        out.append(a)
        out.append(b)
    out.extend(even[len(odd) :] if len(even) > len(odd) else odd[len(even) :])
    return out
