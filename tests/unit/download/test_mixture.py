"""The plan of an epoch of several sources (download/mixture.py): pure arithmetic, checked on
random shares and weights."""

from __future__ import annotations

from array import array
from collections import Counter
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from prefetchd.download.mixture import REPEAT, STOP, Streams, epoch_mix, epoch_weights, quotas

# Bounded ratios: an epoch of ``repeat`` reads a small, up-weighted source many times over.
sizes_of_a_source = st.lists(st.integers(500, 5000), min_size=1, max_size=30)
weights = st.floats(0.5, 2.0, allow_nan=False)


def streams(
    shares: list[list[int]],
    ws: list[float],
    on_exhausted: str,
    schedule: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = (),
) -> Streams:
    return Streams(
        sizes=tuple(array("Q", s) for s in shares),
        base=tuple(ws),
        names=tuple(f"s{i}" for i in range(len(shares))),
        schedule=schedule,
        on_exhausted=on_exhausted,
        seed=7,
    )


@st.composite
def jobs(draw: st.DrawFn) -> Streams:
    count = draw(st.integers(2, 4))
    shares = [draw(sizes_of_a_source) for _ in range(count)]
    ws = [draw(weights) for _ in range(count)]
    return streams(shares, ws, draw(st.sampled_from([REPEAT, STOP])))


def epoch_bytes(plan: Streams, epoch: int) -> list[int]:
    got = [0] * len(plan.sizes)
    mix = epoch_mix(plan, epoch)
    for source, _, row in zip(mix.sources, mix.periods, mix.rows, strict=True):
        got[source] += plan.sizes[source][row]
    return got


@settings(max_examples=60, deadline=None)
@given(jobs())
def test_each_source_gives_its_weight_of_the_epoch_to_within_one_object(plan: Streams) -> None:
    for epoch in range(3):
        got = epoch_bytes(plan, epoch)
        for source, q in enumerate(plan.quotas(epoch)):
            largest = max(plan.sizes[source])
            assert abs(got[source] - q) <= largest, (source, got, q)


@settings(max_examples=60, deadline=None)
@given(jobs())
def test_the_epochs_tile_every_stream_so_nothing_is_lost_or_read_twice(plan: Streams) -> None:
    """Over epochs 0..3 each source gives exactly the objects of its stream, in order, from
    offset 0 up to where epoch 4 starts: none skipped at an epoch's end, none given twice."""
    for source in range(len(plan.sizes)):
        given_ = [(p, r) for e in range(4) for p, r, _ in plan.picks(source, e)]
        end = plan.window(source, 3)[1]
        expected, offset, period = [], 0, 0
        while offset < end:
            for row in plan.permutation(source, plan.order_of(source, period)):
                if offset >= end:
                    break
                expected.append((period, row))
                offset += plan.sizes[source][row]
            period += 1
        assert given_ == expected


@settings(max_examples=60, deadline=None)
@given(jobs())
def test_a_window_has_one_order(plan: Streams) -> None:
    for source in range(len(plan.sizes)):
        for epoch in range(4):
            first, end = plan.window(source, epoch)
            total = plan.totals[source]
            periods = range(first // total, (end - 1) // total + 1)
            assert {plan.order_of(source, p) for p in periods} == {plan.window_order(source, epoch)}


@settings(max_examples=60, deadline=None)
@given(jobs())
def test_with_stop_no_object_is_read_twice_in_an_epoch(plan: Streams) -> None:
    plan = Streams(plan.sizes, plan.base, plan.names, (), STOP, plan.seed)
    for epoch in range(4):
        mix = epoch_mix(plan, epoch)
        seen = Counter(zip(mix.sources, mix.rows, strict=True))
        assert max(seen.values(), default=1) == 1, (epoch, seen.most_common(2))


@settings(max_examples=40, deadline=None)
@given(jobs())
def test_with_repeat_every_object_is_read_at_least_once_an_epoch(plan: Streams) -> None:
    """The source that sets the epoch's length is read exactly once, in a fresh order each
    epoch; the others at least once in all (they are up-weighted)."""
    plan = Streams(plan.sizes, plan.base, plan.names, (), REPEAT, plan.seed)
    lengths = [Fraction(sum(s)) / Fraction(w) for s, w in zip(plan.sizes, plan.base, strict=True)]
    longest = lengths.index(max(lengths))
    orders = set()
    for epoch in range(3):
        mix = epoch_mix(plan, epoch)
        rows = [r for s, r in zip(mix.sources, mix.rows, strict=True) if s == longest]
        assert sorted(rows) == list(range(len(plan.sizes[longest])))
        orders.add(tuple(rows))
        for source in range(len(plan.sizes)):
            got = {r for s, r in zip(mix.sources, mix.rows, strict=True) if s == source}
            assert len(got) == len(plan.sizes[source])
    assert len(plan.sizes[longest]) < 4 or len(orders) > 1


def test_the_interleaving_keeps_every_stretch_in_proportion() -> None:
    """Any prefix of the epoch holds each source's bytes in proportion to within about one
    object per source: sources are interleaved, not one after another."""
    plan = streams([[100] * 600, [300] * 100, [50] * 200], [0.6, 0.3, 0.1], REPEAT)
    mix = epoch_mix(plan, 0)
    quota = plan.quotas(0)
    done = [0, 0, 0]
    for seq in range(len(mix)):
        source, _, row = mix.at(seq)
        done[source] += plan.sizes[source][row]
        progress = sum(done) / float(sum(quota))
        for s in range(3):
            assert abs(done[s] - progress * float(quota[s])) <= 2 * 300, (seq, done)


@settings(max_examples=30, deadline=None)
@given(jobs())
def test_each_of_2_4_or_8_writers_gets_each_source_s_objects_in_turn(plan: Streams) -> None:
    """Writers take objects ``seq % writers``: the balanced order deals each source's objects
    evenly to them (to within one), the same objects as merged, each moved only a few places
    (bench.studies.mix_windows: left to chance, a writer's share of a source drifted by
    several points over stretches of an epoch)."""
    mix, merged = epoch_mix(plan, 0), epoch_mix(plan, 0, balanced=False)
    entries = list(zip(mix.sources, mix.periods, mix.rows, strict=True))
    before = list(zip(merged.sources, merged.periods, merged.rows, strict=True))
    assert sorted(entries) == sorted(before)
    where = {entry: i for i, entry in enumerate(before)}
    assert max(abs(where[entry] - i) for i, entry in enumerate(entries)) <= 8 * len(plan.sizes)
    for writers in (2, 4, 8):
        for source in range(len(plan.sizes)):
            turns = Counter(i % writers for i, s in enumerate(mix.sources) if s == source)
            counts = [turns[w] for w in range(writers)]
            assert max(counts) - min(counts) <= 1, (writers, source, counts)


def test_one_source_s_order_is_not_rebalanced() -> None:
    plan = streams([[100, 200, 300, 400] * 10], [1.0], REPEAT)
    assert epoch_mix(plan, 0) == epoch_mix(plan, 0, balanced=False)


def test_weights_by_epoch_apply_from_their_epoch_and_the_streams_go_on() -> None:
    schedule = ((2, (("s0", 1.0), ("s1", 3.0))),)
    plan = streams([[10] * 100, [10] * 100], [3.0, 1.0], STOP, schedule)
    assert epoch_weights(plan.base, plan.names, schedule, 1) == (Fraction(3, 4), Fraction(1, 4))
    assert epoch_weights(plan.base, plan.names, schedule, 5) == (Fraction(1, 4), Fraction(3, 4))
    # stop: s0 gives one pass, s1 a third of its (whole 10-byte objects starting in it)
    assert epoch_bytes(plan, 0) == [1000, 340]
    assert epoch_bytes(plan, 2) == [340, 1000]
    # the stream of s1 goes on where epoch 1 left it: nothing lost at the change
    end_of_1 = plan.window(1, 1)[1]
    assert plan.window(1, 2)[0] == end_of_1


def test_quotas_repeat_and_stop() -> None:
    w = (Fraction(1, 2), Fraction(1, 2))
    # repeat: the small source is read 3 times; stop: the large one a third per epoch
    assert quotas([100, 300], w, REPEAT) == (Fraction(300), Fraction(300))
    assert quotas([100, 300], w, STOP) == (Fraction(100), Fraction(100))


def test_the_plan_is_the_same_on_every_run() -> None:
    a = streams([[5, 7, 9] * 30, [11] * 50], [1.0, 2.0], STOP)
    b = streams([[5, 7, 9] * 30, [11] * 50], [1.0, 2.0], STOP)
    for epoch in range(3):
        assert epoch_mix(a, epoch) == epoch_mix(b, epoch)
