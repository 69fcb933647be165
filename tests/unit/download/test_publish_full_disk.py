"""A cache disk that fills after an object's log line: the object stays published, once.

Publishing is meta -> download-log line -> rename into ``ready/`` (``download/publish.py``);
the log line is the commit (a restart rolls a logged ``.part`` forward). A full disk (ENOSPC)
may still hit the rename (a directory that needs another block) or the epoch's
``downloaded`` marker written after the last object. Before, either one deleted the meta of an
object that was logged — for the marker, of an object already in ``ready/``, which a writer
then read without its key — and fetched the object a second time. Now both wait for room and
are written again, and the epoch's download ends only when they are. The downloader's real
loop, with a transfer that fetches at once (``loop_harness.py``); the full disk is a failing
call, counted, never timed.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from prefetchd.config import Config
from prefetchd.download.downloader import Downloader
from prefetchd.exactly_once.markers import mark_downloaded
from prefetchd.layout import Layout, parse_object_name
from tests.unit.download.loop_harness import (
    FlakyTransfer,
    epoch_0_downloaded,
    epochs_of,
    run_downloader,
    two_epochs,
)

FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return two_epochs(tmp_path)


def assert_published_once(layout: Layout, ready: list[str], used: list[FlakyTransfer]) -> None:
    """Epoch 0's two objects in ready/, each with its own meta, each fetched once and logged
    once as published, and the epoch marked downloaded."""
    assert layout.downloaded_marker(0).exists(), f"epoch 0 never marked downloaded: {ready}"
    assert epochs_of(ready) == [0, 0], ready
    for name in ready:
        meta = json.loads(Path(layout.meta_file(name)).read_text())
        assert meta["epoch"] == 0 and meta["key"].startswith("d/"), (name, meta)
    assert sorted(used[0].fetches.values()) == [1, 1], f"fetched again: {used[0].fetches}"
    lines = layout.download_log(0).read_text().splitlines()
    assert len(lines) == 2 and all(line.startswith("P ") for line in lines), lines
    assert len(set(lines)) == 2, f"an object logged twice: {lines}"


def test_a_full_disk_at_the_epoch_marker_keeps_the_last_object_and_marks_it_later(
    config: Config,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = mark_downloaded
    attempts: list[int] = []

    def full_twice(layout: Layout, epoch: int, objects: int) -> bool:
        attempts.append(epoch)
        if len(attempts) <= 2:
            raise FULL
        return real(layout, epoch, objects)

    monkeypatch.setattr("prefetchd.download.plan.mark_downloaded", full_twice)
    used: list[FlakyTransfer] = []
    downloaders: list[Downloader] = []
    layout, ready = run_downloader(
        config, {}, until=epoch_0_downloaded, transfer=used, downloaders=downloaders
    )
    assert len(attempts) >= 3, attempts
    assert_published_once(layout, ready, used)
    counters = downloaders[0].counters
    assert counters["objects_downloaded"] == 2, counters["objects_downloaded"]
    assert not downloaders[0].plan.markers_owed


def test_a_full_disk_at_the_rename_into_ready_publishes_the_logged_object_once(
    config: Config,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = os.rename
    refused: list[str] = []

    def full_for_the_second(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        target = os.fspath(dst)
        if "/ready/" in target and len(refused) < 3 and _seq(target) == 1:
            refused.append(target)
            raise FULL
        real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", full_for_the_second)
    used: list[FlakyTransfer] = []
    downloaders: list[Downloader] = []
    layout, ready = run_downloader(
        config, {}, until=epoch_0_downloaded, transfer=used, downloaders=downloaders
    )
    assert len(refused) == 3, refused
    assert_published_once(layout, ready, used)
    assert downloaders[0].counters["objects_downloaded"] == 2
    assert not downloaders[0].publisher.owed


def _seq(path: str) -> int:
    """The position in its epoch's order of the object ``ready/<name>`` names."""
    parsed = parse_object_name(os.path.basename(path))
    assert parsed is not None, path
    return parsed[1]
