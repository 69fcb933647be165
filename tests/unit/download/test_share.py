"""The compact share table and the epoch permutation the downloader walks."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest

import prefetchd.download.share
from prefetchd.config import config_from_dict
from prefetchd.download.order import SourceObject, epoch_order, epoch_permutation
from prefetchd.download.share import ShareTable
from prefetchd.download.store import list_share

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
    monkeypatch.setattr(prefetchd.download.share, "SORT_RUN", 3)  # force several runs
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


def test_a_large_unsorted_manifest_costs_about_its_keys(tmp_path: Path) -> None:
    """Regression for the listing held as one Python object per key (~200 bytes each): a
    manifest of 200,000 keys streams into the table holding about the keys themselves."""
    count = 200_000
    manifest = tmp_path / "keys.txt"
    with manifest.open("w", encoding="utf-8") as f:
        for i in range(count):
            f.write(f"train/part-{count - i:07d}.tfrecord\t{1000 + i}\n")  # unsorted on purpose
    config = config_from_dict({"source": {"url": "s3://bucket/train/", "manifest": str(manifest)}})
    key_bytes = count * len("train/part-0000000.tfrecord")

    tracemalloc.start()
    try:
        table = ShareTable()
        for obj in list_share(None, config):
            table.append(obj)
        table.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(table) == count
    assert table[0].key == "train/part-0000001.tfrecord" and table[0].size == 1000 + count - 1
    # the keys, a few 8-byte words per key, and one sort run of 65,536 keys as Python objects
    # (about 18 MiB here); a list of SourceObject alone would be ~38 MiB
    assert peak < key_bytes + 48 * count + 65_536 * 120, f"peak {peak / 2**20:.1f} MiB"
