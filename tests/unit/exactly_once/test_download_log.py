"""The download log (``progress/e<k>.log``): what a restarted downloader reads back is what the
previous run logged, a line a crash cut short counts for nothing, and each object costs one
write on a file kept open."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from prefetchd.exactly_once.download_log import PUBLISHED, SKIPPED, DownloadLog
from prefetchd.layout import Layout, key_hash, object_name
from tests.unit.configs import unit_config


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = Layout.of(unit_config(tmp_path))
    layout.create()
    return layout


def name(epoch: int, seq: int) -> str:
    return object_name(epoch, seq, key_hash("bucket", f"key-{seq}"))


def digest(epoch: int, seq: int) -> str:
    return name(epoch, seq).rpartition("-")[2]


def test_published_and_skipped_objects_are_read_back_after_a_restart(layout: Layout) -> None:
    before = DownloadLog(layout)
    before.append(0, name(0, 0), PUBLISHED)
    before.append(0, name(0, 1), SKIPPED)
    before.append(1, name(1, 0), PUBLISHED)
    before.close_all()
    after = DownloadLog(layout)
    assert after.epochs() == [0, 1]
    assert after.read(0) == {digest(0, 0), digest(0, 1)}
    assert after.read(1) == {digest(1, 0)}
    assert layout.download_log(0).read_text() == f"P {digest(0, 0)}\nS {digest(0, 1)}\n"


def test_an_epoch_without_a_log_has_nothing_logged(layout: Layout) -> None:
    log = DownloadLog(layout)
    assert log.epochs() == []
    assert log.read(3) == set()


def test_a_line_a_crash_cut_short_is_ignored(layout: Layout) -> None:
    layout.download_log(0).write_text(f"P {digest(0, 0)}\nP")
    assert DownloadLog(layout).read(0) == {digest(0, 0)}


def test_a_restarted_run_appends_to_the_log_it_finds(layout: Layout) -> None:
    layout.download_log(0).write_text(f"P {digest(0, 0)}\n")
    log = DownloadLog(layout)
    log.append(0, name(0, 1), PUBLISHED)
    log.close(0)
    assert log.read(0) == {digest(0, 0), digest(0, 1)}


def test_each_line_is_one_write_on_a_log_opened_once_per_epoch(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = DownloadLog(layout)
    calls: list[str] = []

    def counted(fn: str) -> object:
        real = getattr(os, fn)

        def call(*args: object) -> object:
            calls.append(fn)
            return real(*args)

        return call

    for fn in ("open", "write", "close"):
        monkeypatch.setattr(os, fn, counted(fn))
    for seq in range(5):
        log.append(0, name(0, seq), PUBLISHED)
    log.close(0)
    log.close(0)  # closing twice (an epoch marked downloaded again) is harmless
    monkeypatch.undo()
    assert calls == ["open"] + ["write"] * 5 + ["close"]
    assert len(log.read(0)) == 5


def test_a_log_a_crash_cut_short_is_ended_before_the_next_line(layout: Layout) -> None:
    """A power loss can leave the last line half written (lines are not synced): the next run's
    first line must not be glued to it, or the object it logs would count as not downloaded."""
    layout.download_log(0).write_text(f"P {digest(0, 0)}\nP 7f3")
    log = DownloadLog(layout)
    log.append(0, name(0, 1), PUBLISHED)
    log.close(0)
    assert digest(0, 1) in log.read(0)
    assert layout.download_log(0).read_text() == f"P {digest(0, 0)}\nP 7f3\nP {digest(0, 1)}\n"


def test_a_line_a_full_disk_cuts_short_is_taken_back_and_fails(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk can write part of a line (across a block boundary) and say so only by the
    count: the piece is cut off and the append fails with ENOSPC (the object is then not
    logged, and is published again after the pause), so the next line stands whole."""
    log = DownloadLog(layout)
    log.append(0, name(0, 0), PUBLISHED)
    real = os.write

    def short(fd: int, data: bytes) -> int:
        return real(fd, data[:5])

    monkeypatch.setattr(os, "write", short)
    with pytest.raises(OSError) as failed:
        log.append(0, name(0, 1), PUBLISHED)
    monkeypatch.undo()
    assert failed.value.errno == errno.ENOSPC
    assert layout.download_log(0).read_text() == f"P {digest(0, 0)}\n"
    log.append(0, name(0, 2), PUBLISHED)
    log.close(0)
    assert log.read(0) == {digest(0, 0), digest(0, 2)}
