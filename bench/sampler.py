"""What a run costs, sampled while it runs: peak RSS of the daemon's process tree and of the
trainer, peak bytes under a directory (the RAM disk, a ceiling's target), and children's CPU."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
from pathlib import Path

INTERVAL = 0.1


class Sampler(threading.Thread):
    """Every 0.1 s: RSS of the daemon's process tree and of the trainer, bytes under a dir."""

    def __init__(self, daemon_pid: int | None, trainer_pid: int | None, disk: Path | None):
        super().__init__(daemon=True)
        self.daemon_pid, self.trainer_pid, self.disk = daemon_pid, trainer_pid, disk
        self.daemon_rss = self.trainer_rss = self.disk_bytes = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(INTERVAL):
            if self.daemon_pid is not None:
                self.daemon_rss = max(self.daemon_rss, tree_rss(self.daemon_pid))
            if self.trainer_pid is not None:
                self.trainer_rss = max(self.trainer_rss, tree_rss(self.trainer_pid, children=False))
            if self.disk is not None:
                self.disk_bytes = max(self.disk_bytes, dir_bytes(self.disk))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def tree_rss(pid: int, *, children: bool = True) -> int:
    """RSS of ``pid`` (and its descendants); 0 for what has gone (processes come and go)."""
    import psutil

    total = 0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *(root.children(recursive=True) if children else [])]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
    return total


def dir_bytes(path: Path) -> int:
    """Bytes allocated by files under ``path`` (files may vanish while we look)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
