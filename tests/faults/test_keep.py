"""``download.keep`` against the real daemon and moto, through a proxy that counts the bytes each
GET carried: what is kept is not fetched again, every record still arrives exactly once per
epoch, and a kept copy stands in only while it is intact and the source object unchanged."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import prefetchd
from prefetchd.config import load_config
from prefetchd.download.keep import hit_bound
from prefetchd.layout import Layout
from testkit.sample_data import object_sizes, upload_dataset
from testkit.trainers import delivered
from tests.conftest import _delete_bucket
from tests.e2e.test_mixed_sources import (
    books_bucket,
    mixed_config,
    plan,
    planned_reads,
    token_of,
)
from tests.e2e.test_mixed_sources import upload as upload_sources
from tests.faults.faultkit import (
    SIZES,
    finish_reader,
    ids_of,
    read_status,
    start_reader,
    wait_status,
)
from tests.faults.faultproxy import FaultProxy

pytestmark = pytest.mark.e2e
KIB, MIB = 1024, 1024**2


def keep_config(
    tmp_path: Path, write_config: Callable[..., Path], proxy: FaultProxy, **overrides: Any
) -> Path:
    settings = {"source__endpoint_url": proxy.url, "download__keep": "64MiB", **overrides}
    return write_config(tmp_path, **settings)


def run_to_end(config: Path, run_daemon: Callable[..., Any], tmp_path: Path, tag: str) -> Any:
    """One ``prefetchd run`` with a trainer reading every epoch; the trainer's result."""
    daemon = run_daemon(config)
    # A trainer must not read the finished status an earlier run left (it would stop at once).
    wait_status(config, lambda s: s.get("pid") == daemon.pid, 60, "the new daemon's status")
    out = tmp_path / f"trainer-{tag}.json"
    result = finish_reader(start_reader(config, out), out)
    assert daemon.wait(120) == 0, daemon.output()
    return result


def served_once(proxy: FaultProxy, dataset: dict[str, Any]) -> dict[str, int]:
    """Keys whose bytes did not cross the network exactly once: key -> bytes served."""
    served = {key: proxy.bytes_served(key) for key in dataset["keys"]}
    return {k: n for k, n in served.items() if n != dataset["sizes"][k]}


def test_two_epochs_with_keep_above_the_share_fetch_each_object_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", SIZES, seed=41)
    config = keep_config(tmp_path, write_config, proxy, epochs__count=2)
    result = run_to_end(config, run_daemon, tmp_path, "a")
    for epoch in (0, 1):
        assert delivered([result], epoch) == Counter(dataset["ids"]), f"epoch {epoch}"
    # Each object's bytes crossed the network once over both epochs: epoch 1 sent no GET.
    assert served_once(proxy, dataset) == {}
    status = read_status(config)
    assert status is not None
    n = len(dataset["keys"])
    assert (status["objects_downloaded"], status["keep_hits"]) == (n, n)
    assert status["keep_bytes"] == dataset["bytes"]
    by_epoch = {e["epoch"]: e for e in status["keep_epochs"]}
    assert by_epoch[1]["misses"] == 0 and by_epoch[1]["hit_ratio"] == 1.0
    assert status["keep_hit_ratio"] == 0.5  # one epoch downloaded, one from disk


def test_keep_half_the_share_hits_at_least_its_share_of_bytes(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    sizes = object_sizes(40, 32 * KIB, 96 * KIB, seed=5)
    dataset = upload_dataset(s3_client, bucket, "data/", kind="tfrecord", sizes=sizes, seed=42)
    keep = dataset["bytes"] // 2
    config = keep_config(tmp_path, write_config, proxy, epochs__count=3, download__keep=keep)
    result = run_to_end(config, run_daemon, tmp_path, "a")
    for epoch in (0, 1, 2):
        assert delivered([result], epoch) == Counter(dataset["ids"]), f"epoch {epoch}"
    status = read_status(config)
    assert status is not None
    by_epoch = {e["epoch"]: e for e in status["keep_epochs"]}
    bound = hit_bound(keep, dataset["bytes"])
    for epoch in (1, 2):
        figures = by_epoch[epoch]
        assert figures["hit_bytes"] + figures["miss_bytes"] == dataset["bytes"]
        assert figures["hit_bytes"] / dataset["bytes"] >= bound, figures
    assert 0 < status["keep_bytes"] <= keep
    # What is kept was fetched once; the rest once per epoch.
    fetched = sum(proxy.bytes_served(k) for k in dataset["keys"])
    assert fetched == 3 * dataset["bytes"] - by_epoch[1]["hit_bytes"] - by_epoch[2]["hit_bytes"]


def test_an_object_overwritten_at_the_source_is_fetched_again_with_its_new_records(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """A new job on the same cache_dir reuses the kept copies, except of the one object whose
    ETag changed since: that one is downloaded as it is now."""
    dataset = upload("tfrecord", SIZES, seed=43)
    config = keep_config(tmp_path, write_config, proxy, epochs__count=1)
    run_to_end(config, run_daemon, tmp_path, "a")
    changed = dataset["keys"][3]
    old_ids = set(ids_of(s3_client, bucket, changed, tmp_path))
    replacement = upload_dataset(
        s3_client, bucket, "other/", kind="tfrecord", sizes=[50 * KIB], seed=44, first_id=10**6
    )
    body = s3_client.get_object(Bucket=bucket, Key=replacement["keys"][0])["Body"].read()
    s3_client.put_object(Bucket=bucket, Key=changed, Body=body)
    before = {k: proxy.bytes_served(k) for k in dataset["keys"]}

    result = run_to_end(config, run_daemon, tmp_path, "b")  # same config: the job starts over
    expected = Counter(i for i in dataset["ids"] if i not in old_ids) + Counter(replacement["ids"])
    assert delivered([result], 0) == expected
    again = {k: proxy.bytes_served(k) - before[k] for k in dataset["keys"]}
    assert again == {k: (len(body) if k == changed else 0) for k in dataset["keys"]}
    status = read_status(config)
    assert status is not None and status["keep_hits"] == len(dataset["keys"]) - 1


def test_a_kept_file_corrupted_on_disk_is_caught_and_fetched_again(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", SIZES, seed=45)
    config = keep_config(tmp_path, write_config, proxy, epochs__count=1)
    run_to_end(config, run_daemon, tmp_path, "a")
    victim = _kept_file_of(tmp_path, dataset["keys"][5])
    with open(victim, "r+b") as f:  # same size, one byte different: only the CRC can tell
        f.seek(os.path.getsize(victim) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))

    result = run_to_end(config, run_daemon, tmp_path, "b")
    assert delivered([result], 0) == Counter(dataset["ids"])
    status = read_status(config)
    assert status is not None
    assert status["keep_refetched"] == 1
    assert status["keep_hits"] == len(dataset["keys"]) - 1
    key = dataset["keys"][5]
    assert proxy.bytes_served(key) == 2 * dataset["sizes"][key]


def test_the_kept_set_is_reused_after_the_daemon_is_sigkilled_between_epochs(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", SIZES, seed=46)
    config = keep_config(
        tmp_path,
        write_config,
        proxy,
        epochs__count=2,
        download__window="2MiB",
        output__shard_size="128KiB",
        output__ram_budget="1MiB",
    )
    first = run_daemon(config)
    out = tmp_path / "t.json"
    reader = start_reader(config, out, "--delay", "0.2")
    wait_status(config, lambda s: s.get("download_epoch") == 1, 90, "epoch 1 started")
    first.kill_group(signal.SIGKILL)
    first.proc.wait(30)
    second = run_daemon(config)
    result = finish_reader(reader, out)
    assert second.wait(120) == 0, second.output()
    for epoch in (0, 1):
        assert delivered([result], epoch) == Counter(dataset["ids"]), f"epoch {epoch}"
    assert served_once(proxy, dataset) == {}  # nothing kept was fetched again after the kill
    status = read_status(config)
    assert status is not None and status["keep_hits"] > 0  # served by the restarted daemon
    assert "resuming job " in second.output()


def _kept_file_of(tmp_path: Path, key: str) -> Path:
    keep = tmp_path / "cache" / "keep"
    for meta in keep.glob("*.json"):
        if json.loads(meta.read_text())["key"] == key:
            return keep / meta.name.removesuffix(".json")
    raise AssertionError(f"{key} is not kept")


def test_a_disk_too_small_for_keep_stops_keeping_and_training_goes_on(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
    small_tmpfs: Callable[[str], Path],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=47)  # 4.9 MiB
    disk = small_tmpfs("5m")
    config = keep_config(
        tmp_path,
        write_config,
        proxy,
        epochs__count=2,
        download__cache_dir=disk / "cache",
        download__window="2MiB",
    )
    daemon = run_daemon(config)
    out = tmp_path / "trainer.json"
    result = finish_reader(start_reader(config, out), out)
    assert daemon.wait(120) == 0, daemon.output()
    for epoch in (0, 1):
        assert delivered([result], epoch) == Counter(dataset["ids"]), f"epoch {epoch}"
    status = read_status(config)
    assert status is not None
    assert status["keep_stopped"] == 1
    assert 0 < status["keep_bytes"] < dataset["bytes"]
    assert status["keep_hits"] > 0  # what was kept before the disk filled is still used
    logged = [ln for ln in daemon.output(limit=10**6).splitlines() if "no longer keeping" in ln]
    assert len(logged) == 1, logged


def test_keep_with_three_sources_fetches_what_is_kept_once_and_the_rest_once_per_read(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """``sources:`` (three sources of three formats, weights 0.6/0.3/0.1, ``repeat``: the small
    sources are read more than once per epoch) with ``keep`` half of the bytes, three epochs:
    every planned record exactly once per epoch; each kept object's bytes crossed the network
    once over the three epochs, whichever epoch and period read it (a kept object is found by
    bucket, key and ETag, not by its local name); every other object's once per read; every
    source keeps some of its objects, and later epochs hit about half of their bytes (the
    kept fraction; ``keep.hit_bound``, as for one source)."""
    up = upload_sources(s3_client, bucket)
    try:
        total = sum(size for sizes in up.sizes.values() for size in sizes.values())
        keep = total // 2
        config = mixed_config(
            tmp_path,
            "keep",
            write_config,
            bucket,
            epochs={"count": 3},
            source__endpoint_url=proxy.url,
            download__keep=keep,
        )
        daemon = run_daemon(config)
        tokens = [
            [token_of(bytes(r)) for r in prefetchd.records(config, epoch=e, timeout=120)]
            for e in range(3)
        ]
        assert daemon.wait(120) == 0, daemon.output()
        reads: Counter[tuple[str, str]] = Counter()
        for e, got in enumerate(tokens):
            assert Counter(got) == plan(up, config, e), f"epoch {e}: every planned record once"
            reads.update(planned_reads(up, config, e))
        keep_dir = Layout.of(load_config(config)).cache_keep
        kept = {json.loads(p.read_text())["key"] for p in keep_dir.iterdir() if p.suffix == ".json"}
        status = read_status(config)
        assert status is not None
        assert 0 < status["keep_bytes"] <= keep
        for (name, key), n in reads.items():
            size, served = up.sizes[name][key], proxy.bytes_served(key)
            assert served == (size if key in kept else n * size), (name, key, n, served)
        for name in up.sizes:
            assert any(key in kept for key in up.sizes[name]), f"{name}: nothing kept"
        by_epoch = {e["epoch"]: e for e in status["keep_epochs"]}
        for epoch in (1, 2):
            figures = by_epoch[epoch]
            ratio = figures["hit_bytes"] / (figures["hit_bytes"] + figures["miss_bytes"])
            assert ratio >= hit_bound(keep, total), figures  # measured 0.518, 0.522
    finally:
        _delete_bucket(s3_client, books_bucket(bucket))


def test_keep_with_three_sources_is_reused_after_the_daemon_is_sigkilled_between_epochs(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """Three sources, ``keep`` above their bytes: the daemon is SIGKILLed once epoch 0 is
    downloaded and epoch 1 started (nothing read yet), and started again. Each object's bytes
    crossed the network once over both runs (every read of epoch 1, by either daemon, came from
    a kept copy), the restarted daemon chose the same kept set over the three sources and found
    all of it, and each epoch delivers its plan exactly once."""
    up = upload_sources(s3_client, bucket)
    try:
        total = sum(size for sizes in up.sizes.values() for size in sizes.values())
        config = mixed_config(
            tmp_path,
            "kill",
            write_config,
            bucket,
            source__endpoint_url=proxy.url,
            download__keep=2 * total,
        )
        layout = Layout.of(load_config(config))
        first = run_daemon(config)
        wait_status(
            config,
            lambda s: s.get("download_epoch") == 1 and layout.downloaded_marker(0).exists(),
            90,
            "epoch 0 downloaded, epoch 1 started",
        )
        first.kill_group(signal.SIGKILL)
        first.proc.wait(30)
        second = run_daemon(config)
        tokens = [
            [token_of(bytes(r)) for r in prefetchd.records(config, epoch=e, timeout=120)]
            for e in range(2)
        ]
        assert second.wait(120) == 0, second.output()
        for e, got in enumerate(tokens):
            assert Counter(got) == plan(up, config, e), f"epoch {e}: every planned record once"
        for name, sizes in up.sizes.items():
            for key, size in sizes.items():
                assert proxy.bytes_served(key) == size, (name, key, proxy.bytes_served(key))
        # the restarted daemon chose the same set over the three sources and found all of it
        objects = sum(len(sizes) for sizes in up.sizes.values())
        assert f"download.keep: {objects} objects" in second.output()
        assert f"chosen to keep, {objects} already kept" in second.output()
        assert "resuming job " in second.output()
    finally:
        _delete_bucket(s3_client, books_bucket(bucket))
