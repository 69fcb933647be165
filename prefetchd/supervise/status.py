"""The status record: how the supervisor keeps its books and how programs read it.

``status.json`` in ``status.state_dir`` is rewritten atomically about once a second by the
supervisor (``status_writer.py``). Its format is ``messages/status_record.py`` (keys are
interface: docs/status.md "--json"); the table, for people, is ``status_table.py``. Also here:
reading the children's reports and the trainers' wait figures, the formats of which are
``messages/child_report.py`` and ``messages/consumer_report.py``.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefetchd.errors import RuntimeFailure
from prefetchd.layout import Layout, lock_claimant
from prefetchd.messages.child_report import ChildReport
from prefetchd.messages.consumer_report import ConsumerReport
from prefetchd.messages.counters import Counts
from prefetchd.messages.status_record import DaemonState, StatusRecord
from prefetchd.messages.wire import MessageError

RATE_WINDOW = 10.0  # seconds of history behind the rates
HEARTBEAT_STALE = 15.0  # a status older than this means the daemon is not running

REQUIRED_KEYS = (
    "state",
    "epoch",
    "objects_downloaded",
    "bytes_downloaded",
    "records_written",
    "shards_written",
    "shards_ready",
    "window_bytes",
    "ram_bytes",
    "download_bytes_per_s",
    "write_records_per_s",
    "retries",
    "errors",
    "children",
)


@dataclass
class Totals:
    """Counters summed over children, carried across child restarts."""

    carried: dict[str, Counts] = field(default_factory=dict)  # from dead instances

    def add_dead(self, name: str, last: ChildReport) -> None:
        """Carry the counts of ``last``, the final report of a child that died."""
        self.carried[name] = self.carried.get(name, Counts()) + last.counts

    def sum(self, reports: Mapping[str, ChildReport]) -> Counts:
        total = Counts()
        for name in set(reports) | set(self.carried):
            live = reports[name].counts if name in reports else Counts()
            total = total + live + self.carried.get(name, Counts())
        return total


@dataclass
class Rates:
    """Per-second rates over the last ``RATE_WINDOW`` seconds, and since start."""

    samples: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=256))
    started: float = field(default_factory=time.monotonic)

    def add(self, now: float, downloaded: int, records: int) -> None:
        self.samples.append((now, downloaded, records))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW:
            self.samples.popleft()

    def recent(self) -> tuple[float, float]:
        if len(self.samples) < 2:
            return 0.0, 0.0
        (t0, b0, r0), (t1, b1, r1) = self.samples[0], self.samples[-1]
        dt = max(t1 - t0, 1e-9)
        return max(0.0, (b1 - b0) / dt), max(0.0, (r1 - r0) / dt)


@dataclass
class Series:
    """Per-second rates of several monotonic counters over the last ``RATE_WINDOW`` seconds."""

    samples: deque[tuple[float, dict[str, float]]] = field(
        default_factory=lambda: deque(maxlen=256)
    )

    def add(self, now: float, values: dict[str, float]) -> None:
        self.samples.append((now, dict(values)))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW:
            self.samples.popleft()

    def rate(self, name: str) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, v0), (t1, v1) = self.samples[0], self.samples[-1]
        return max(0.0, (v1.get(name, 0.0) - v0.get(name, 0.0)) / max(t1 - t0, 1e-9))


@dataclass
class ConsumerWaits:
    """Seconds trainers spent waiting inside ``ready_files()``, summed over trainer processes
    and kept after a trainer exits (its last reading is carried)."""

    last: dict[str, float] = field(default_factory=dict)
    carried: float = 0.0

    def update(self, reports: Mapping[str, ConsumerReport], now: float) -> tuple[float, int, int]:
        """``(total wait seconds, trainers alive, trainers waiting now)``; ``now`` is
        time.monotonic() (a trainer from before ``waiting_since_monotonic`` is aged by the
        wall clock)."""
        current: dict[str, float] = {}
        waiting = 0
        for owner, report in reports.items():
            wait = report.wait_s
            if report.waiting_since_monotonic is not None:
                wait += max(0.0, now - report.waiting_since_monotonic)
                waiting += 1
            elif report.waiting_since is not None:
                wait += max(0.0, time.time() - report.waiting_since)
                waiting += 1
            current[owner] = max(wait, self.last.get(owner, 0.0))
        for owner, wait in self.last.items():
            if owner not in current:
                self.carried += wait
        self.last = current
        return self.carried + sum(current.values()), len(current), waiting


def read_consumers(layout: Layout) -> dict[str, ConsumerReport]:
    """The wait figures each live trainer process keeps in ``consumers/<claimant>.lock``."""
    reports: dict[str, ConsumerReport] = {}
    try:
        entries = list(os.scandir(layout.ram_consumers))
    except FileNotFoundError:
        return reports
    for entry in entries:
        if (claimant := lock_claimant(entry.name)) is None:
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            raw = os.pread(fd, 4096, 0)
        finally:
            os.close(fd)
        try:
            reports[claimant] = ConsumerReport.decode(raw)
        except MessageError:
            continue
    return reports


def eta_seconds(remaining_bytes: float, rate: float) -> float | None:
    """Seconds to move ``remaining_bytes`` at ``rate`` bytes/s; None when nothing moves."""
    if remaining_bytes <= 0:
        return 0.0
    if rate <= 0:
        return None
    return round(remaining_bytes / rate, 1)


def read_status(layout: Layout) -> StatusRecord | None:
    """The last status record, or None if there is none. Raises ``RuntimeFailure`` when it
    cannot be read (the state directory is private to the daemon's user): that is not "not
    running"."""
    try:
        data = layout.status_file.read_bytes()
    except PermissionError:
        raise RuntimeFailure(
            f"cannot read {layout.status_file}: permission denied "
            "(status.state_dir is private to the daemon's user: run as that user)"
        ) from None
    except OSError:
        return None
    try:
        return StatusRecord.decode(data)
    except MessageError:
        return None


def is_running(status: StatusRecord | None) -> bool:
    """Whether the status belongs to a live daemon: its pid runs and it was updated lately."""
    if status is None or status.state in (DaemonState.DONE, DaemonState.FAILED):
        return False
    pid = status.pid
    fresh = status.age() < HEARTBEAT_STALE
    return fresh and pid > 0 and _pid_exists(pid) and pid != os.getpid()


def _pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists, ours or another user's (signal 0 sends nothing).
    Not psutil: importing it took a fifth of ``prefetchd status``'s run."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def read_children(layout: Layout) -> dict[str, dict[str, Any]]:
    """Each child's last report as written (a JSON object, decoded by
    ``ChildReport.decode_object``), by child name; unreadable or torn files are left out."""
    reports: dict[str, dict[str, Any]] = {}
    for child, path in layout.child_reports().items():
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(report, dict):
            reports[child] = report
    return reports
