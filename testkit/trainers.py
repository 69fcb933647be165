"""Trainer processes for the tests that run the daemon, and what they report.

A test trainer is a module run as ``python -m <module> CONFIG OUT.json [args]`` from the
repository root (so it imports prefetchd and testkit from this checkout); it writes
``{"shards": [...], "records": [[epoch, id], ...]}`` to ``OUT.json`` and its stderr goes to
``OUT.log``. ``tests.e2e.consume`` reads with TensorFlow, ``tests.faults.reader`` without.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def start_trainer(
    module: str, config: Path, out: Path, *extra: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start trainer ``module`` on ``config``; ``env`` adds to this process's environment."""
    with open(out.with_suffix(".log"), "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, str(config), str(out), *extra],
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )


def finish_trainer(
    proc: subprocess.Popen[bytes], out: Path, timeout: float = 300
) -> dict[str, Any]:
    """The trainer's output once it exits 0; fails the test (with its log) if it fails, or if
    it still runs after ``timeout`` seconds (then it is killed)."""
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"trainer still running after {timeout:.0f} s: {log_tail(out)}")
    assert code == 0, f"trainer failed ({code}):\n{log_tail(out)}"
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def log_tail(out: Path) -> str:
    """The end of the trainer's stderr (``OUT.log``), or "" if there is none."""
    try:
        return out.with_suffix(".log").read_text(errors="replace")[-3000:]
    except OSError:
        return ""


def delivered(results: Iterable[dict[str, Any]], epoch: int | None = None) -> Counter[Any]:
    """How often each record id arrived over the trainers' ``results`` (in ``epoch``, if
    given): a multiset to compare with the dataset's ids."""
    return Counter(rid for r in results for e, rid in r["records"] if epoch in (None, e))


def ram_bytes(ram_dir: Path) -> int:
    """The bytes under ``ram_dir`` at one instant, as the writers' account is kept: walked
    while holding the RAM budget's lock (``ram_dir/.budget.lock``, ``prefetchd.budget``), so no
    writer reserves meanwhile. A walk is not atomic: without the lock, a shard counted in
    ``claimed/`` and then deleted, and a reservation made with its room before the walk reached
    ``.tmp/``, were both counted though they never coexisted. Before any writer made the lock
    file, walked as it is."""
    try:
        fd = os.open(ram_dir / ".budget.lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return tree_bytes(ram_dir)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return tree_bytes(ram_dir)
    finally:
        os.close(fd)  # releases the lock


def tree_bytes(root: Path, *, only: tuple[str, ...] | None = None) -> int:
    """Bytes of the files under ``root`` (those directly in a directory named in ``only``, if
    given); files that vanish while we look are skipped. Counted by inode: the directories are
    read one after another, and a file renamed from one into the next between two reads (the
    daemon's ``.tmp`` -> ``ready`` -> ``claimed``) must not count twice, nor a hard link."""
    sizes: dict[tuple[int, int], int] = {}
    for directory, _, files in os.walk(root):
        if only and Path(directory).name not in only:
            continue
        for name in files:
            try:
                info = os.lstat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            sizes[info.st_dev, info.st_ino] = info.st_size
    return sum(sizes.values())
