"""``prefetchd.records()`` on its own: records in shard order, a shard kept until its last
record was handed out and freed right after, gzip shards, corrupt shards, and positions at
shard granularity.

No daemon runs here: the test writes shards, ``status.json`` and the epoch markers the way the
writers and the supervisor do (``config``: see conftest.py), and plays the supervisor returning
a dead trainer's claims to ``ready/``. tests/e2e/test_records.py runs the real daemon.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from dataclasses import replace

import pytest

import prefetchd
from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.consume.records import CorruptShard
from prefetchd.errors import PositionError
from prefetchd.layout import Layout, shard_name
from prefetchd.supervise.status import read_consumers
from prefetchd.tfrecord import frame


@pytest.fixture
def config(config: Config) -> Config:
    """conftest's job, with a supervisor that reports itself running for the next hour."""
    record = {"state": "running", "pid": os.getpid(), "updated": time.time() + 3600}
    write_atomic(Layout.of(config).status_file, json.dumps(record).encode())
    return config


def contents(epoch: int, counter: int, count: int) -> list[bytes]:
    return [f"{epoch}/{counter}/{i}".encode() for i in range(count)]


def publish(cfg: Config, epoch: int, counter: int, count: int = 3, *, gz: bool = False) -> str:
    name = shard_name(epoch, 0, counter, gzip=gz)
    data = b"".join(frame(r) for r in contents(epoch, counter, count))
    write_atomic(Layout.of(cfg).ram_ready / name, gzip.compress(data) if gz else data)
    return name


def complete(cfg: Config, epoch: int) -> None:
    write_atomic(Layout.of(cfg).complete_marker(epoch), b"{}")


def claimed(cfg: Config) -> list[str]:
    return sorted(n.partition("-")[2] for n in os.listdir(Layout.of(cfg).ram_claimed))


def test_every_record_of_every_epoch_in_shard_order(config: Config) -> None:
    for epoch in (0, 1):
        for counter in range(3):
            publish(config, epoch, counter, count=counter + 1)
        complete(config, epoch)
    got = list(prefetchd.records(config, timeout=10))
    assert got == [r for e in (0, 1) for c in range(3) for r in contents(e, c, c + 1)]
    assert claimed(config) == [], "read shards left on the RAM disk"


def test_a_shard_stays_until_its_last_record_was_yielded(config: Config) -> None:
    name = publish(config, 0, 0, count=3)
    complete(config, 0)
    stream = prefetchd.records(config, epoch=0, timeout=10)
    assert [next(stream), next(stream), next(stream)] == contents(0, 0, 3)
    time.sleep(0.3)  # give the releaser's thread every chance to free it too early
    assert claimed(config) == [name], "freed before the caller had finished with its records"
    assert list(stream) == []
    assert claimed(config) == [], "freed only later, or never"


def test_closing_a_stream_early_gives_up_the_rest_of_its_shard(config: Config) -> None:
    names = [publish(config, 0, c, count=3) for c in range(2)]
    complete(config, 0)
    stream = prefetchd.records(config, epoch=0, timeout=10)
    assert next(stream) == contents(0, 0, 3)[0]
    stream.close()
    assert claimed(config) == [], "a shard given up stays on the RAM disk"
    rest = list(prefetchd.records(config, epoch=0, timeout=10))
    assert rest == contents(0, 1, 3), f"{names[0]} given up, {names[1]} still delivered"


def test_gzip_shards_are_read_streaming(config: Config) -> None:
    gz = replace(config, output=replace(config.output, compression="gzip"))
    publish(gz, 0, 0, count=500, gz=True)
    complete(gz, 0)
    assert list(prefetchd.records(gz, epoch=0, timeout=10)) == contents(0, 0, 500)


def test_a_bad_crc_raises_naming_the_shard(config: Config) -> None:
    layout = Layout.of(config)
    name = shard_name(0, 0, 0)
    data = bytearray(frame(b"good") + frame(b"flipped"))
    data[-6] ^= 0x01  # inside the second record's data
    write_atomic(layout.ram_ready / name, bytes(data))
    complete(config, 0)
    stream = prefetchd.records(config, epoch=0, timeout=10)
    assert next(stream) == b"good"
    with pytest.raises(CorruptShard, match=rf"{name}: at byte 20: data CRC mismatch"):
        next(stream)


def test_a_position_counts_the_records_of_the_shard_in_progress(config: Config) -> None:
    layout = Layout.of(config)
    names = [publish(config, 0, c, count=2) for c in range(3)]
    stream = prefetchd.records(config, epoch=0, timeout=10, position={})
    assert [next(stream), next(stream)] == contents(0, 0, 2)
    # after the last record of shard 0: it is covered
    assert stream.position()["consumed"] == names[:1]
    assert next(stream) == contents(0, 1, 2)[0]
    # in the middle of shard 1: its first record is counted (shard 0 was covered by the
    # position before, so this one need not list it)
    saved = stream.position()
    assert (saved["consumed"], saved["records"]) == ([], {names[1]: 1})
    assert next(stream) == contents(0, 1, 2)[1]
    # the trainer dies here; the daemon returns its claims (kept for the position) to ready/
    for name in os.listdir(layout.ram_claimed):
        os.rename(layout.ram_claimed / name, layout.ram_ready / name.partition("-")[2])
    complete(config, 0)
    resumed = list(prefetchd.records(config, epoch=0, timeout=10, position=saved))
    assert resumed == contents(0, 1, 2)[1:] + contents(0, 2, 2), "lost, or delivered twice"


def test_a_resumed_stream_takes_back_its_shards_before_the_daemon_returns_them(
    config: Config,
) -> None:
    """Right after a crash the dead trainer's claims are still under its name: the resumed
    stream takes them back itself (the one in progress first, skipping what was trained)."""
    names = [publish(config, 0, c, count=3) for c in range(3)]
    stream = prefetchd.records(config, epoch=0, timeout=10, position={})
    assert [next(stream) for _ in range(4)] == contents(0, 0, 3) + contents(0, 1, 3)[:1]
    saved = stream.position()
    assert (saved["consumed"], saved["records"]) == (names[:1], {names[1]: 1})
    complete(config, 0)
    # a second process resumes while the first still holds its claims (its lock is held)
    again = prefetchd.records(config, epoch=0, timeout=10, position=saved)
    notes = [r.resumed for r in read_consumers(Layout.of(config)).values() if r.resumed]
    assert notes == [f"epoch 0: 1 shards done, {names[1]} from record 1"], "status shows it"
    assert list(again) == contents(0, 1, 3)[1:] + contents(0, 2, 3)


def test_a_position_of_another_job_raises_one_clear_line(config: Config) -> None:
    publish(config, 0, 0, count=2)
    stream = prefetchd.records(config, epoch=0, timeout=10, position={})
    next(stream)
    saved = stream.position()
    other_seed = {**saved, "job": {**saved["job"], "seed": 7}}
    with pytest.raises(PositionError, match=r"epochs.seed=7 and this config has 0"):
        prefetchd.records(config, epoch=0, position=other_seed)
    other_data = {**saved, "job": {**saved["job"], "dataset": "0123456789abcdef"}}
    with pytest.raises(PositionError, match=r"another dataset \(0123456789abcdef"):
        prefetchd.records(config, epoch=0, position=other_data)
    with pytest.raises(PositionError, match=r"version 9 is not one this prefetchd reads"):
        prefetchd.records(config, epoch=0, position={**saved, "version": 9})
    stream.close()


def test_a_position_saved_in_another_daemon_job_raises_naming_both(config: Config) -> None:
    """Same config, but the daemon's job is another (its state was removed, say): the shard
    names the position lists are that job's, so it must not skip or take them."""
    publish(config, 0, 0, count=2)
    stream = prefetchd.records(config, epoch=0, timeout=10, position={})
    next(stream)
    saved = stream.position()
    assert saved["job"]["id"] == "f" * 16, "the position names the fenced job (conftest)"
    other = {**saved, "job": {**saved["job"], "id": "0" * 16}}
    with pytest.raises(PositionError, match=r"saved in job 0{16}, and the daemon now runs job f"):
        next(prefetchd.records(config, epoch=0, timeout=10, position=other))
    stream.close()


def test_records_is_exported_lazily() -> None:
    assert "records" in prefetchd.__all__
    assert prefetchd.records.__module__ == "prefetchd.consume.records"
