"""The seeded in-object record shuffle used when ``epochs.shuffle`` is on."""

from __future__ import annotations

import gzip
import itertools
from collections import Counter
from pathlib import Path
from typing import TypedDict, Unpack

import pytest

from prefetchd.errors import CorruptObject
from prefetchd.kernel.framing import frame
from prefetchd.seeds import object_rng
from prefetchd.write.formats import get_format, shuffled_object
from prefetchd.write.shuffle import shuffled_records

RECORDS = [b"%05d" % i for i in range(1000)]


class Bounds(TypedDict, total=False):
    max_records: int
    max_bytes: int


def shuffle(
    records: list[bytes], *, epoch: int = 0, key: str = "k", **bounds: Unpack[Bounds]
) -> list[bytes]:
    rng = object_rng(7, epoch, key)
    max_records, max_bytes = bounds.get("max_records", 10_000), bounds.get("max_bytes", 10**9)
    return list(shuffled_records(iter(records), rng, max_records=max_records, max_bytes=max_bytes))


def test_same_seed_epoch_and_key_give_the_same_order() -> None:
    # crash recovery resumes an object by counting records: the order must repeat exactly
    assert shuffle(RECORDS) == shuffle(RECORDS)
    assert shuffle(RECORDS, max_records=16) == shuffle(RECORDS, max_records=16)


def test_every_record_exactly_once() -> None:
    all_bounds: tuple[Bounds, ...] = (
        {},
        {"max_records": 1},
        {"max_records": 50},
        {"max_bytes": 64},
    )
    for bounds in all_bounds:
        assert Counter(shuffle(RECORDS, **bounds)) == Counter(RECORDS), bounds


def test_order_changes_with_epoch_and_key() -> None:
    base = shuffle(RECORDS)
    assert base != RECORDS
    assert shuffle(RECORDS, epoch=1) != base
    assert shuffle(RECORDS, key="other") != base


def test_an_object_that_fits_is_shuffled_across_its_whole_length() -> None:
    out = shuffle(RECORDS)
    first_tenth = {int(r) for r in out[:100]}
    assert max(first_tenth) > 900, "records from the end can come first"


def test_buffer_bounds_how_far_a_record_moves_forward() -> None:
    out = shuffle(RECORDS, max_records=10)
    # a record cannot be delivered before the buffer has read it
    for position, record in enumerate(out):
        assert int(record) <= position + 10


def test_byte_bound_holds_with_a_record_larger_than_it() -> None:
    records = [b"x" * 100, b"y" * 5, b"z" * 5]
    out = shuffle(records, max_bytes=50)
    assert Counter(out) == Counter(records)


def test_empty_and_single() -> None:
    assert shuffle([]) == []
    assert shuffle([b"only"]) == [b"only"]


def test_lazy_so_a_huge_object_streams() -> None:
    endless = (b"%d" % i for i in itertools.count())
    first = list(
        itertools.islice(
            shuffled_records(endless, object_rng(0, 0, "k"), max_records=100, max_bytes=10**6), 5
        )
    )
    assert len(first) == 5 and all(int(r) <= 105 for r in first)


# --- whole-object shuffles through the formats ------------------------------------------------


def shuffled_from(path: Path, key: str, fmt: str = "tfrecord", epoch: int = 0) -> list[bytes]:
    rng = object_rng(7, epoch, key)
    return list(
        shuffled_object(get_format(fmt), key, str(path), rng, max_records=10, max_bytes=10**6)
    )


def test_tfrecord_objects_are_shuffled_whole_by_offset(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    path.write_bytes(b"".join(frame(r) for r in RECORDS))
    out = shuffled_from(path, "a.tfrecord")
    assert Counter(out) == Counter(RECORDS)
    assert out == shuffled_from(path, "a.tfrecord"), "same file and seed, same order"
    assert out != shuffled_from(path, "a.tfrecord", epoch=1)
    # max_records=10 would bound a buffer; the offset shuffle is not bounded by it
    assert max(int(r) for r in out[:10]) > 500


@pytest.mark.parametrize("damage", ["flip-data", "flip-length", "truncate"])
def test_tfrecord_offset_shuffle_finds_corruption(tmp_path: Path, damage: str) -> None:
    data = bytearray(b"".join(frame(r) for r in RECORDS))
    if damage == "flip-data":
        data[len(data) // 2] ^= 0x01
    elif damage == "flip-length":
        data[len(frame(RECORDS[0]))] ^= 0x01
    else:
        del data[-2:]
    path = tmp_path / "obj"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObject) as info:
        shuffled_from(path, "bad.tfrecord")
    assert info.value.key == "bad.tfrecord"
    assert "byte" in str(info.value)


def test_compressed_objects_fall_back_to_the_bounded_buffer(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    path.write_bytes(gzip.compress(b"".join(frame(r) for r in RECORDS)))
    out = shuffled_from(path, "a.tfrecord.gz")
    assert Counter(out) == Counter(RECORDS)
    assert out == shuffled_from(path, "a.tfrecord.gz")
    for position, record in enumerate(out):  # max_records=10 bounds how far records move
        assert int(record) <= position + 10
