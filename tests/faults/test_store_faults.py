"""Faults from the object store, injected by a proxy between the daemon and moto: every record
arrives exactly once, or the documented policy applies and is counted — never silently."""

from __future__ import annotations

import hashlib
import random
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefetchd.errors import EXIT_INCOMPLETE
from testkit.sample_data import raw_object, tfrecord_object
from testkit.trainers import delivered, start_trainer
from tests.faults.faultkit import (
    error_keys,
    finish_reader,
    ids_of,
    read_status,
    start_reader,
    wait_status,
)
from tests.faults.faultproxy import FaultProxy, Rule

pytestmark = pytest.mark.e2e
CONSUMER = "tests.e2e.consume"  # the e2e tests' TensorFlow trainer
CLIENTS = ["classic", "crt", "native"]

KIB, MIB = 1024, 1024**2
# single GETs and ranged GETs (part_size is 256 KiB in the test config)
SIZES = [3 * KIB, 40 * KIB, 700 * KIB, 90 * KIB, 1 * MIB, 12 * KIB, 300 * KIB, 5 * KIB]

PROXY_SEED = 1  # the fault proxy's (the `proxy` fixture's)


def pause_seconds(status: dict[str, Any]) -> int:
    found = re.search(r"retrying in ([0-9]+)s", str(status.get("download_activity")))
    return int(found.group(1)) if found else 0


def run_epoch(
    tmp_path: Path,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
    *,
    trainer: Callable[[Path, Path], Any] = start_reader,
    **overrides: Any,
) -> tuple[Path, Any, Any]:
    """One epoch through ``proxy``: the config, the daemon, and ``(trainer, its output)``."""
    config = write_config(tmp_path, source__endpoint_url=proxy.url, epochs__count=1, **overrides)
    daemon = run_daemon(config)
    out = tmp_path / "trainer.json"
    return config, daemon, (trainer(config, out), out)


def log_lines(daemon: Any, word: str) -> list[str]:
    return [ln for ln in daemon.output(limit=10**6).splitlines() if word in ln]


def start_tf_trainer(config: Path, out: Path) -> subprocess.Popen[bytes]:
    """A trainer reading with TensorFlow's TFRecordDataset; raw records as "<key> <sha256>"."""
    return start_trainer(CONSUMER, config, out, "--digest")


def upload_multipart(
    s3_client: Any, bucket: str, key: str, body: bytes, checksum: dict[str, str]
) -> None:
    """``body`` in 5 MiB parts (S3's least), with ``checksum`` (``ChecksumAlgorithm``, and
    ``ChecksumType``) or none; boto3 computes the part checksums."""
    up = s3_client.create_multipart_upload(Bucket=bucket, Key=key, **checksum)
    algorithm = checksum.get("ChecksumAlgorithm")
    parts = []
    for number, start in enumerate(range(0, len(body), 5 * MIB), start=1):
        extra = {"ChecksumAlgorithm": algorithm} if algorithm else {}
        reply = s3_client.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=up["UploadId"],
            PartNumber=number,
            Body=body[start : start + 5 * MIB],
            **extra,
        )
        part = {"PartNumber": number, "ETag": reply["ETag"]}
        if algorithm:
            part[f"Checksum{algorithm}"] = reply[f"Checksum{algorithm}"]
        parts.append(part)
    s3_client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
    )


@pytest.mark.parametrize("client", CLIENTS)
def test_transient_errors_resets_short_bodies_and_stalls_are_retried(
    client: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", SIZES, seed=11)
    whole = client == "classic"  # the CRT: ranged GETs for the objects of several parts
    for rule in (
        Rule("error", status=500, code="InternalError", times=3),
        Rule("error", status=502, code="BadGateway", times=2),
        Rule("error", status=503, code="SlowDown", times=3),
        Rule("error", status=400, code="RequestTimeout", times=2),
        Rule("reset", ranged=True, times=2),
        Rule("short", ranged=not whole, times=2),
        Rule("stall", seconds=1.5, times=2),
    ):
        proxy.add(rule)
    config, daemon, (reader, out) = run_epoch(
        tmp_path, write_config, run_daemon, proxy, download__client=client
    )
    result = finish_reader(reader, out)
    assert daemon.wait(120) == 0, daemon.output()

    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"
    faults = proxy.faults_by_action()
    assert faults["error"] == 10 and faults["reset"] == 2 and faults["short"] == 2, faults
    status = read_status(config)
    assert status is not None
    retried = faults["error"] + faults["reset"] + faults["short"]
    if client != "crt":  # awscrt does not report its own retries (reliability.md, gaps)
        assert status["retries"] >= retried, f"status counts {status['retries']} retries"
    assert status["errors"] == 0 and status["objects_skipped"] == 0


def test_throttling_longer_than_the_retry_budget_pauses_instead_of_skipping(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", SIZES, seed=12)
    proxy.add(Rule("error", status=503, code="SlowDown", times=None))
    config, daemon, (reader, out) = run_epoch(
        tmp_path, write_config, run_daemon, proxy, download__retries=1
    )
    status = wait_status(
        config,
        lambda s: "paused" in str(s.get("download_activity")),
        90,
        "the downloader to show it paused",
    )
    assert status["state"] == "running" and daemon.alive()
    assert "SlowDown" in status["download_activity"]
    assert status["objects_skipped"] == 0
    proxy.clear()  # the store recovers
    result = finish_reader(reader, out)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"
    final = read_status(config)
    assert final is not None and final["objects_skipped"] == 0 and final["retries"] > 0


@pytest.mark.parametrize("client", CLIENTS)
def test_flipped_byte_in_one_ranged_part_is_detected_and_refetched(
    client: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """boto3 does not verify ranged downloads; prefetchd checks the whole object (here every
    record's CRC, which is cheaper than the MD5 its ETag also offers)."""
    dataset = upload("tfrecord", SIZES, seed=13)
    victim = dataset["keys"][4]  # 1 MiB: four ranged parts, single-part upload (MD5 ETag)
    proxy.add(Rule("flip", key=victim, ranged=True, times=1))
    config, daemon, (reader, out) = run_epoch(
        tmp_path, write_config, run_daemon, proxy, download__client=client
    )
    result = finish_reader(reader, out)
    assert daemon.wait(120) == 0, daemon.output()
    assert proxy.hits("flip") == 1
    assert delivered([result]) == Counter(dataset["ids"]), "corrupt or missing records"
    status = read_status(config)
    assert status is not None and status["errors"] == 0 and status["retries"] >= 1
    assert status["integrity_failures"] == 1 and status["verify_requests"] == 0
    assert "re-fetching" in daemon.output() and victim in daemon.output()


def test_flipped_byte_in_a_multipart_uploaded_object_is_caught_by_record_crcs(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """A multipart upload's ETag is not an MD5, so only the TFRecord CRCs can tell."""
    dataset = upload("tfrecord", SIZES[:4], seed=14)
    ids = list(range(100_000, 100_084))
    body = tfrecord_object(ids, 64 * KIB, random.Random(14))
    key = "data/multipart.tfrecord"
    up = s3_client.create_multipart_upload(Bucket=bucket, Key=key)
    parts = []
    for number, start in enumerate(range(0, len(body), 5 * MIB), start=1):
        part = s3_client.upload_part(
            Bucket=bucket,
            Key=key,
            UploadId=up["UploadId"],
            PartNumber=number,
            Body=body[start : start + 5 * MIB],
        )
        parts.append({"PartNumber": number, "ETag": part["ETag"]})
    s3_client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
    )
    assert "-" in s3_client.head_object(Bucket=bucket, Key=key)["ETag"]
    proxy.add(Rule("flip", key=key, ranged=True, times=1))
    config, daemon, (reader, out) = run_epoch(tmp_path, write_config, run_daemon, proxy)
    result = finish_reader(reader, out)
    assert daemon.wait(120) == 0, daemon.output()
    assert proxy.hits("flip") == 1
    assert delivered([result]) == Counter(dataset["ids"] + ids), "corrupt or missing records"
    status = read_status(config)
    assert status is not None and status["errors"] == 0, (status or {}).get("last_errors")


# How the multipart object is uploaded, and the HEADs verifying it costs: the checksum HEAD,
# plus part 1's HEAD when the check is over the parts. moto stores CRC32C as CRC32 unless the
# `crc32c` package is installed, so the tests use the algorithms it gets right.
MULTIPART_CHECKS = {
    "multipart-etag": ({}, 2),
    "sha256-composite": ({"ChecksumAlgorithm": "SHA256"}, 2),
    "crc32-full-object": ({"ChecksumAlgorithm": "CRC32", "ChecksumType": "FULL_OBJECT"}, 1),
}
RAW_MULTIPART_CONFIG = {  # a 10.3 MiB raw object is one 10.3 MiB record
    "source__format": "raw",
    "download__window": "32MiB",
    "download__part_size": "1MiB",
    "output__shard_size": "16MiB",
    "output__ram_budget": "64MiB",
}


def raw_multipart_dataset(
    s3_client: Any, bucket: str, upload: Callable[..., Any], check: str, seed: int
) -> tuple[str, Counter[str]]:
    """Small single-part raw objects and one multipart one; returns its key and the
    ``"<key> <sha256>"`` records one epoch must deliver."""
    dataset = upload("raw", [3 * KIB, 40 * KIB, 700 * KIB], seed=seed)
    key = "data/multipart.bin"
    body = raw_object(10 * MIB + 300 * KIB, random.Random(seed))
    upload_multipart(s3_client, bucket, key, body, MULTIPART_CHECKS[check][0])
    assert s3_client.head_object(Bucket=bucket, Key=key)["ETag"].endswith('-3"')
    expected = Counter(f"{k} {sha}" for k, sha in dataset["sha256"].items())
    expected[f"{key} {hashlib.sha256(body).hexdigest()}"] += 1
    return key, expected


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("check", list(MULTIPART_CHECKS))
def test_flipped_byte_in_a_multipart_raw_object_is_caught_by_its_etag_or_s3_checksum(
    check: str,
    client: str,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """No TFRecord CRCs and no MD5 ETag: the multipart ETag or the S3 checksum, learnt with one
    or two HEADs for this object only, catches the byte; TensorFlow reads every sample once."""
    key, expected = raw_multipart_dataset(s3_client, bucket, upload, check, seed=17)
    proxy.add(Rule("flip", key=key, ranged=True, times=1))
    config, daemon, (trainer, out) = run_epoch(
        tmp_path,
        write_config,
        run_daemon,
        proxy,
        trainer=start_tf_trainer,
        download__client=client,
        **RAW_MULTIPART_CONFIG,
    )
    result = finish_reader(trainer, out)
    assert daemon.wait(120) == 0, daemon.output()

    assert proxy.hits("flip") == 1
    assert delivered([result]) == expected, "corrupt, missing or doubled samples"
    status = read_status(config)
    assert status is not None
    assert status["integrity_failures"] == 1 and status["errors"] == 0, status["last_errors"]
    assert status["objects_unverified"] == 0
    # the small single-part objects cost nothing; the re-fetch asks nothing again
    assert status["verify_requests"] == MULTIPART_CHECKS[check][1]
    refetch = log_lines(daemon, "re-fetching")
    assert len(refetch) == 1 and key in refetch[0], refetch


@pytest.mark.parametrize("client", CLIENTS)
def test_flipped_byte_in_a_single_part_raw_object_is_caught_by_its_md5_etag(
    client: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """No record CRCs in `raw` input: the whole-object MD5 (the ETag of a single-part upload)
    catches a byte flipped in one ranged part, with no extra request."""
    dataset = upload("raw", [3 * KIB, 40 * KIB, 3 * MIB + 5], seed=19)
    victim = dataset["keys"][2]  # four ranged parts of 1 MiB
    proxy.add(Rule("flip", key=victim, ranged=True, times=1))
    config, daemon, (trainer, out) = run_epoch(
        tmp_path,
        write_config,
        run_daemon,
        proxy,
        trainer=start_tf_trainer,
        download__client=client,
        **RAW_MULTIPART_CONFIG,
    )
    result = finish_reader(trainer, out)
    assert daemon.wait(120) == 0, daemon.output()

    assert proxy.hits("flip") == 1
    expected = Counter(f"{k} {sha}" for k, sha in dataset["sha256"].items())
    assert delivered([result]) == expected, "corrupt, missing or doubled samples"
    status = read_status(config)
    assert status is not None and status["errors"] == 0, (status or {}).get("last_errors")
    assert status["integrity_failures"] == 1 and status["verify_requests"] == 0
    refetch = log_lines(daemon, "re-fetching")
    assert len(refetch) == 1 and victim in refetch[0] and "MD5" in refetch[0], refetch


def test_multipart_object_corrupt_on_every_fetch_is_skipped_after_three_not_looped(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """The same bad bytes every time (a store whose checksum does not describe its data):
    three fetches, then skipped and counted like any corrupt object; the rest is delivered."""
    key, expected = raw_multipart_dataset(s3_client, bucket, upload, "sha256-composite", seed=18)
    proxy.add(Rule("flip", key=key, ranged=True, times=None))
    config, daemon, (trainer, out) = run_epoch(
        tmp_path, write_config, run_daemon, proxy, trainer=start_tf_trainer, **RAW_MULTIPART_CONFIG
    )
    result = finish_reader(trainer, out)
    # one object skipped: the job does not end like a clean one
    assert daemon.wait(120) == EXIT_INCOMPLETE, daemon.output()

    healthy = Counter({r: n for r, n in expected.items() if not r.startswith(key)})
    assert delivered([result]) == healthy
    status = read_status(config)
    assert status is not None
    assert status["integrity_failures"] == 3 and status["objects_skipped"] == 1
    assert key in error_keys(status)
    # checksum and part 1 HEADs; the same digest twice confirms parts 2 and 3; then nothing more
    assert status["verify_requests"] == 4
    skipped = log_lines(daemon, "skipping")
    assert len(skipped) == 1 and "corrupt after 3 fetches" in skipped[0], skipped
    assert "the same as the previous fetch" in skipped[0]


@pytest.mark.parametrize(
    ("status_code", "code", "what"),
    [(404, "NoSuchKey", "deleted after it was listed"), (412, "PreconditionFailed", "overwritten")],
)
def test_object_gone_or_changed_after_listing_is_skipped_counted_and_logged_once(
    status_code: int,
    code: str,
    what: str,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", SIZES, seed=15)
    victim = dataset["keys"][2]
    lost = ids_of(s3_client, bucket, victim, tmp_path)
    proxy.add(Rule("error", key=victim, status=status_code, code=code, times=None))
    config, daemon, (reader, out) = run_epoch(tmp_path, write_config, run_daemon, proxy)
    result = finish_reader(reader, out)
    # one object skipped: the job does not end like a clean one
    assert daemon.wait(120) == EXIT_INCOMPLETE, daemon.output()

    expected = Counter(dataset["ids"]) - Counter(lost)
    assert delivered([result]) == expected, "healthy records lost or doubled"
    status = read_status(config)
    assert status is not None
    assert status["objects_skipped"] == 1 and status["errors"] == 1
    assert victim in error_keys(status)
    lines = log_lines(daemon, victim)
    assert len(lines) == 1 and what in lines[0], lines


def test_access_denied_pauses_visibly_without_a_tight_loop(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """Expired credentials (403) mid-run: a clear state, slow retries, then recovery."""
    dataset = upload("tfrecord", SIZES, seed=16)
    proxy.add(Rule("error", status=403, code="ExpiredToken", times=None))
    config, daemon, (reader, out) = run_epoch(tmp_path, write_config, run_daemon, proxy)
    status = wait_status(
        config,
        lambda s: "access denied" in str(s.get("download_activity")),
        60,
        "status to say access is denied",
    )
    assert "ExpiredToken" in status["download_activity"]
    first = proxy.gets()
    wait_status(config, lambda s: pause_seconds(s) >= 8, 60, "the pause to back off")
    # Backing off 2 s, 4 s, 8 s: a handful of requests per pause, not a tight loop.
    assert proxy.gets() - first <= 4 * len(SIZES), "hammering the store while denied"
    assert daemon.alive() and read_status(config)["objects_skipped"] == 0  # type: ignore[index]
    proxy.clear()  # credentials refreshed
    result = finish_reader(reader, out)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result]) == Counter(dataset["ids"])
