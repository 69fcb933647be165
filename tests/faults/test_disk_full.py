"""A full RAM disk or cache dir (a small tmpfs, mounted as root): back-pressure, never a
partial file, and recovery once the trainer makes room."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import delivered
from tests.faults.faultkit import finish_reader, read_status, start_reader

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root"),
]

KIB, MIB = 1024, 1024**2
SIZES = [
    3 * KIB, 40 * KIB, 700 * KIB, 90 * KIB, 1 * MIB, 12 * KIB, 300 * KIB, 5 * KIB,
    150 * KIB, 600 * KIB, 20 * KIB, 1536 * KIB, 64 * KIB, 8 * KIB, 400 * KIB, 33 * KIB,
]  # fmt: skip


def test_full_ram_disk_holds_writers_back_and_recovers_as_shards_are_read(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    small_tmpfs: Callable[[str], Path],
) -> None:
    """The RAM disk is smaller than ``output.ram_budget`` (another tenant filled it, or the
    budget was set too high): writers wait on ENOSPC instead of failing or publishing less."""
    dataset = upload("tfrecord", SIZES, seed=51)
    ram = small_tmpfs("1280k")
    config = write_config(
        tmp_path,
        epochs__count=1,
        output__ram_dir=ram / "ram",
        output__ram_budget="8MiB",
        output__shard_size="256KiB",
    )
    daemon = run_daemon(config)
    out = tmp_path / "t.json"
    result = finish_reader(start_reader(config, out, "--delay", "0.1"), out)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"
    assert "is full; waiting for room" in daemon.output()
    status = read_status(config)
    assert status is not None and status["errors"] == 0


def test_full_cache_dir_pauses_downloads_and_recovers_as_writers_consume(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    small_tmpfs: Callable[[str], Path],
) -> None:
    """The cache disk is smaller than ``download.window``: a download that hits ENOSPC is
    dropped and retried later; nothing is skipped and no partial object reaches a writer."""
    dataset = upload("tfrecord", SIZES, seed=52)
    cache = small_tmpfs("2m")
    config = write_config(
        tmp_path, epochs__count=1, download__cache_dir=cache / "cache", download__window="8MiB"
    )
    daemon = run_daemon(config)
    out = tmp_path / "t.json"
    result = finish_reader(start_reader(config, out, "--delay", "0.1"), out)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"
    status = read_status(config)
    assert status is not None and status["objects_skipped"] == 0 and status["errors"] == 0
    assert "No space left on device" in daemon.output()
