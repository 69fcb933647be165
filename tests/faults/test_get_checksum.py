"""The crt and native clients against SeaweedFS, a store that (like S3, unlike moto) answers a
whole-object GET with the object's checksum: an object fetched in one request is verified by
that CRC — no MD5 of the file, no HEAD — and a byte flipped on the way is caught by it. Objects
of several parts keep their ranged GETs and their MD5 ETag. Driven the way the downloader
drives a transfer (prepare, submit_parts, wait for done). The native client takes that CRC
while the body arrives: nothing is read back."""

from __future__ import annotations

import hashlib
import os
import queue
import time
from pathlib import Path

import pytest

from prefetchd.config import Config, config_from_dict
from prefetchd.download.jobs import Job
from prefetchd.download.order import SourceObject
from prefetchd.download.transfer import make_transfer
from prefetchd.download.verify import IntegrityError
from testkit import sample_data
from tests.faults.faultproxy import FaultProxy, Rule

pytest.importorskip("awscrt")

BUCKET = "prefetchd-get-checksum"
CLIENTS = ["crt", "native"]
PART = 256 * 1024  # download.part_size: objects up to this size are one GET
SMALL = os.urandom(100 * 1024)
LARGE = os.urandom(PART * 3 + 5)  # three ranged parts and a bit


@pytest.fixture(scope="module")
def stored(seaweedfs: str) -> dict[str, SourceObject]:
    """The objects, put with boto3's default (it sends a CRC32, which the store keeps)."""
    client = sample_data.make_client(seaweedfs)
    sample_data.ensure_bucket(client, BUCKET)
    objects = {}
    for key, body in (("data/small", SMALL), ("data/large", LARGE)):
        client.put_object(Bucket=BUCKET, Key=key, Body=body)
        etag = client.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"')
        assert etag == hashlib.md5(body).hexdigest()  # single-part uploads: an MD5 ETag too
        objects[key] = SourceObject(key, len(body), etag)
    return objects


def config_for(tmp_path: Path, endpoint: str, client: str) -> Config:
    return config_from_dict(
        {
            "source": {"url": f"s3://{BUCKET}/data/", "endpoint_url": endpoint, "format": "raw"},
            "download": {
                "cache_dir": str(tmp_path / "cache"),
                "part_size": PART,
                "concurrency": 4,
                "client": client,
                "retries": 2,
            },
            "output": {"ram_dir": str(tmp_path / "ram")},
            "status": {"state_dir": str(tmp_path / "state")},
        }
    )


def fetch(config: Config, obj: SourceObject, tmp_path: Path) -> Job:
    results: queue.Queue[Job] = queue.Queue()
    transfer = make_transfer(config, results.put)
    job = Job(0, 0, obj, "o0", tmp_path / f"o-{time.monotonic_ns()}.part")
    try:
        transfer.prepare(job)
        for _ in range(600):  # bounded: 60 s for a slot
            if transfer.submit_parts(job, timeout=0.1):
                break
        else:
            pytest.fail("no free slot for 60 s: slots leaked")
        assert results.get(timeout=60) is job
    finally:
        transfer.shutdown()
    return job


@pytest.mark.parametrize("client", CLIENTS)
def test_a_one_request_object_is_verified_by_the_crc_its_get_answered_with(
    client: str, seaweedfs: str, stored: dict[str, SourceObject], tmp_path: Path
) -> None:
    job = fetch(config_for(tmp_path, seaweedfs, client), stored["data/small"], tmp_path)
    assert job.error is None
    assert job.tmp.read_bytes() == SMALL
    assert job.answered is not None and job.answered.algorithm == "CRC32"
    assert job.lookups == 0 and job.unverified is None
    if client == "native":  # the CRC taken as the body arrived: the file is not read back
        assert job.received == ("CRC32", job.answered.digest)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_byte_flipped_in_a_one_request_object_fails_its_crc(
    client: str, seaweedfs: str, stored: dict[str, SourceObject], tmp_path: Path
) -> None:
    with FaultProxy(seaweedfs, seed=3) as proxy:
        proxy.add(Rule("flip", key="data/small", ranged=False, times=1))
        job = fetch(config_for(tmp_path, proxy.url, client), stored["data/small"], tmp_path)
        assert proxy.hits("flip") == 1
        assert [r.ranged for r in proxy.requests if r.key] == [False], "one whole-object GET"
    assert isinstance(job.error, IntegrityError)
    assert "does not match the x-amz-checksum-crc32 of the GET" in str(job.error)


@pytest.mark.parametrize("client", CLIENTS)
def test_an_object_of_several_parts_keeps_ranged_gets_and_its_md5_etag(
    client: str, seaweedfs: str, stored: dict[str, SourceObject], tmp_path: Path
) -> None:
    with FaultProxy(seaweedfs, seed=4) as proxy:
        proxy.add(Rule("flip", key="data/large", ranged=True, times=1))
        config = config_for(tmp_path, proxy.url, client)
        bad = fetch(config, stored["data/large"], tmp_path)
        good = fetch(config, stored["data/large"], tmp_path)
        assert all(r.ranged for r in proxy.requests if r.key)
    assert bad.answered is None and isinstance(bad.error, IntegrityError)
    assert "does not match the ETag" in str(bad.error)
    assert good.error is None and good.tmp.read_bytes() == LARGE
