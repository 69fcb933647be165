"""Which objects a host reads and in which order: deterministic, disjoint, covering."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from prefetchd.download.order import (
    SourceObject,
    epoch_order,
    host_of,
    in_share,
    matcher,
    matches,
)
from prefetchd.seeds import mixing_rng

KEYS = [f"train/part-{i:05d}.tfrecord" for i in range(3000)] + [
    "a",
    "ü/ñ/日本語.bin",
    "with space/and\ttab",
    "../../etc/passwd",
    "\udcff-undecodable",  # a key that was not valid UTF-8 (surrogateescape)
]
OBJECTS = [SourceObject(key=k, size=len(k), etag=None) for k in KEYS]


@pytest.mark.parametrize("num_workers", [1, 2, 3, 4, 5])
def test_host_sharding_is_disjoint_and_covering(num_workers: int) -> None:
    for key in KEYS:
        owners = [i for i in range(num_workers) if in_share(key, num_workers, i)]
        assert owners == [host_of(key, num_workers)], key


@pytest.mark.parametrize("num_workers", [2, 3, 4, 5])
def test_host_sharding_is_roughly_balanced(num_workers: int) -> None:
    counts = Counter(host_of(k, num_workers) for k in KEYS)
    fair = len(KEYS) / num_workers
    assert set(counts) == set(range(num_workers))
    for count in counts.values():
        assert abs(count - fair) < 0.15 * fair


def test_a_key_stays_on_its_host_when_others_are_added() -> None:
    before = {k: host_of(k, 4) for k in KEYS[:100]}
    _ = [host_of(f"new/{i}", 4) for i in range(100)]
    assert {k: host_of(k, 4) for k in KEYS[:100]} == before


def order(objects: list[SourceObject], **kwargs: object) -> list[str]:
    return [o.key for o in epoch_order(objects, **kwargs)]  # type: ignore[arg-type]


def test_epoch_order_is_a_permutation_of_the_share() -> None:
    result = order(OBJECTS, seed=1, epoch=0, shuffle=True)
    assert sorted(result) == sorted(KEYS)


def test_epoch_order_is_deterministic_for_same_seed_and_epoch() -> None:
    assert order(OBJECTS, seed=7, epoch=3, shuffle=True) == order(
        OBJECTS, seed=7, epoch=3, shuffle=True
    )


def test_epoch_order_does_not_depend_on_listing_order() -> None:
    shuffled = OBJECTS[:]
    random.Random(99).shuffle(shuffled)
    reversed_ = OBJECTS[::-1]
    expected = order(OBJECTS, seed=7, epoch=2, shuffle=True)
    assert order(shuffled, seed=7, epoch=2, shuffle=True) == expected
    assert order(reversed_, seed=7, epoch=2, shuffle=True) == expected


def test_epoch_order_differs_between_epochs_and_seeds() -> None:
    base = order(OBJECTS, seed=0, epoch=0, shuffle=True)
    assert order(OBJECTS, seed=0, epoch=1, shuffle=True) != base
    assert order(OBJECTS, seed=1, epoch=0, shuffle=True) != base
    assert base != sorted(KEYS), "shuffle on means shuffled"
    epochs = {tuple(order(OBJECTS[:50], seed=0, epoch=e, shuffle=True)) for e in range(10)}
    assert len(epochs) == 10


@pytest.mark.parametrize(("seed", "epoch"), [(0, 0), (5, 3), (2**63, 1000)])
def test_without_shuffle_every_epoch_is_key_sorted(seed: int, epoch: int) -> None:
    shuffled = OBJECTS[:]
    random.Random(1).shuffle(shuffled)
    assert order(shuffled, seed=seed, epoch=epoch, shuffle=False) == sorted(KEYS)


def test_order_keeps_object_metadata() -> None:
    objs = [SourceObject("b", 2, '"etag-b"'), SourceObject("a", 1, None)]
    assert epoch_order(objs, seed=0, epoch=0, shuffle=False) == [objs[1], objs[0]]


_SUBPROCESS = """
import json, sys
from prefetchd.download.order import SourceObject, epoch_order, host_of
from prefetchd.seeds import mixing_rng
keys = json.loads(sys.stdin.read())
objs = [SourceObject(k, 1) for k in keys]
print(json.dumps({
    "hosts": [host_of(k, 5) for k in keys],
    "order": [o.key for o in epoch_order(objs, seed=11, epoch=4, shuffle=True)],
    "mix": [mixing_rng(11, 4, 1).random() for _ in range(3)],
}))
"""


def test_same_results_in_another_process_with_another_hash_seed() -> None:
    # invariant 6: same seed, hosts and data => same order on every run, on every host
    keys = [k for k in KEYS[:300] if k.isprintable() or "\t" in k]
    results = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", _SUBPROCESS],
            input=json.dumps(keys),
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        results.append(json.loads(out.stdout))
    here = {
        "hosts": [host_of(k, 5) for k in keys],
        "order": [
            o.key
            for o in epoch_order([SourceObject(k, 1) for k in keys], seed=11, epoch=4, shuffle=True)
        ],
        "mix": [mixing_rng(11, 4, 1).random() for _ in range(3)],
    }
    assert results[0] == results[1] == here


def test_mixing_rng_is_deterministic_and_differs_per_writer() -> None:
    a = [mixing_rng(3, 1, 0).random() for _ in range(5)]
    assert a == [mixing_rng(3, 1, 0).random() for _ in range(5)]
    assert a != [mixing_rng(3, 1, 1).random() for _ in range(5)]
    assert a != [mixing_rng(3, 2, 0).random() for _ in range(5)]


@pytest.mark.parametrize(
    ("key", "patterns", "expected"),
    [
        ("anything/at/all", ["*"], True),
        ("deep/dir/x.tfrecord", ["*.tfrecord"], True),  # * also crosses /
        ("x.tfrecord.gz", ["*.tfrecord"], False),
        ("x.tfrecord.gz", ["*.tfrecord", "*.tfrecord.gz"], True),
        ("train/x.bin", ["train/*"], True),
        ("val/x.bin", ["train/*"], False),
        ("train", ["train/*"], False),
        ("a1.bin", ["a?.bin"], True),
        ("a12.bin", ["a?.bin"], False),
        ("b.bin", ["[ab].bin"], True),
        ("c.bin", ["[ab].bin"], False),
        ("c.bin", ["[!ab].bin"], True),
        ("X.TFRECORD", ["*.tfrecord"], False),  # case-sensitive, like S3 keys
        ("x.tfrecord", [], False),
        ("", ["*"], True),
        ("ü/日本語.bin", ["ü/*.bin"], True),
    ],
)
def test_include_globs(key: str, patterns: list[str], expected: bool) -> None:
    assert matches(key, patterns) is expected


@pytest.mark.parametrize(
    "patterns",
    [["*"], ["*.tfrecord"], ["a/*", "*.gz"], ["?x*"], ["[ab]*.bin", "*"], ["train/*/part-*"]],
)
def test_compiled_matcher_agrees_with_matches(patterns: list[str]) -> None:
    keys = ["a/b.tfrecord", "x.gz", "ax", "bx/y.bin", "train/1/part-0", "", "b.bin", "../x"]
    match = matcher(patterns)
    assert [match(k) for k in keys] == [matches(k, patterns) for k in keys]
