"""A shard file's reservations and writes: the RAM budget's account is the files' sizes, a
reservation allocates nothing, and a RAM disk that is itself full is waited out at the write
without losing or repeating a byte."""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from prefetchd.budget import Interrupted, RamBudget
from prefetchd.consume.claims import give_back
from prefetchd.kernel.framing import frame
from prefetchd.layout import Layout
from prefetchd.write.shards import ShardFile

MiB = 1024 * 1024
NAME = "e00000-w00-0000000.tfrecord"


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    lay = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    lay.create()
    return lay


def frames(count: int, size: int) -> list[bytes]:
    return [frame(bytes([i % 251]) * size) for i in range(count)]


def test_a_reservation_is_the_files_size_and_allocates_no_pages(layout: Layout) -> None:
    """The account every writer adds up is the files' sizes; reserving a chunk grows the size
    at once but allocates nothing (allocating it cost ~18 % of a writer's CPU on tmpfs)."""
    budget = RamBudget(layout, 64 * MiB, 4 * MiB, lambda: False)
    shard = ShardFile(layout, NAME, budget)
    shard.write_frames([frame(b"x" * 1000)], 1)
    st = os.stat(shard.tmp)
    assert st.st_size == 4 * MiB, "the reservation is the file's size"
    assert budget.used() == 4 * MiB
    assert st.st_blocks * 512 < 64 * 1024, "the reservation allocated pages"
    shard.finish()
    assert os.stat(shard.tmp).st_size == shard.size == 1016


def test_the_budget_blocks_a_reservation_that_would_not_fit(layout: Layout) -> None:
    stops = iter([False, True])
    budget = RamBudget(layout, 6 * MiB, 4 * MiB, lambda: next(stops))
    first = ShardFile(layout, NAME, budget)
    first.write_frames([frame(b"x")], 1)
    second = ShardFile(layout, "e00000-w01-0000000.tfrecord", budget)
    with pytest.raises(Interrupted):
        second.write_frames([frame(b"y" * 2 * MiB)], 1)
    assert budget.used() == 4 * MiB, "nothing reserved past the budget"


def test_what_a_chunk_would_not_fit_is_reserved_exactly(layout: Layout) -> None:
    """A writer finishing a large record may need the last bytes of its share of the budget
    (``config.record_size_limit``): when a whole chunk does not fit, just what it needs (in
    pages) is reserved, if that fits."""
    budget = RamBudget(layout, 6 * MiB, 4 * MiB, lambda: True)
    first = ShardFile(layout, NAME, budget)
    first.write_frames([frame(b"x")], 1)
    second = ShardFile(layout, "e00000-w01-0000000.tfrecord", budget)
    second.write_frames([frame(b"y" * 1000 * 1024)], 1)
    assert os.stat(second.tmp).st_size == 1000 * 1024 + 4096  # the frame's 16 bytes: a page
    assert budget.used() <= 6 * MiB - 64 * 1024


def test_a_full_ram_disk_is_waited_out_at_the_write_and_no_byte_is_lost_or_repeated(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC from a write within the reservation (the tmpfs smaller than the budget, or
    shared): the writer waits (counted, logged) and writes the rest, also after a partial
    write."""
    real_writev = os.writev
    calls: list[str] = []

    def flaky_writev(fd: int, buffers: Any) -> int:
        calls.append("writev")
        if len(calls) in (1, 2):
            raise OSError(errno.ENOSPC, "No space left on device")
        if len(calls) == 3:  # a partial write: the first view and half of the second
            views = list(buffers)
            return real_writev(fd, [views[0], views[1][: len(views[1]) // 2]])
        return real_writev(fd, buffers)

    monkeypatch.setattr(os, "writev", flaky_writev)
    monkeypatch.setattr(RamBudget, "disk_full", _counting_disk_full)
    budget = RamBudget(layout, 64 * MiB, 4 * MiB, lambda: False)
    shard = ShardFile(layout, NAME, budget)
    parts = frames(5, 3000)
    shard.write_frames(parts, len(parts))
    shard.finish()
    assert budget.full_disk_waits == 2
    assert shard.tmp.read_bytes() == b"".join(parts)


def _counting_disk_full(self: RamBudget) -> None:
    self.full_disk_waits += 1


def test_a_writer_asked_to_stop_while_the_disk_is_full_stops(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, buffers: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", full)
    stop = [False]
    budget = RamBudget(layout, 64 * MiB, 4 * MiB, lambda: stop[0])
    shard = ShardFile(layout, NAME, budget)
    stop[0] = True
    with pytest.raises(Interrupted):
        shard.write_frames(frames(1, 10), 1)
    assert budget.full_disk_waits == 1


def test_another_write_error_is_not_taken_for_a_full_disk(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int, buffers: Any) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "writev", broken)
    budget = RamBudget(layout, 64 * MiB, 4 * MiB, lambda: False)
    shard = ShardFile(layout, NAME, budget)
    with pytest.raises(OSError, match="Input/output"):
        shard.write_frames(frames(1, 10), 1)
    assert budget.full_disk_waits == 0


def test_the_account_holds_every_file_under_ram_dir(layout: Layout) -> None:
    """ram_dir's own files (owner record, locks) count too, and the writers leave room for
    the small files written without the budget lock (trainers' lock files)."""
    (layout.ram / "prefetchd.owner").write_bytes(b"o" * 3000)
    budget = RamBudget(layout, 2 * MiB, MiB, lambda: True)
    assert budget.used() == 3000
    shard = ShardFile(layout, NAME, budget)
    with pytest.raises(Interrupted):  # 1 MiB + 3000 + what small files need > 2 MiB - 1 MiB
        shard.write_frames([frame(b"x" * (2 * MiB - 64 * 1024 - 3000))], 1)


def test_a_claim_given_back_moves_under_the_budget_lock(layout: Layout) -> None:
    """claimed/ -> ready/ is the one move against the order a writer adds the directories up
    in (ready/ before claimed/): made while a writer adds up, the shard would be missed and
    its bytes reserved again. So it waits for the budget lock."""
    RamBudget(layout, 2 * MiB, MiB, lambda: True)  # creates the lock file, as a writer does
    claimed = "c0001-" + NAME
    (layout.ram_claimed / claimed).write_bytes(b"s" * 100)
    fd = os.open(layout.budget_lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a writer adding up
    mover = threading.Thread(target=give_back, args=(layout, claimed))
    mover.start()
    mover.join(0.3)
    assert mover.is_alive() and (layout.ram_claimed / claimed).exists(), "moved under a writer"
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    mover.join(5)
    assert (layout.ram_ready / NAME).exists()


@pytest.mark.parametrize("short", [False, True])
def test_more_parts_than_one_writev_takes_are_written_whole_and_in_order(
    layout: Layout, monkeypatch: pytest.MonkeyPatch, short: bool
) -> None:
    """The write of a step is one ``writev`` when it takes every byte (no pass over the
    parts after it); past Linux's 1,024 buffers a call, or after a short write (``short``:
    each call takes all but the last 5 bytes it was given), the rest follows without a byte
    lost or repeated."""
    real_writev = os.writev
    calls = []

    def counted_writev(fd: int, buffers: Any) -> int:
        views = list(buffers)
        calls.append(len(views))
        if short and sum(map(len, views)) > 5:
            last = views[-1]
            if len(last) > 5:
                return real_writev(fd, [*views[:-1], last[:-5]])
        return real_writev(fd, views)

    monkeypatch.setattr(os, "writev", counted_writev)
    budget = RamBudget(layout, 64 * MiB, 4 * MiB, lambda: False)
    shard = ShardFile(layout, NAME, budget)
    parts = frames(2500, 7)
    shard.write_frames([memoryview(p) for p in parts], len(parts))
    shard.finish()
    assert shard.tmp.read_bytes() == b"".join(parts)
    assert max(calls) <= 1024 and len(calls) >= 3
