"""A slow listing, seen from outside: the real daemon against moto behind the fault proxy, every
ListObjectsV2 page held back. While the downloader lists, status counts the objects listed so
far and the verdict says the source is being listed, instead of a download rate of 0 MB/s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults.faultkit import read_status, start_reader, wait_status
from tests.faults.faultproxy import FaultProxy, Rule

pytestmark = pytest.mark.e2e

OBJECTS = 1100  # two ListObjectsV2 pages of at most 1000 keys
PAGE_STALL = 4.0  # seconds each page is held before its body


def delete(s3_client: Any, bucket: str, keys: list[str]) -> None:
    """In batches the bucket fixture's clean-up would not make (moto deletes 1000 at most)."""
    for start in range(0, len(keys), 500):
        batch = [{"Key": k} for k in keys[start : start + 500]]
        s3_client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})


def test_a_slow_listing_is_counted_in_status_and_named_by_the_verdict(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    keys = [f"data/{i:05d}.bin" for i in range(OBJECTS)]
    for key in keys:
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    request.addfinalizer(lambda: delete(s3_client, bucket, keys))
    proxy.add(Rule("stall", listing=True, seconds=PAGE_STALL, times=None))
    config = write_config(
        tmp_path, source__endpoint_url=proxy.url, source__format="raw", epochs__count=1
    )
    daemon = run_daemon(config)
    reader = start_reader(config, tmp_path / "trainer.json")  # a trainer waiting for shards
    try:
        status = wait_status(
            config,
            lambda s: s.get("objects_listed") == 1000,
            timeout=60,
            what="the first page's 1000 objects counted while the second is listed",
        )
        assert status["download_activity"] == "listing"
        assert status["state"] == "starting"  # the downloader is ready once it has listed
        assert status["bottleneck"]["verdict"] == "unknown"
        assert status["bottleneck"]["summary"] == (
            "the daemon is starting: the downloader is listing the source, 1000 objects so far"
        )
        done = wait_status(
            config,
            lambda s: s.get("state") == "running" and s.get("download_activity") != "listing",
            timeout=60,
            what="the listing's end",
        )
        assert done["objects_listed"] == OBJECTS
        assert "listing" not in done["bottleneck"]["summary"]
    finally:
        reader.kill()
        reader.wait()
    assert daemon.alive(), read_status(config)
