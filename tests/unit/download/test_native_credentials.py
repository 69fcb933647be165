"""The native client signs with what botocore's credential chain gives, and refreshable
credentials (instance roles, SSO, assume-role) reach the C engine before they expire: botocore
renews them, the transfer sees the new ones within ``CREDENTIALS_EVERY`` and the next GET is
signed with them. Against the scripted HTTP server of the engine's tests (``httpkit``), which
keeps every request head it gets."""

from __future__ import annotations

import datetime
import hashlib
import queue
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.credentials import RefreshableCredentials

from prefetchd.config import Config
from prefetchd.download import native
from prefetchd.download.jobs import Job
from prefetchd.download.order import SourceObject
from tests.unit.configs import unit_config
from tests.unit.kernel.httpkit import Server, ok

pytest.importorskip("prefetchd.kernel._http")

BODY = b"signed bytes" * 100
TIMEOUT = 30.0


class _Session:
    """What NativeTransfer asks of botocore's session: credentials and the region."""

    def __init__(self, credentials: Any) -> None:
        self._credentials = credentials

    def get_credentials(self) -> Any:
        return self._credentials

    def get_config_variable(self, name: str) -> str | None:
        return None


def _config(tmp_path: Path, port: int) -> Config:
    return unit_config(
        tmp_path,
        source={
            "url": "s3://bucket-x/data/",
            "endpoint_url": f"http://127.0.0.1:{port}",
            "format": "raw",
        },
        download={"client": "native"},
    )


def test_refreshed_credentials_sign_the_next_get(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unused")  # the verifier's botocore client
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "unused")
    monkeypatch.setattr(native, "CREDENTIALS_EVERY", 0.05)
    issued = ["KEY1"]

    def refresh() -> dict[str, str]:
        # Five minutes left: inside botocore's advisory window, so every look refreshes.
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
        return {
            "access_key": issued[-1],
            "secret_key": "secret-" + issued[-1],
            "token": "token-" + issued[-1],
            "expiry_time": expiry.isoformat(),
        }

    credentials = RefreshableCredentials.create_from_metadata(refresh(), refresh, "test")
    monkeypatch.setattr(native, "store_session", lambda *_: _Session(credentials))
    listed = SourceObject("data/k", len(BODY), hashlib.md5(BODY).hexdigest())
    results: queue.SimpleQueue[Job] = queue.SimpleQueue()
    with Server(lambda *_: [ok(BODY)]) as server:
        transfer = native.NativeTransfer(_config(tmp_path, server.port), results.put)
        try:
            first = _fetch(transfer, listed, tmp_path / "a.part", results)
            issued.append("KEY2")  # the role's credentials renewed
            second = first
            deadline = time.monotonic() + TIMEOUT
            n = 0
            while "Credential=KEY2/" not in server.requests[-1]:  # bounded: the next pushes
                assert time.monotonic() < deadline, "the renewed credentials never signed a GET"
                time.sleep(0.05)
                n += 1
                second = _fetch(transfer, listed, tmp_path / f"b{n}.part", results)
        finally:
            transfer.shutdown()
    assert first.error is None and second.error is None
    heads = [r for r in server.requests if r.startswith("GET ")]
    assert "Credential=KEY1/" in heads[0] and "x-amz-security-token: token-KEY1" in heads[0]
    assert "Credential=KEY2/" in heads[-1] and "x-amz-security-token: token-KEY2" in heads[-1]
    assert all("secret-" not in head for head in heads)  # the secret is never sent


def _fetch(
    transfer: native.NativeTransfer, obj: SourceObject, tmp: Path, results: queue.SimpleQueue[Job]
) -> Job:
    job = Job(0, 0, obj, tmp.name, tmp)
    transfer.prepare(job)
    assert transfer.submit_parts(job, timeout=TIMEOUT)
    done = results.get(timeout=TIMEOUT)
    assert done is job
    assert tmp.read_bytes() == BODY
    return job
