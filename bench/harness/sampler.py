"""What a run costs, sampled while it runs: peak RSS of the daemon's process tree and of the
trainer, peak bytes under a directory (the RAM disk, a ceiling's target), children's CPU, and
the daemon's start-up (``StartupProbe``: CPU to its first GET, ``prefetchd status``'s wall)."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import threading
import time
from pathlib import Path

INTERVAL = 0.1
STARTUP_INTERVAL = 0.005  # how often the start-up probe looks for the first GET


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


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants, from ``/proc/<pid>/task/*/children`` (cheaper than a scan
    of every process, so it can run every few milliseconds)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError):
                    kids = Path(f"/proc/{current}/task/{task}/children").read_text().split()
                    todo.extend(int(k) for k in kids)
    return pids


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) used so far by ``pid`` alone; None if it has gone."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return None


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its living descendants."""
    return sum(cpu for current in tree_pids(pid) if (cpu := process_cpu(current)) is not None)


class StartupProbe(threading.Thread):
    """A daemon's start-up, watched: the CPU of its process tree when its first GET begins
    (the first file in its download temp dir: a ``.part`` is created just before its GET is
    sent), and then, if ``status_cmd`` is given, the wall time of that command once the first
    shard is published (in one of ``shard_dirs``, ready or already claimed: the daemon is
    running and busy). Results: ``startup_cpu_s``, ``status_s``
    (None if not measured), ``status_error``. ``stop()`` ends it and waits for the command."""

    def __init__(
        self,
        daemon_pid: int,
        tmp_dir: Path,
        status_cmd: list[str] | None = None,
        shard_dirs: tuple[Path, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.daemon_pid, self.tmp_dir, self.shard_dirs = daemon_pid, tmp_dir, shard_dirs
        self.status_cmd, self.env = status_cmd, env
        self.startup_cpu_s: float | None = None
        self.status_s: float | None = None
        self.status_error: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        if not self._wait_for_file((self.tmp_dir,), STARTUP_INTERVAL):
            return
        self.startup_cpu_s = tree_cpu(self.daemon_pid)
        if self.status_cmd is None or not self.shard_dirs:
            return
        if self._wait_for_file(self.shard_dirs, INTERVAL / 5):
            self._time_status(self.status_cmd)

    def _wait_for_file(self, directories: tuple[Path, ...], interval: float) -> bool:
        """Whether a file appeared in one of ``directories`` before ``stop()``."""
        while not self._stop_event.is_set():
            if any(has_entries(directory) for directory in directories):
                return True
            self._stop_event.wait(interval)
        return False

    def _time_status(self, cmd: list[str]) -> None:
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if done.returncode == 0:
            self.status_s = wall
        else:
            self.status_error = f"exit {done.returncode}: {done.stderr.strip()[-300:]}"

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def has_entries(directory: Path) -> bool:
    """Whether ``directory`` holds anything (False if it does not exist)."""
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        return any(True for _ in entries)
    return False
