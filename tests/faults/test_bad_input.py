"""Corrupt input never kills the daemon: the object is quarantined with its key in status and
the log, and every record of the healthy objects is delivered exactly once."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import delivered
from tests.faults.faultkit import HERE, error_keys, finish_reader, ids_of, read_status, start_reader

pytestmark = pytest.mark.e2e

KIB = 1024
SIZES = [3 * KIB, 40 * KIB, 700 * KIB, 90 * KIB, 300 * KIB, 12 * KIB]
VICTIM = 3  # data/000003.tfrecord (crashing_plugin.POISON)


def bad_crc(body: bytes) -> bytes:
    broken = bytearray(body)
    broken[len(broken) // 2] ^= 0x01
    return bytes(broken)


def truncated(body: bytes) -> bytes:
    return body[: len(body) * 2 // 3]


@pytest.mark.parametrize("damage", ["bad_crc", "truncated", "plugin_raises"])
def test_corrupt_object_is_quarantined_and_the_rest_of_the_epoch_delivered(
    damage: str,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=41)
    victim = dataset["keys"][VICTIM]
    victim_ids = ids_of(s3_client, bucket, victim, tmp_path)
    env = None
    overrides: dict[str, Any] = {"epochs__count": 1}
    if damage == "plugin_raises":
        overrides["source__format"] = "crashing_plugin:raises"
        env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    else:
        body = s3_client.get_object(Bucket=bucket, Key=victim)["Body"].read()
        damaged = bad_crc(body) if damage == "bad_crc" else truncated(body)
        s3_client.put_object(Bucket=bucket, Key=victim, Body=damaged)
    config = write_config(tmp_path, **overrides)
    daemon = run_daemon(config, env=env)
    out = tmp_path / "t.json"
    result = finish_reader(start_reader(config, out), out)
    assert daemon.wait(120) == 4, daemon.output()  # done, but not every record delivered

    got = delivered([result])
    healthy = Counter(dataset["ids"]) - Counter(victim_ids)
    assert got - Counter(victim_ids) == healthy, "records of healthy objects lost or doubled"
    assert all(got[i] <= 1 for i in victim_ids), "records of the bad object doubled"
    assert sum(got[i] for i in victim_ids) < len(victim_ids), "the damage went unnoticed"
    status = read_status(config)
    assert status is not None and status["errors"] == 1 and status["state"] == "done"
    assert victim in error_keys(status)
    logged = [ln for ln in daemon.output(limit=10**6).splitlines() if victim in ln]
    assert len(logged) == 1 and "quarantined" in logged[0], logged
