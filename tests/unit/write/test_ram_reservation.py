"""Issue #12 bar 2 (small objects cost too much daemon CPU per object): what a shard reserves on the
RAM disk, counted in bytes passed to ``posix_fallocate``, with no timing.

A writer publishes a shard every 0.2 s while the trainers wait for data, so with small objects
its shards end at a few MB. Each one reserved a whole 16 MiB chunk: pages that tmpfs zeroes on
``posix_fallocate`` and the publish's ``ftruncate`` frees again, more kernel time per object than
writing the records. Reservations now double from 1 MiB up to the chunk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from prefetchd.budget import RAM_STEP_MIN, RamBudget, ram_chunk, reservation_step
from prefetchd.config import Config, config_from_dict
from prefetchd.layout import Layout
from prefetchd.tfrecord import frame, read_records
from prefetchd.write.shards import ShardFile

MIB = 1024 * 1024
RECORD = 120 * 1024  # one small raw object's frame, about
CHUNK = 16 * MIB  # ram_chunk of the default and the bench's shard sizes


@pytest.fixture
def config(tmp_path: Path) -> Config:
    config = config_from_dict(
        {
            "source": {"url": "s3://bucket/", "format": "raw"},
            "download": {"cache_dir": str(tmp_path / "cache")},
            "output": {"ram_dir": str(tmp_path / "ram"), "ram_budget": "1GiB"},
            "status": {"state_dir": str(tmp_path / "state")},
        }
    )
    Layout.of(config).create()
    return config


class Fallocations:
    """Records the length of every ``posix_fallocate`` call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lengths: list[int] = []
        real = os.posix_fallocate

        def counted(fd: int, offset: int, length: int) -> Any:
            self.lengths.append(length)
            return real(fd, offset, length)

        monkeypatch.setattr(os, "posix_fallocate", counted)


def write_shard(config: Config, records: list[bytes]) -> Path:
    layout = Layout.of(config)
    budget = RamBudget(layout, config.output.ram_budget, CHUNK, lambda: False)
    shard = ShardFile(layout, "e00000-w00-0000000.tfrecord", budget)
    for record in records:
        shard.write_frames([frame(record)], 1)
    shard.finish()
    return shard.publish()


def test_a_small_shard_reserves_about_what_it_holds_not_a_whole_chunk(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [bytes([i]) * RECORD for i in range(25)]  # 3 MB: a shard published early
    fallocations = Fallocations(monkeypatch)
    path = write_shard(config, records)
    with path.open("rb") as f:
        assert list(read_records(f)) == records  # every record, whole, in order
    written = path.stat().st_size
    reserved = sum(fallocations.lengths)
    # At most twice what it holds (each step is as large as the reservation so far), never a
    # 16 MiB chunk for 3 MB; and a handful of steps, not one per record.
    assert written <= reserved <= max(2 * written, RAM_STEP_MIN)
    assert reserved < CHUNK
    assert len(fallocations.lengths) <= 3


def test_a_large_shard_takes_chunk_sized_steps_once_it_is_a_chunk_large(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [bytes([i % 251]) * (MIB // 2) for i in range(80)]  # 40 MiB
    fallocations = Fallocations(monkeypatch)
    path = write_shard(config, records)
    assert path.stat().st_size == 80 * (MIB // 2 + 16)
    # 1 + 1 + 2 + 4 + 8 + 16 MiB, then 16 MiB at a time: the lock and the walk of ram_dir stay
    # a few per shard.
    assert fallocations.lengths[:6] == [MIB, MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB]
    assert all(length == CHUNK for length in fallocations.lengths[6:])
    assert sum(fallocations.lengths) - path.stat().st_size < CHUNK


@pytest.mark.parametrize(
    ("reserved", "need", "chunk", "step"),
    [
        (0, 1, CHUNK, RAM_STEP_MIN),  # the first step
        (MIB, MIB + 1, CHUNK, MIB),  # doubles
        (4 * MIB, 5 * MIB, CHUNK, 4 * MIB),
        (32 * MIB, 33 * MIB, CHUNK, CHUNK),  # at most a chunk
        (0, 3 * MIB + 1, CHUNK, 4 * MIB),  # a large record: whole steps that cover it
        (0, 1, 64 * 1024, 64 * 1024),  # a chunk below the minimum step (tiny shard_size)
    ],
)
def test_reservation_steps(reserved: int, need: int, chunk: int, step: int) -> None:
    assert reservation_step(reserved, need, chunk) == step


def test_chunk_is_unchanged_by_the_steps() -> None:
    # The headroom a later epoch leaves (writers x chunk) still counts whole chunks.
    assert ram_chunk(128 * MIB) == CHUNK
