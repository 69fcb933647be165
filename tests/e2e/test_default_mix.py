"""The default ``output.mix`` mixes records across many objects, against the real daemon (moto on
127.0.0.1, ``prefetchd.records()`` in this process).

96 TFRecord objects of 48 records each, every record naming its object; 2 writers, 64 KiB shards.
Read in the order a trainer reads, each window of 100 consecutive records holds records of how
many objects? With the default (64 open objects per writer) most of each writer's 48 objects
(36-44 measured; fewer in the first shards, drawn before every object is in); with ``mix: 8`` about
8 per writer plus the objects that replace those drained within the window (9-14 measured),
which the test also runs to show it can tell.

The trainer here starts reading once the epoch is downloaded. A trainer that reads faster than
the store delivers is not kept waiting for a full mix (``write/flush.py``: a starved trainer gets
the records of the objects in hand), so while it reads along with the download how well a window
mixes depends on that race (27-40 objects measured, lower on a loaded machine); read afterwards,
it shows what ``output.mix`` itself gives.
"""

from __future__ import annotations

import random
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
from testkit import sample_data
from tests.conftest import DEFAULT_PREFIX, DELETE, wait_for

pytestmark = pytest.mark.e2e

OBJECTS, RECORDS, WINDOW = 96, 48, 100


def upload(s3_client: Any, bucket: str) -> Counter[tuple[int, int]]:
    rng = random.Random(5)
    want: Counter[tuple[int, int]] = Counter()
    for o in range(OBJECTS):
        body = b"".join(
            frame(encode_example({"o": o, "j": j, "pad": rng.randbytes(900)}))
            for j in range(RECORDS)
        )
        s3_client.put_object(Bucket=bucket, Key=f"{DEFAULT_PREFIX}{o:04d}.tfrecord", Body=body)
        want.update((o, j) for j in range(RECORDS))
    return want


def read_all(config: Path) -> list[tuple[int, int]]:
    out = []
    for record in prefetchd.records(config, timeout=120):
        example = sample_data.decode_example(bytes(record))
        out.append((int(example["o"]), int(example["j"])))
    return out


def wait_until_downloaded(config: Path, timeout: float = 60) -> None:
    marker = Layout.of(load_config(config)).downloaded_marker(0)
    wait_for(marker.exists, timeout, "epoch 0 downloaded", interval=0.05)


def objects_per_window(order: list[tuple[int, int]]) -> list[int]:
    return [
        len({o for o, _ in order[i : i + WINDOW]})
        for i in range(0, len(order) - WINDOW + 1, WINDOW)
    ]


@pytest.mark.parametrize("mix", [DELETE, 8], ids=["default", "mix8"])
def test_the_default_mix_spreads_each_window_over_many_objects(
    mix: object,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    want = upload(s3_client, bucket)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="64KiB", output__mix=mix)
    daemon = run_daemon(config)
    wait_until_downloaded(config)
    order = read_all(config)
    assert daemon.wait(120) == 0, daemon.output()
    assert Counter(order) == want, "every record exactly once"
    windows = objects_per_window(order)
    mean = sum(windows) / len(windows)
    if mix is DELETE:
        assert mean >= 28, f"{mean:.1f} objects per {WINDOW} records at the default mix"
    else:
        assert mean <= 22, f"{mean:.1f} objects per {WINDOW} records with mix 8"
