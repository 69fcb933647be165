"""The keep policy (``download/keep.py``): what it keeps, and that it beats LRU where LRU fails."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from prefetchd.download.keep import (
    choose_kept,
    hit_bound,
    keep_rank,
    kept_bytes,
    lru_epoch_hits,
    subset_epoch_hits,
)
from prefetchd.download.order import epoch_permutation


def shuffled_orders(count: int, epochs: int, seed: int = 0) -> list[list[int]]:
    return [list(epoch_permutation(count, seed=seed, epoch=e, shuffle=True)) for e in range(epochs)]


@given(
    st.lists(st.integers(1, 10_000), min_size=1, max_size=200),
    st.integers(0, 2_000_000),
)
def test_the_kept_subset_fits_and_falls_short_by_less_than_one_object(
    sizes: list[int], capacity: int
) -> None:
    ranks = [keep_rank(f"k{i}") for i in range(len(sizes))]
    flags = choose_kept(ranks, sizes, capacity)
    kept = kept_bytes(flags, sizes)
    assert kept <= capacity
    assert kept > min(capacity, sum(sizes)) - max(sizes)


def test_the_choice_depends_on_keys_only_so_another_job_reuses_it() -> None:
    keys = [f"data/{i:05d}.tfrecord" for i in range(500)]
    sizes = [1000 + i % 7 for i in range(500)]
    first = choose_kept([keep_rank(k) for k in keys], sizes, 200_000)
    # the same keys listed in another order (another job, a manifest) choose the same objects
    order = list(range(500))
    random.Random(1).shuffle(order)
    second = choose_kept([keep_rank(keys[i]) for i in order], [sizes[i] for i in order], 200_000)
    assert {keys[i] for i in range(500) if first[i]} == {
        keys[i] for j, i in enumerate(order) if second[j]
    }


def test_half_the_share_kept_hits_half_the_bytes_of_every_later_epoch() -> None:
    rng = random.Random(3)
    sizes = [rng.randrange(50_000, 150_000) for _ in range(2000)]
    share = sum(sizes)
    capacity = share // 2
    flags = choose_kept([keep_rank(str(i)) for i in range(len(sizes))], sizes, capacity)
    hits = subset_epoch_hits(shuffled_orders(len(sizes), 4), sizes, flags)
    assert hits[0] == 0
    assert all(h / share >= hit_bound(capacity, share) for h in hits[1:])


def test_lru_hits_nothing_when_the_order_repeats_and_little_when_it_is_shuffled() -> None:
    sizes = [100] * 1000
    same = [list(range(1000))] * 3
    assert lru_epoch_hits(same, sizes, 50_000) == [0, 0, 0]
    flags = choose_kept([keep_rank(str(i)) for i in range(1000)], sizes, 50_000)
    assert subset_epoch_hits(same, sizes, flags)[1:] == [50_000, 50_000]
    lru = lru_epoch_hits(shuffled_orders(1000, 4), sizes, 50_000)
    assert all(h < 0.4 * 100_000 for h in lru[1:])  # about (C/S)^2 = 25 %, not 50 %


def test_everything_fits_everything_hits_after_the_first_epoch() -> None:
    sizes = [10, 20, 30]
    flags = choose_kept([keep_rank(str(i)) for i in range(3)], sizes, 1000)
    assert list(flags) == [1, 1, 1]
    assert subset_epoch_hits(shuffled_orders(3, 3), sizes, flags) == [0, 60, 60]
    assert lru_epoch_hits(shuffled_orders(3, 3), sizes, 1000) == [0, 60, 60]


def test_the_bound_is_min_one_c_over_s_minus_five_percent() -> None:
    assert hit_bound(50, 100) == 0.45
    assert hit_bound(500, 100) == 0.95
    assert hit_bound(0, 100) == -0.05
