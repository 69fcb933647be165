"""A trainer claims only under the fence of the job it reads (``consume/job_guard.py``): a
stale fence (its daemon gone) is never adopted, a fence of another job raises ``JobChanged``,
a restart that resumed the job is ridden out, and an adopted fence costs one stat a claim."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefetchd.consume.job_guard import JobGuard
from prefetchd.errors import JobChanged
from prefetchd.fence import read_fence, remove_fence, write_fence
from prefetchd.layout import LOCK_FILE, Layout
from prefetchd.messages.status_record import StatusRecord


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[Layout]:
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    yield layout


def test_a_fence_is_live_while_its_writer_holds_it_and_stale_after(layout: Layout) -> None:
    fd = write_fence(layout.job_fence, "a" * 16, "resuming job aaaa")
    fence = read_fence(layout.job_fence)
    assert fence is not None and fence.live and fence.job == "a" * 16
    assert fence.note == "resuming job aaaa"
    os.close(fd)  # the daemon ended: the fence stays, stale
    stale = read_fence(layout.job_fence)
    assert stale is not None and not stale.live and stale.inode == fence.inode
    remove_fence(layout.job_fence)
    assert read_fence(layout.job_fence) is None


def test_a_stale_fence_is_never_adopted_a_live_one_is(layout: Layout) -> None:
    """The trainer started before the daemon: the fence it finds is an earlier daemon's."""
    os.close(write_fence(layout.job_fence, "old" * 5 + "0", ""))
    guard = JobGuard(layout)
    assert not guard.may_claim() and guard.job is None
    remove_fence(layout.job_fence)  # the new daemon: the fence down first ...
    assert not guard.may_claim()
    fd = write_fence(layout.job_fence, "b" * 16, "starting a new job bbbb")  # ... then its own
    try:
        assert guard.may_claim() and guard.job == "b" * 16
    finally:
        os.close(fd)


def test_a_restart_resuming_the_job_is_ridden_out(layout: Layout) -> None:
    fd = write_fence(layout.job_fence, "c" * 16, "")
    guard = JobGuard(layout)
    assert guard.may_claim()
    os.close(fd)  # the daemon stopped: the job's shards are still this trainer's
    assert guard.may_claim()
    remove_fence(layout.job_fence)  # it starts again: wait while it decides
    assert not guard.may_claim()
    fd = write_fence(layout.job_fence, "c" * 16, "resuming job cccc")  # a new file, same job
    try:
        assert guard.may_claim()
    finally:
        os.close(fd)


def test_a_fence_of_another_job_raises_naming_both(layout: Layout) -> None:
    fd = write_fence(layout.job_fence, "d" * 16, "")
    guard = JobGuard(layout)
    assert guard.may_claim()
    os.close(fd)
    remove_fence(layout.job_fence)
    fd = write_fence(layout.job_fence, "e" * 16, "starting a new job eeee (epochs.seed changed)")
    try:
        with pytest.raises(JobChanged) as raised:
            guard.may_claim()
    finally:
        os.close(fd)
    message = str(raised.value)
    assert "e" * 16 in message and "d" * 16 in message and "epochs.seed changed" in message


def test_an_adopted_fence_costs_one_stat_a_claim(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    fd = write_fence(layout.job_fence, "f" * 16, "")
    guard = JobGuard(layout)
    assert guard.may_claim()
    calls: list[str] = []
    real_stat, real_open = os.stat, os.open

    def stat(*args: object, **kwargs: object) -> os.stat_result:
        calls.append("stat")
        return real_stat(*args, **kwargs)  # type: ignore[arg-type]

    def open_(*args: object, **kwargs: object) -> int:
        calls.append("open")
        return real_open(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "open", open_)
    try:
        for _ in range(100):
            assert guard.may_claim()
    finally:
        monkeypatch.undo()
        os.close(fd)
    assert calls == ["stat"] * 100


def test_a_running_daemon_of_an_earlier_release_writes_no_fence_and_is_read_as_before(
    layout: Layout,
) -> None:
    """Its status names no job and comes from the process holding ram_dir's lock: claim."""
    guard = JobGuard(layout)
    assert not guard.may_claim(), "no daemon at all: wait"
    status = StatusRecord(state="running", pid=os.getpid(), updated=time.time())
    layout.status_file.write_bytes(status.encode())
    assert not guard.may_claim(), "its lock is not held: a status left by a daemon gone"
    lock = os.open(layout.ram / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.write(lock, f"{os.getpid()}\n".encode())
        assert guard.may_claim()
        newer = StatusRecord(state="running", pid=os.getpid(), job_id="a" * 16)
        layout.status_file.write_bytes(newer.encode())
        assert not JobGuard(layout).may_claim(), "a daemon that fences: wait for its fence"
    finally:
        os.close(lock)
