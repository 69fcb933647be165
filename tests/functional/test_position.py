"""Resumable ``ready_files()`` streams on their own: what ``position()`` keeps, frees and lists,
and how a stream resumed from a saved position skips exactly what it covers.

No daemon runs here: the test writes shards and markers the way the writers and supervisor
do, and plays the supervisor returning a dead trainer's claims to ``ready/``.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from prefetchd import ready_files
from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.layout import Layout, shard_name
from prefetchd.tfrecord import frame


@pytest.fixture
def config(config: Config) -> Config:
    """conftest's job, with a supervisor that reports itself running for the next hour."""
    record = {"state": "running", "pid": os.getpid(), "updated": time.time() + 3600}
    write_atomic(Layout.of(config).status_file, json.dumps(record).encode())
    return config


def publish(cfg: Config, epoch: int, counter: int) -> str:
    name = shard_name(epoch, 0, counter)
    write_atomic(Layout.of(cfg).ram_ready / name, frame(f"{epoch}/{counter}".encode()))
    return name


def read(path: str) -> None:
    with open(path, "rb") as f:
        f.read()
    time.sleep(0.2)  # let the releaser see the close


def shard_of(path: str) -> str:
    return os.path.basename(path).partition("-")[2]


def test_position_keeps_read_shards_until_the_next_position_is_taken(config: Config) -> None:
    names = [publish(config, 0, c) for c in range(3)]
    files = ready_files(config, epoch=0, timeout=5, position={})
    first, second = next(files), next(files)
    read(first)
    read(second)
    assert os.path.exists(first) and os.path.exists(second), "freed before a position covers it"
    saved = files.position()
    assert (saved["version"], saved["epoch"], saved["consumed"]) == (2, 0, names[:2])
    assert json.loads(json.dumps(saved)) == saved
    third = next(files)
    read(third)
    assert os.path.exists(first), "freed before the trainer could have saved the position"
    assert files.position()["consumed"] == names[2:]
    assert not os.path.exists(first) and not os.path.exists(second), "covered shards kept"
    assert os.path.exists(third)


def test_a_stream_resumed_from_a_position_skips_exactly_what_it_covers(config: Config) -> None:
    layout = Layout.of(config)
    names = [publish(config, 0, c) for c in range(4)]
    files = ready_files(config, epoch=0, timeout=5, position={})
    paths = [next(files), next(files)]
    saved = files.position()  # covers names[0:2]
    paths.append(next(files))  # read after the checkpoint: must come again
    for path in paths:  # the trainer dies; the daemon returns its claims to ready/
        os.rename(path, layout.ram_ready / shard_of(path))
    (layout.complete_marker(0)).write_bytes(b"{}")
    resumed = [shard_of(p) for p in ready_files(config, epoch=0, timeout=5, position=saved)]
    assert sorted(resumed) == names[2:], "covered shards delivered again, or others lost"
    assert not [n for n in os.listdir(layout.ram_ready) if n in names[:2]]


def test_position_lists_covered_shards_that_have_not_come_back_yet(config: Config) -> None:
    saved = {"version": 1, "epoch": 0, "consumed": [shard_name(0, 0, 7)]}
    publish(config, 0, 8)
    files = ready_files(config, epoch=0, timeout=5, position=saved)
    assert shard_of(next(files)) == shard_name(0, 0, 8)
    assert shard_name(0, 0, 7) in files.position()["consumed"]


@pytest.mark.parametrize(
    "bad",
    [
        {"version": 3, "epoch": 0, "consumed": []},
        {"version": 1, "epoch": -1, "consumed": []},
        {"version": 1, "epoch": 0, "consumed": ["../../etc/passwd"]},
    ],
)
def test_a_malformed_position_is_a_value_error(config: Config, bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="position"):
        ready_files(config, position=bad)


def test_position_needs_a_resumable_stream(config: Config) -> None:
    with pytest.raises(ValueError, match="resumable"):
        ready_files(config, epoch=0).position()
