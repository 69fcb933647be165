"""Credentials rotated in a file by a sidecar (issue 27, item 4): mid-epoch the store starts
refusing the first access key (the proxy reads the SigV4 ``Credential``; moto checks none);
downloads pause visibly while no valid credentials exist, the file is rewritten with a second
key, and the daemon re-reads it and finishes the epoch exactly once, with either client."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import delivered
from tests.faults.faultkit import finish_reader, read_status, start_reader, wait_status
from tests.faults.faultproxy import FaultProxy

pytestmark = pytest.mark.e2e
PROXY_SEED = 4  # the fault proxy's (the `proxy` fixture's)

KIB = 1024
SIZES = [40 * KIB + 991 * i for i in range(48)]
BEFORE = 12  # object GETs signed with the first key that the store takes
FIRST, SECOND = "AKIAPREFETCHDROTATE1", "AKIAPREFETCHDROTATE2"


def write_credentials(path: Path, key: str) -> None:
    """As a sidecar does: a new file renamed over the old one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"[default]\naws_access_key_id = {key}\naws_secret_access_key = s-{key}\n")
    os.replace(tmp, path)


@pytest.mark.parametrize("client", ["classic", "crt", "native"])
def test_credentials_rewritten_in_their_file_are_taken_and_nothing_is_skipped(
    client: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", SIZES, seed=27)
    credentials = tmp_path / "credentials"
    write_credentials(credentials, FIRST)
    config = write_config(
        tmp_path,
        source__endpoint_url=proxy.url,
        epochs__count=1,
        download__client=client,
        download__window="1MiB",  # still downloading when the key is refused
        download__concurrency=4,
    )
    proxy.after_gets = (BEFORE, lambda p: p.refused_keys.add(FIRST))
    # The key comes from the file alone: the environment's (the test session's) is emptied.
    env = {
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
    }
    daemon = run_daemon(config, env=env)
    out = tmp_path / "trainer.json"
    reader = start_reader(config, out)

    # No valid credentials yet: a visible pause, not a skip, not a failure.
    paused = wait_status(
        config,
        lambda s: "waiting for valid credentials" in str(s.get("download_activity")),
        60,
        "status to say downloads wait for valid credentials",
    )
    assert "InvalidAccessKeyId" in paused["download_activity"]
    assert paused["objects_skipped"] == 0 and daemon.alive()
    write_credentials(credentials, SECOND)  # the sidecar rotates the key

    result = finish_reader(reader, out)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"
    final = read_status(config)
    assert final is not None and final["objects_skipped"] == 0 and final["errors"] == 0

    timeline = proxy.timeline()
    refused = [r for r in timeline if r.fault == "refused"]
    taken = [r for r in timeline if r.access_key == SECOND and r.status in (200, 206)]
    assert refused and all(r.access_key == FIRST for r in refused)
    assert any(not r.listing for r in taken), "no object was fetched with the new key"
    assert not [
        r for r in timeline if r.access_key == FIRST and r.at > proxy.changed_at and r.status == 200
    ]
    for secret in (f"s-{FIRST}", f"s-{SECOND}"):
        assert secret not in daemon.output(limit=10**7), "a secret in the daemon's output"
