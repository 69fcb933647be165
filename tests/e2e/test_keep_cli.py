"""``download.keep`` at the command line: ``check`` says whether the cache_dir can hold it, and a
bad value is one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e


def prefetchd(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "prefetchd", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_check_says_the_cache_dir_has_room_for_keep(
    tmp_path: Path, upload: Callable[..., Any], write_config: Callable[..., Path]
) -> None:
    upload("tfrecord", [4096])
    proc = prefetchd("check", "--config", str(write_config(tmp_path, download__keep="64MiB")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if "download.keep" in ln)
    assert line.startswith("OK") and "download.keep 64.0 MiB" in line, line


def test_check_warns_when_the_filesystem_cannot_hold_keep(
    tmp_path: Path, upload: Callable[..., Any], write_config: Callable[..., Path]
) -> None:
    upload("tfrecord", [4096])
    proc = prefetchd("check", "--config", str(write_config(tmp_path, download__keep="900TiB")))
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a warning, not a failure
    line = next(ln for ln in proc.stdout.splitlines() if "download.keep" in ln)
    assert line.startswith("WARN") and "cannot hold it" in line, line


def test_a_bad_keep_is_one_line_and_exit_2(
    tmp_path: Path, write_config: Callable[..., Path]
) -> None:
    proc = prefetchd("check", "--config", str(write_config(tmp_path, download__keep="lots")))
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "download.keep" in proc.stderr and "lots" in proc.stderr
