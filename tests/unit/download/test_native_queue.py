"""The native client made ``on_caller`` (as the downloader makes it) takes up to half of
``download.concurrency`` more requests than it puts on the wire: those wait queued in the
engine, so that a connection never idles while a finished request waits to be gathered
(issue 28). ``download.concurrency`` still bounds the requests on the wire, and once the store
throttles, the adaptive limit bounds every request taken, queued or not. Against the scripted
HTTP server of the engine's tests (``httpkit``), which here never answers: what counts is what
was sent, not what came back."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefetchd.config import Config
from prefetchd.download import native
from prefetchd.download.jobs import Job
from prefetchd.download.order import SourceObject
from tests.unit.configs import unit_config
from tests.unit.kernel.httpkit import HANG, Server

pytest.importorskip("prefetchd.kernel._http")

BODY = b"queued bytes" * 100
CONCURRENCY = 4
TIMEOUT = 30.0  # seconds: every wait's bound


def _config(tmp_path: Path, port: int) -> Config:
    return unit_config(
        tmp_path,
        source={
            "url": "s3://bucket-q/data/",
            "endpoint_url": f"http://127.0.0.1:{port}",
            "format": "raw",
        },
        download={"client": "native", "concurrency": CONCURRENCY},
    )


def _submit_until_refused(transfer: native.NativeTransfer, tmp_path: Path) -> list[Job]:
    """Prepare and submit objects until one finds no slot at once: the ones taken."""
    obj = SourceObject("data/k", len(BODY), hashlib.md5(BODY).hexdigest())
    taken: list[Job] = []
    for i in range(4 * CONCURRENCY):
        job = Job(0, i, obj, f"o{i}", tmp_path / f"o{i}.part")
        transfer.prepare(job)
        if not transfer.submit_parts(job, timeout=0):
            return taken
        taken.append(job)
    pytest.fail("slots without end")


def _sent(server: Server, count: int) -> None:
    """Wait (bounded) until the server has ``count`` requests."""
    deadline = time.monotonic() + TIMEOUT
    while len(server.requests) < count:
        assert time.monotonic() < deadline, f"{len(server.requests)} of {count} requests sent"
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


@contextlib.contextmanager
def _hanging_store(tmp_path: Path) -> Iterator[tuple[Server, native.NativeTransfer, list[Job]]]:
    """A store that never answers, and an on_caller transfer to it (shut down on the way out,
    which settles every request: ``done`` then holds each job settled)."""
    done: list[Job] = []
    with Server(lambda *_: [HANG]) as server:
        transfer = native.NativeTransfer(
            _config(tmp_path, server.port), done.append, on_caller=True
        )
        try:
            yield server, transfer, done
        finally:
            transfer.shutdown()


def test_requests_beyond_the_wire_wait_queued_in_the_engine(tmp_path: Path) -> None:
    with _hanging_store(tmp_path) as (server, transfer, done):
        taken = _submit_until_refused(transfer, tmp_path)
        _sent(server, CONCURRENCY)
        stats = transfer._engine.stats()
    connections = server.connections
    assert len(taken) == CONCURRENCY + CONCURRENCY // 2  # half as many again, queued
    assert stats["requests"] == CONCURRENCY == connections  # on the wire: concurrency
    assert sorted(id(job) for job in done) == sorted(id(job) for job in taken)  # each once
    assert all(job.error is not None for job in done)  # cancelled at shutdown, none lost


def test_a_throttled_transfer_queues_nothing_beyond_the_adaptive_limit(tmp_path: Path) -> None:
    with _hanging_store(tmp_path) as (server, transfer, done):
        transfer._signals.limit.throttle()  # a SlowDown answer: 4 -> 2
        assert transfer.poll(0)  # the limit reaches the engine with the next settling
        taken = _submit_until_refused(transfer, tmp_path)
        _sent(server, 2)
        stats = transfer._engine.stats()
    assert len(taken) == 2
    assert stats["requests"] == 2
    assert sorted(id(job) for job in done) == sorted(id(job) for job in taken)
