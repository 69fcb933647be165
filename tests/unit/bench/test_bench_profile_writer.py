"""``bench.profile.writer``'s pure parts: its inputs are seeded, sized and parse as the writer's
formats parse them; its summary is the median run."""

from __future__ import annotations

import io
import random
import tarfile

from bench.profile import writer as profile_writer
from bench.profile.writer import Result
from prefetchd.kernel.framing import read_records
from testkit import sample_data


def test_objects_are_seeded_and_stop_once_the_size_is_reached() -> None:
    objects = profile_writer.make_objects("raw", 1.0, seed=1)
    assert objects == profile_writer.make_objects("raw", 1.0, seed=1)
    sizes = [len(body) for _, body in objects]
    assert sum(sizes[:-1]) < 1_000_000 <= sum(sizes)
    assert all(64 * 1024 <= size <= 200 * 1024 for size in sizes)
    assert [key for key, _ in objects][:2] == ["raw/000000.bin", "raw/000001.bin"]


def test_up_to_yields_nothing_for_nothing() -> None:
    assert list(profile_writer.up_to([("k", b"x", [])], 0)) == []


def test_tar_samples_hold_only_the_small_members() -> None:
    ((_, body),) = profile_writer.make_objects("tar", 0.5, seed=0)[:1]
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        names = tar.getnames()
    assert names[:2] == ["000000000.json", "000000000.cls"]
    assert all(not name.endswith(".jpg") for name in names)


def test_tar_members_default_keeps_the_bench_tar_samples_unchanged() -> None:
    rng_a, rng_b = (random.Random(5) for _ in range(2))
    full = sample_data.tar_sample(7, rng_a)
    small = sample_data.tar_sample(7, rng_b, ("json", "cls"))
    assert [name for name, _ in full] == ["000000007.jpg", "000000007.cls", "000000007.json"]
    assert small == [full[2], full[1]]


def test_tfrecord_objects_hold_64_kib_records() -> None:
    ((_, body),) = profile_writer.make_objects("tfrecord", 1.0, seed=0)[:1]
    records = list(read_records(io.BytesIO(body)))
    assert len(body) <= 4 * 1024**2
    assert len(records) == 64
    assert all(len(r) + 16 <= 64 * 1024 for r in records)


def result(cpu_s: float, records: int = 1000) -> Result:
    return Result("lines", 2, records, 2_000_000, 3_000_000, cpu_s, 1.0)


def test_summary_is_the_median_run_by_cpu_with_every_run_listed() -> None:
    row = profile_writer.summary([result(0.3), result(0.1), result(0.2)])
    assert row["cpu_s"] == 0.2
    assert row["us_per_record"] == 200.0
    assert row["cpu_s_per_gb"] == 100.0
    assert row["cpu_s_runs"] == [0.3, 0.1, 0.2]
    assert profile_writer.row_line(row).split() == [
        "lines", "1000", "2.0", "0.200", "200.00", "100.00"
    ]  # fmt: skip
