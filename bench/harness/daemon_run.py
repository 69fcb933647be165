"""One daemon run read to its end, for the studies that compare configs of one dataset
(``bench.studies.replay``, ``bench.studies.sources_cpu``): the config written, ``prefetchd
run`` started in a session of its own, every record read with ``prefetchd.records``, the daemon
waited for (or stopped), its RAM directory removed."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import prefetchd


@dataclass(frozen=True)
class DaemonRun:
    """What one run gave: seconds from start to the last record, the daemon's CPU-seconds
    (its process tree, user + system), records read."""

    seconds: float
    cpu: float
    records: int


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_and_read(
    work: Path,
    config: Callable[[Path], dict[str, Any]],
    each: Callable[[bytes], None] | None = None,
    *,
    label: str = "study",
) -> DaemonRun:
    """Run the daemon on ``config(ram_dir)`` (``ram_dir``: a fresh private directory on
    /dev/shm) with its files under ``work``, and read every record (each handed to ``each``)."""
    ram = Path(tempfile.mkdtemp(prefix=f"prefetchd-{label}-{os.getpid()}-", dir="/dev/shm"))
    work.mkdir(parents=True)
    path = work / "prefetchd.yaml"
    path.write_text(yaml.safe_dump(config(ram / "ram")))
    count = 0
    before, started = children_cpu(), time.monotonic()
    try:
        with daemon(path, work / "daemon.log"):
            for record in prefetchd.records(path, timeout=300):
                if each is not None:
                    each(record)
                count += 1
            elapsed = time.monotonic() - started
    finally:
        shutil.rmtree(ram, ignore_errors=True)
    return DaemonRun(elapsed, children_cpu() - before, count)


@contextlib.contextmanager
def daemon(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``prefetchd run --config config`` in a session of its own, its output in ``log``; on a
    normal exit waited for (it ends once its job is read), else stopped with SIGTERM."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefetchd", "run", "--config", str(config)],
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    try:
        yield proc
        proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
