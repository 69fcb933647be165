"""What the fault tests share: trainer processes, status reads, and the expected records.

Trainer processes are ``testkit.trainers``' (shared with the e2e tests, as are ``delivered``
and ``log_tail``); ``start_reader`` runs the TensorFlow-free ``reader.py``."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.sample_data import read_ids
from testkit.trainers import finish_trainer, start_trainer

KIB, MIB = 1024, 1024**2
# 3 KiB to 1.5 MiB: single and ranged GETs, several shards per epoch.
SIZES = [
    3 * KIB, 40 * KIB, 700 * KIB, 90 * KIB, 1 * MIB, 12 * KIB, 300 * KIB, 5 * KIB,
    150 * KIB, 600 * KIB, 20 * KIB, 1536 * KIB, 64 * KIB, 8 * KIB, 400 * KIB, 33 * KIB,
]  # fmt: skip


HERE = Path(__file__).resolve().parent
READER = "tests.faults.reader"


def start_reader(config: Path, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``reader.py`` (no TensorFlow) as a trainer process (``testkit.trainers``)."""
    return start_trainer(READER, config, out, *extra)


def finish_reader(proc: subprocess.Popen[bytes], out: Path, timeout: float = 240) -> dict[str, Any]:
    return finish_trainer(proc, out, timeout)


def state_dir(config: Path) -> Path:
    return Path(yaml.safe_load(config.read_text())["status"]["state_dir"])


def read_status(config: Path) -> dict[str, Any] | None:
    try:
        status: dict[str, Any] = json.loads((state_dir(config) / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return status


def wait_status(
    config: Path, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> dict[str, Any]:
    """Poll ``status.json`` until ``predicate`` holds; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = read_status(config)
        if last is not None and predicate(last):
            return last
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last status: {last}")


def ids_of(s3_client: Any, bucket: str, key: str, tmp: Path) -> list[int]:
    """Record ids of one source object, read back from the store."""
    path = tmp / "ids-of.tfrecord"
    path.write_bytes(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    return read_ids(path)


def error_keys(status: dict[str, Any]) -> set[str]:
    return {e.get("key") for e in status.get("last_errors", [])}
