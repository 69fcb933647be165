"""ready_files() on its own: claims, RAM release after reading, and a daemon that is gone.

No daemon runs here: the test plays the daemon's part by writing shards, ``status.json`` and
the epoch markers the way the supervisor and writers do (``config``: see conftest.py).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable

import pytest

from prefetchd import ready_files
from prefetchd.config import Config
from prefetchd.errors import DaemonFailed
from prefetchd.kernel.framing import frame
from prefetchd.layout import Layout, shard_name, write_atomic


def daemon_status(cfg: Config, state: str = "running", age: float = 0.0, **extra: object) -> None:
    record = {"state": state, "pid": os.getpid(), "updated": time.time() - age, **extra}
    write_atomic(Layout.of(cfg).status_file, json.dumps(record).encode())


def publish(cfg: Config, epoch: int, counter: int, records: int = 3) -> str:
    name = shard_name(epoch, 0, counter)
    data = b"".join(frame(f"{epoch}/{counter}/{i}".encode()) for i in range(records))
    write_atomic(Layout.of(cfg).ram_ready / name, data)
    return name


def complete(cfg: Config, epoch: int) -> None:
    write_atomic(Layout.of(cfg).complete_marker(epoch), b"{}")


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_yields_each_epoch_in_order_and_returns_after_the_last(config: Config) -> None:
    daemon_status(config)
    for epoch in (0, 1):
        for counter in range(3):
            publish(config, epoch, counter)
        complete(config, epoch)
    names = [os.path.basename(p).partition("-")[2] for p in ready_files(config, timeout=10)]
    assert names == [shard_name(e, 0, c) for e in (0, 1) for c in range(3)]


def test_epoch_argument_yields_only_that_epoch(config: Config) -> None:
    daemon_status(config)
    publish(config, 0, 0)
    publish(config, 1, 0)
    complete(config, 1)
    paths = list(ready_files(config, epoch=1, timeout=10))
    assert [os.path.basename(p).partition("-")[2] for p in paths] == [shard_name(1, 0, 0)]
    assert (Layout.of(config).ram_ready / shard_name(0, 0, 0)).exists(), "epoch 0 untouched"


def test_a_shard_is_freed_after_it_is_read_and_not_while_it_is_read(config: Config) -> None:
    daemon_status(config)
    publish(config, 0, 0, records=50)
    complete(config, 0)
    it = ready_files(config, epoch=0, timeout=10)
    path = next(it)
    time.sleep(0.3)
    assert os.path.exists(path), "freed before the trainer even opened it"
    with open(path, "rb") as f:
        f.read(100)
        time.sleep(0.3)
        assert os.path.exists(path), "freed while the trainer was still reading it"
        f.read()
    assert wait_until(lambda: not os.path.exists(path)), "not freed after it was read"
    assert list(it) == []


def test_two_processes_get_disjoint_shards(config: Config) -> None:
    daemon_status(config)
    for counter in range(40):
        publish(config, 0, counter)
    complete(config, 0)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.map(_claim_all, [config, config])
    names = [os.path.basename(p).partition("-")[2] for r in results for p in r]
    assert sorted(names) == sorted(shard_name(0, 0, c) for c in range(40))
    assert len(set(names)) == 40


def _claim_all(cfg: Config) -> list[str]:
    paths = []
    for path in ready_files(cfg, epoch=0, timeout=10):
        paths.append(path)
        time.sleep(0.005)
    return paths


def test_raises_when_the_daemon_failed(config: Config) -> None:
    daemon_status(config, state="failed", reason="bucket 'x' does not exist")
    with pytest.raises(DaemonFailed, match="bucket 'x' does not exist"):
        next(ready_files(config, timeout=10))


def test_raises_when_the_daemon_is_gone_longer_than_the_grace(config: Config) -> None:
    daemon_status(config, age=120)
    with pytest.raises(DaemonFailed, match="gone"):
        next(ready_files(config, grace=0.5))


def test_timeout_without_new_shards(config: Config) -> None:
    daemon_status(config)
    with pytest.raises(TimeoutError, match="epoch 0"):
        next(ready_files(config, timeout=0.5))


def test_an_epoch_outside_the_job_is_a_value_error(config: Config) -> None:
    with pytest.raises(ValueError, match=r"epochs\.count=2"):
        next(ready_files(config, epoch=2))
