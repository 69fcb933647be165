"""The bench's datasets: the new generators are seeded, parse as prefetchd parses them, and the
floor holds the records prefetchd delivers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.drivers import readers
from bench.harness import datasets
from prefetchd.kernel.framing import read_records
from prefetchd.write.formats import get_format
from testkit import sample_data

MiB = 1024**2


def generated(
    kind: sample_data.Kind, sizes: list[int], **kw: Any
) -> list[tuple[str, bytes, list[int]]]:
    return list(sample_data.generate("d/", kind=kind, sizes=sizes, seed=3, **kw))


@pytest.mark.parametrize("name", ["lines", "tar", "tarsmall"])
def test_same_seed_same_bytes_and_ids_unique_across_objects(name: str) -> None:
    spec = datasets.BY_NAME[name].spec(2)
    kind, style = spec.kind, spec.tar_style
    first = generated(kind, [300_000, 200_000], tar_style=style)
    assert first == generated(kind, [300_000, 200_000], tar_style=style)
    ids = [i for _, _, object_ids in first for i in object_ids]
    assert ids == list(range(len(ids)))
    assert [key for key, _, _ in first] == [
        f"d/00000{i}{sample_data.SUFFIXES[kind]}" for i in (0, 1)
    ]


def test_lines_are_json_of_about_120_bytes_one_record_each(tmp_path: Path) -> None:
    ((key, body, ids),) = generated("lines", [1 * MiB])
    lines = body.splitlines()
    assert len(lines) == len(ids)
    assert [json.loads(line)["id"] for line in lines] == ids
    assert 110 <= len(body) / len(lines) <= 130
    path = tmp_path / "obj"
    path.write_bytes(body)
    assert len(list(get_format("lines").records(key, str(path)))) == len(ids)
    assert len(readers.split_lines(body)) == len(ids)


def test_tar_samples_have_three_members_and_parse_as_webdataset(tmp_path: Path) -> None:
    ((key, body, ids),) = generated("tar", [2 * MiB])
    path = tmp_path / "obj"
    path.write_bytes(body)
    decoded = [sample_data.decode_example(r) for r in get_format("tar").records(key, str(path))]
    assert [
        int(str(e["key"], "ascii") if isinstance(e["key"], bytes) else 0) for e in decoded
    ] == ids
    assert all(set(e) == {"key", *sample_data.TAR_MEMBERS} for e in decoded)
    blobs = [len(e["jpg"]) for e in decoded if isinstance(e["jpg"], bytes)]
    assert min(blobs) >= sample_data.TAR_BLOB_MIN and max(blobs) <= sample_data.TAR_BLOB_MAX
    assert readers.split_tar(body) == [e["jpg"] for e in decoded]
    assert sample_data.member_files("tar", len(ids)) == 3 * len(ids)


def test_tarsmall_samples_are_small_files_read_as_webdataset(tmp_path: Path) -> None:
    """Bar 3's tar row: 2-8 MiB tars of many small members, so the cost per member file is
    the parser's, not the bytes'; prefetchd and the baseline's tarfile split read them."""
    spec = datasets.BY_NAME["tarsmall"].spec(1)
    assert (spec.kind, spec.tar_style, spec.min_size, spec.max_size) == (
        "tar", "caption", 2 * MiB, 8 * MiB,
    )  # fmt: skip
    ((key, body, ids),) = generated("tar", [2 * MiB], tar_style="caption")
    path = tmp_path / "obj"
    path.write_bytes(body)
    decoded = [sample_data.decode_example(r) for r in get_format("tar").records(key, str(path))]
    assert all(set(e) == {"key", *sample_data.TAR_CAPTION_MEMBERS} for e in decoded)
    members = [{n: v for n, v in e.items() if isinstance(v, bytes)} for e in decoded]
    assert [int(m["key"]) for m in members] == ids
    assert [json.loads(m["json"])["id"] for m in members] == ids
    assert 80 <= sum(len(m["json"]) for m in members) / len(ids) <= 120, "~100-byte JSON"
    captions = [m["txt"] for m in members]
    assert all(100 <= len(c) <= 200 for c in captions)
    assert readers.split_tar(body) == captions  # the baseline delivers the caption
    assert sample_data.member_files("tar", len(ids), "caption") == 3 * len(ids)
    assert len(ids) > 600, "a 2 MiB tar holds hundreds of small samples"


def test_fixed_record_size_fills_a_16_mib_object_with_64_kib_records() -> None:
    ((_, body, ids),) = generated("tfrecord", [16 * MiB], record_size=64 * 1024)
    assert len(ids) == 256
    assert len(body) == pytest.approx(16 * MiB, rel=0.001)
    records = list(read_records(__import__("io").BytesIO(body)))
    assert all(abs(len(r) + 16 - 64 * 1024) < 64 for r in records)


def test_the_floor_holds_the_records_prefetchd_delivers(tmp_path: Path) -> None:
    objects = generated("lines", [200_000, 100_000])
    datasets.stage_floor(tmp_path, "lines", objects)
    with open(tmp_path / "floor-00000.tfrecord", "rb") as f:
        floor = [sample_data.decode_example(r) for r in read_records(f)]
    assert len(floor) == sum(len(ids) for _, _, ids in objects)
    assert floor[0]["line_number"] == 1 and floor[0]["key"] == b"d/000000.jsonl"


def test_every_dataset_has_a_quick_count_and_bar_datasets_exist() -> None:
    assert {"large", "medium", "small", "tfrecord16", "lines", "tar", "tarsmall"} <= set(
        datasets.NAMES
    )
    assert set(datasets.PACED) == {"large", "medium", "small", "tfrecord16"}
    # issue 28's table: 96 x 16 MiB TFRecords and 3,000 raw objects of 96-160 KiB
    tf16, small = datasets.BY_NAME["tfrecord16"], datasets.BY_NAME["small"]
    assert (tf16.objects, tf16.min_size, tf16.max_size) == (96, 16 * MiB, 16 * MiB)
    assert (small.objects, small.min_size, small.max_size) == (3000, 96 * 1024, 160 * 1024)
    assert all(0 < d.quick_objects < d.objects for d in datasets.DATASETS)
