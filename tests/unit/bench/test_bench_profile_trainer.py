"""``bench.profile.trainer``'s pure parts: the dataset's size, the results under the tool's own
names, the table and its ratios; ``bench.drivers.trainer``'s per-thread CPU difference."""

from __future__ import annotations

from typing import Any

from bench.drivers import trainer
from bench.profile import trainer as profile_trainer

MiB, GiB = 1024**2, 1024**3


def test_the_dataset_is_whole_32_mib_objects_of_64_kib_records() -> None:
    spec = profile_trainer.dataset_spec(1.0)
    assert (spec.objects, spec.min_size, spec.max_size) == (32, 32 * MiB, 32 * MiB)
    assert spec.kind == "tfrecord" and spec.record_size == 64 * 1024
    assert profile_trainer.dataset_spec(0.1).objects == 4  # rounded up
    assert profile_trainer.dataset_spec(0.0).objects == 1


def bench_result(**more: Any) -> dict[str, Any]:
    return {
        "records": 10,
        "bytes": GiB,
        "wall_s": 2.0,
        "trainer_cpu_s": 1.5,
        "trainer_cpu_steady_s": 1.0,
        "first_batch_s": 0.5,
        "batches": 1,
        **more,
    }


def test_a_trainer_result_keeps_the_tools_own_names() -> None:
    got = profile_trainer.from_trainer(bench_result(threads_cpu_s={"native": 0.2}))
    assert got == {
        "records": 10,
        "bytes": GiB,
        "wall_s": 2.0,
        "cpu_s": 1.5,
        "cpu_steady_s": 1.0,
        "first_batch_s": 0.5,
        "threads_cpu_s": {"native": 0.2},
    }
    assert profile_trainer.from_trainer(bench_result(first_batch_s=None))["first_batch_s"] == 2.0


def run(cpu_s: float, records: int = 10) -> dict[str, Any]:
    return {"records": records, "bytes": GiB, "wall_s": 1.0, "cpu_s": cpu_s, "cpu_steady_s": 1.0}


def test_summary_gives_medians_ratios_and_short_deliveries() -> None:
    runs = {
        "floor": [run(1.0), run(3.0), run(2.0)],
        "lean": [run(2.0)],
        "prefetchd": [run(2.5, records=9)],
    }
    text = profile_trainer.summary(runs, expected=10)
    assert text.splitlines()[1].split()[:2] == ["floor", "2.00"]
    assert "!! prefetchd delivered [9] of 10 records" in text
    assert "prefetchd/lean: 1.25x (bar: <= 1.25x)" in text
    assert "prefetchd/floor: 1.25x (bar: <= 1.25x)" in text


def test_thread_cpu_since_leaves_out_threads_that_used_nothing() -> None:
    before = {"MainThread": 1.0, "native": 2.0}
    after = {"MainThread": 1.0, "native": 2.25, "prefetchd-releaser": 0.1}
    assert trainer.thread_cpu_since(before, after) == {"native": 0.25, "prefetchd-releaser": 0.1}
