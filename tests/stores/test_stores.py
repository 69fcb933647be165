"""End to end against real object stores: Ceph RGW and the JuiceFS S3 gateway (one server per
store for the module, tests/stores/conftest.py), the real daemon and trainers reading its
shards with TensorFlow.

Per store: both download clients on TFRecord objects, one of them uploaded in parts (its ETag
is a multipart one), two epochs exactly once; raw objects under nested prefixes with spaces and
non-ASCII in their keys, more of them than one ListObjectsV2 page holds (on Ceph; the
daemon's lister with a small page on both); ``download.keep`` serving epoch 1, with an object
overwritten between the two epochs (a new ETag: its new records in epoch 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefetchd.config import CLIENTS, load_config
from prefetchd.download.listing import list_objects
from prefetchd.download.store import make_client
from testkit import sample_data
from testkit.trainers import delivered
from tests.e2e.trainers import KIB, MIB, finish, start_consumer

from .conftest import Store

pytestmark = pytest.mark.e2e

SMALL = [1 * KIB, 17 * KIB, 64 * KIB, 300 * KIB, 700 * KIB, 1 * MIB, 90 * KIB, 5 * KIB]
PART = 5 * MIB  # S3's least part size (the JuiceFS gateway does not enforce it)
PATH_STYLE = {"source__addressing_style": "path"}


def read_status(config: Path) -> dict[str, Any]:
    state = Path(yaml.safe_load(config.read_text())["status"]["state_dir"])
    status: dict[str, Any] = json.loads((state / "status.json").read_text())
    return status


def run_job(
    config: Path, run_daemon: Callable[..., Any], out: Path, *extra: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One ``prefetchd run`` and one TensorFlow trainer reading all of it: (trainer's result,
    the daemon's final status)."""
    daemon = run_daemon(config)
    result = finish(start_consumer(config, out, *extra), out)
    assert daemon.wait(180) == 0, daemon.output()
    return result, read_status(config)


def put_multipart(s3: Any, bucket: str, key: str, body: bytes) -> str:
    """``body`` in PART-sized parts; the ETag HEAD answers (CompleteMultipartUpload's own is
    empty on Ceph 16)."""
    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(body), PART), start=1):
        reply = s3.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=body[start : start + PART],
        )
        parts.append({"PartNumber": number, "ETag": reply["ETag"]})
    s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
    )
    etag: str = s3.head_object(Bucket=bucket, Key=key)["ETag"]
    return etag


def listed_etags(s3: Any, bucket: str, prefix: str = "data/") -> dict[str, str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", ())}


def no_faults(status: dict[str, Any]) -> None:
    assert (status["objects_skipped"], status["errors"]) == (0, 0), status.get("last_errors")


@pytest.mark.parametrize("client", CLIENTS)
def test_tfrecord_with_a_multipart_object_two_epochs_exactly_once(
    client: str,
    store: Store,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SMALL, seed=61)
    [(key, body, big_ids)] = sample_data.generate(
        "data/parts/", kind="tfrecord", sizes=[PART + 1 * MIB], seed=62, first_id=10**6
    )
    etag = put_multipart(s3_client, bucket, key, body)
    assert etag.endswith('-2"'), f"{store.kind}: not a multipart ETag: {etag}"
    assert listed_etags(s3_client, bucket)[key] == etag, "the listing's ETag is not HEAD's"

    config = write_config(tmp_path, download__client=client, **PATH_STYLE)
    result, status = run_job(config, run_daemon, tmp_path / "trainer.json")
    expected = Counter(dataset["ids"] + big_ids)
    for epoch in (0, 1):
        assert delivered([result], epoch) == expected, f"epoch {epoch}: records lost or doubled"
    no_faults(status)
    assert status["objects_downloaded"] == 2 * (len(SMALL) + 1)


# Ceph answers 1,000 keys a page: 1,100 objects take two pages of the daemon's own listing.
# The JuiceFS gateway answers up to 4,500 a page (the daemon sends no max-keys): there only the
# daemon's lister, with a small max-keys below, crosses pages.
RAW_OBJECTS = {"ceph": 1_100, "juicefs": 300}


def test_raw_objects_under_nested_prefixes_with_spaces_across_listing_pages(
    store: Store,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    rng = random.Random(63)
    objects = {
        f"data/set {i % 3}/sub dir {i % 5}/obj {i:04d} + caf\u00e9 & co.bin": rng.randbytes(
            rng.randrange(64, 2048)
        )
        for i in range(RAW_OBJECTS[store.kind])
    }
    with ThreadPoolExecutor(8) as pool:
        for done in [
            pool.submit(s3_client.put_object, Bucket=bucket, Key=key, Body=body)
            for key, body in objects.items()
        ]:
            done.result()
    first = s3_client.list_objects_v2(Bucket=bucket, Prefix="data/")
    if store.kind == "ceph":
        assert first["IsTruncated"] and first["KeyCount"] == 1000, "one page holds them all"
    config = write_config(
        tmp_path,
        source__format="raw",
        epochs__count=1,
        download__client="classic",
        download__concurrency=16,
        **PATH_STYLE,
    )
    # The daemon's lister (URL-encoded keys, continuation tokens), 37 keys a page.
    lister = make_client(load_config(config))
    listed = [o.key for o in list_objects(lister, bucket, "data/", page_size=37)]
    assert listed == sorted(objects, key=lambda k: k.encode()), "listing not whole or in order"

    result, status = run_job(config, run_daemon, tmp_path / "trainer.json", "--digest")
    expected = Counter(f"{k} {hashlib.sha256(b).hexdigest()}" for k, b in objects.items())
    assert delivered([result], 0) == expected, "raw records lost, doubled or changed"
    no_faults(status)


def test_an_object_overwritten_between_two_epochs_of_one_run(
    store: Store,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """With ``download.keep``, each epoch after the first lists the bucket again: an object
    downloaded (and kept) in epoch 0 and overwritten before epoch 1 has a new ETag there, so
    epoch 1 delivers its new records and every other object from its kept copy."""
    dataset = upload("tfrecord", [256 * KIB] * 24, seed=66)
    n = len(dataset["keys"])
    config = write_config(
        tmp_path,
        download__keep="64MiB",
        download__window="1MiB",
        output__ram_budget="1MiB",
        output__shard_size="128KiB",
        epochs__shuffle=False,  # key order: the first key is downloaded first
        **PATH_STYLE,
    )
    daemon = run_daemon(config)
    # No trainer yet: the daemon fills the RAM budget and the window in epoch 0, then waits.
    stalled = wait_stalled(config, daemon)
    assert 0 < stalled < n, f"{stalled} of {n} objects downloaded before the trainer came"

    changed = dataset["keys"][0]  # downloaded: the first of epoch 0's order
    old = tmp_path / "old.tfrecord"
    old.write_bytes(s3_client.get_object(Bucket=bucket, Key=changed)["Body"].read())
    gone = set(sample_data.read_ids(old))
    [(_, body, new_ids)] = sample_data.generate(
        "other/", kind="tfrecord", sizes=[200 * KIB], seed=67, first_id=10**6
    )
    before = listed_etags(s3_client, bucket)[changed]
    s3_client.put_object(Bucket=bucket, Key=changed, Body=body)
    assert listed_etags(s3_client, bucket)[changed] != before

    out = tmp_path / "trainer.json"
    result = finish(start_consumer(config, out), out)
    assert daemon.wait(180) == 0, daemon.output()
    status = read_status(config)
    assert delivered([result], 0) == Counter(dataset["ids"]), "epoch 0 as listed at the start"
    expected = Counter(i for i in dataset["ids"] if i not in gone) + Counter(new_ids)
    assert delivered([result], 1) == expected, "epoch 1 as listed again"
    no_faults(status)
    assert status["objects_downloaded"] == n + 1  # epoch 0, and the changed object again
    assert status["keep_hits"] == n - 1


def wait_stalled(config: Path, daemon: Any, quiet: float = 2.0, timeout: float = 60) -> int:
    """Wait until the daemon's ``objects_downloaded`` stays the same for ``quiet`` seconds;
    return it."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        assert daemon.alive(), daemon.output()
        with contextlib.suppress(OSError, ValueError):
            count = read_status(config)["objects_downloaded"]
            if count != last:
                last, since = count, time.monotonic()
            elif count > 0 and time.monotonic() - since >= quiet:
                return int(count)
        time.sleep(0.1)
    pytest.fail(f"the daemon never settled (objects_downloaded {last})\n{daemon.output()}")
