"""The compact share table and the epoch permutation the downloader walks."""

from __future__ import annotations

import random

import pytest

import prefetchd.share
from prefetchd.order import SourceObject, epoch_order, epoch_permutation
from prefetchd.share import ShareTable

KEYS = ["b/2", "a/1", "ü/日本語", "raw\udcffbyte", "a/10", "z", "a/1.gz", "../../etc/passwd"]
OBJECTS = [SourceObject(k, i * 100, f"{i:032x}" if i % 2 else None) for i, k in enumerate(KEYS)]


def test_table_gives_back_every_object_sorted_by_key() -> None:
    table = ShareTable.of(OBJECTS)
    assert list(table) == sorted(OBJECTS, key=lambda o: o.key)
    assert len(table) == len(OBJECTS)
    assert table.total_size() == sum(o.size for o in OBJECTS)


def test_table_does_not_depend_on_arrival_order() -> None:
    shuffled = OBJECTS[:]
    random.Random(3).shuffle(shuffled)
    assert list(ShareTable.of(shuffled)) == list(
        ShareTable.of(sorted(OBJECTS, key=lambda o: o.key))
    )


def test_repeated_keys_are_kept_once() -> None:
    table = ShareTable.of([*OBJECTS, OBJECTS[0], OBJECTS[3]])
    assert [o.key for o in table] == sorted(KEYS)
    assert table.duplicates == 2


def test_sorting_merges_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetchd.share, "SORT_RUN", 3)  # force several runs
    keys = [f"k{random.Random(i).randrange(10**6):07d}-{i}" for i in range(50)]
    table = ShareTable.of(SourceObject(k, 1) for k in keys)
    assert [o.key for o in table] == sorted(keys)


def test_table_costs_the_keys_plus_a_few_words_per_key() -> None:
    keys = [f"train/shard-{i:07d}.tfrecord" for i in range(20_000)]
    table = ShareTable.of(SourceObject(k, i) for i, k in enumerate(keys))
    assert table.nbytes() <= sum(len(k) for k in keys) + 24 * len(keys)


def test_permutation_is_the_order_epoch_order_gives() -> None:
    ordered = sorted(OBJECTS, key=lambda o: o.key)
    for epoch in range(3):
        perm = epoch_permutation(len(ordered), seed=5, epoch=epoch, shuffle=True)
        assert [ordered[i] for i in perm] == epoch_order(OBJECTS, seed=5, epoch=epoch, shuffle=True)
    assert list(epoch_permutation(4, seed=5, epoch=0, shuffle=False)) == [0, 1, 2, 3]
