"""``epochs.order: replayable`` against the real daemon (moto on 127.0.0.1): two runs with the
same seed, data and config yield byte-identical record sequences, whatever the timing.

The second run downloads one object at a time (``download.concurrency`` 1 against 8), so the
objects arrive in a different order and at a different pace: the records must not notice.
A run with another seed gives another order (the comparison can tell orders apart), and every
run delivers every record exactly once per epoch. A daemon SIGKILLed mid-epoch and restarted
yields the very sequence of a run that was never interrupted (write/replay.py: each commit
records the order's state).
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import prefetchd
from prefetchd.config import load_config
from prefetchd.kernel.example_encode import encode_example
from prefetchd.kernel.framing import frame
from prefetchd.layout import Layout
from tests.conftest import DEFAULT_PREFIX, DELETE, wait_for

pytestmark = pytest.mark.e2e

OBJECTS, RECORDS, EPOCHS = 40, 24, 2


def upload(s3_client: Any, bucket: str) -> Counter[bytes]:
    rng = random.Random(9)
    want: Counter[bytes] = Counter()
    for o in range(OBJECTS):
        records = [
            encode_example({"o": o, "j": j, "pad": rng.randbytes(rng.randrange(200, 1500))})
            for j in range(RECORDS)
        ]
        body = b"".join(frame(r) for r in records)
        s3_client.put_object(Bucket=bucket, Key=f"{DEFAULT_PREFIX}{o:04d}.tfrecord", Body=body)
        want.update(records)
    return want


def replay_config(
    tmp_path: Path, name: str, write_config: Callable[..., Path], **overrides: Any
) -> Path:
    return write_config(
        tmp_path / name,
        epochs={"count": EPOCHS, "seed": 7, "order": "replayable", **overrides.pop("epochs", {})},
        output__writers=DELETE,
        output__mix=4,
        output__shard_size="64KiB",
        download__window="64MiB",
        **overrides,
    )


def run(
    tmp_path: Path,
    name: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    **overrides: Any,
) -> list[bytes]:
    config = replay_config(tmp_path, name, write_config, **overrides)
    daemon = run_daemon(config)
    records = [bytes(r) for r in prefetchd.records(config, timeout=120)]
    assert daemon.wait(120) == 0, daemon.output()
    return records


def test_two_runs_with_the_same_seed_yield_the_same_records_in_the_same_order(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    want = upload(s3_client, bucket)
    first = run(tmp_path, "a", write_config, run_daemon)
    again = run(tmp_path, "b", write_config, run_daemon, download__concurrency=1)
    other = run(tmp_path, "c", write_config, run_daemon, epochs={"seed": 8})
    per_epoch = len(first) // EPOCHS
    for got in (first, again, other):
        assert len(got) == EPOCHS * sum(want.values())
        for e in range(EPOCHS):
            epoch = got[e * per_epoch : (e + 1) * per_epoch]
            assert Counter(epoch) == want, f"epoch {e}: every record exactly once"
    assert first == again, "the same seed gave another order"
    assert first != other, "another seed gave the same order: the comparison proves nothing"
    assert first[:per_epoch] != first[per_epoch:], "both epochs in the same order"


def test_a_daemon_killed_mid_epoch_and_restarted_yields_the_uninterrupted_sequence(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Nothing is read before the kill (the RAM budget holds 16 shards, so the writer is
    mid-epoch, waiting for room): every record comes after the restart, and in the order."""
    want = upload(s3_client, bucket)
    uninterrupted = run(tmp_path, "u", write_config, run_daemon, output__ram_budget="1MiB")
    config = replay_config(tmp_path, "k", write_config, output__ram_budget="1MiB")
    ready = Layout.of(load_config(config)).ram_ready
    daemon = run_daemon(config)
    wait_for(
        lambda: ready.is_dir() and len(os.listdir(ready)) >= 15, 60, "three shards before the kill"
    )
    daemon.kill_group(signal.SIGKILL)
    daemon.wait(30)
    restarted = run_daemon(config)
    got = [bytes(r) for r in prefetchd.records(config, timeout=120)]
    assert restarted.wait(120) == 0, restarted.output()
    per_epoch = len(got) // EPOCHS
    assert len(got) == EPOCHS * sum(want.values())
    for e in range(EPOCHS):
        assert Counter(got[e * per_epoch : (e + 1) * per_epoch]) == want, f"epoch {e}"
    assert got == uninterrupted, "the restart changed the order"
