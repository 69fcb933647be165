"""A writer waiting for room on the RAM disk: woken by a shard leaving ``ram_dir``, not by
polling it (a trainer slower than the data keeps the budget full, and the writer waits for as
long as the trainer trains), and still waking where no watch can be made."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from prefetchd import budget as budget_module
from prefetchd.budget import RamBudget
from prefetchd.layout import Layout

MiB = 1024 * 1024


@pytest.fixture
def full(tmp_path: Path) -> tuple[Layout, Path]:
    """A layout whose RAM budget (4 MiB) is held by one finished shard in done/."""
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    shard = layout.ram_done / "e00000-w00-0000000.tfrecord"
    with open(shard, "wb") as f:
        f.truncate(3 * MiB)
    return layout, shard


def _extend_in_thread(budget: RamBudget, fd: int) -> tuple[threading.Thread, list[int]]:
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(budget.extend(fd, 0, MiB)), daemon=True)
    thread.start()
    return thread, got


def _wait_for_looks(budget: RamBudget, looks: int) -> None:
    """Until the waiting writer has looked ``looks`` times (10 s at most)."""
    deadline = time.monotonic() + 10
    while budget.room_looks < looks and time.monotonic() < deadline:
        time.sleep(0.01)


def _reservation(layout: Layout) -> int:
    return os.open(layout.ram_tmp / "e00000-w01-0000000.tfrecord", os.O_RDWR | os.O_CREAT, 0o600)


def test_a_waiting_writer_wakes_when_a_shard_leaves_and_does_not_poll_meanwhile(
    full: tuple[Layout, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, shard = full
    monkeypatch.setattr(budget_module, "ROOM_RECHECK", 600.0)  # only the watch can wake it
    budget = RamBudget(layout, 4 * MiB, MiB, lambda: False)
    fd = _reservation(layout)
    try:
        thread, got = _extend_in_thread(budget, fd)
        _wait_for_looks(budget, 1)
        assert budget.room_looks == 1, "the first look arms the watch"
        time.sleep(1.0)  # 50 looks at the old 20 ms polling
        assert budget.room_looks == 1, "it looked again with nothing freed"
        shard.unlink()  # the daemon deletes a shard a trainer finished
        thread.join(10)
        assert got == [MiB], "the deleted shard's room went to the waiting writer"
        assert budget.room_looks == 2
        assert os.fstat(fd).st_size == MiB
    finally:
        os.close(fd)


def test_without_a_watch_the_writer_polls_and_still_gets_the_room(
    full: tuple[Layout, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, shard = full

    def no_watch(*_args: object) -> None:
        raise OSError(24, "inotify_init1: Too many open files")

    monkeypatch.setattr(budget_module, "Watch", no_watch)
    budget = RamBudget(layout, 4 * MiB, MiB, lambda: False)
    fd = _reservation(layout)
    try:
        thread, got = _extend_in_thread(budget, fd)
        _wait_for_looks(budget, 3)
        assert budget.room_looks >= 3, "it polls where it cannot watch"
        shard.unlink()
        thread.join(10)
        assert got == [MiB]
    finally:
        os.close(fd)
