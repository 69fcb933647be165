"""The status record: how the supervisor builds it and how people and programs read it.

``status.json`` in ``status.state_dir`` is rewritten atomically about once a second by the
supervisor. Its keys are interface (DESIGN.md "status --json"); the table is for people.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from prefetchd.errors import RuntimeFailure
from prefetchd.layout import Layout
from prefetchd.sizes import format_size
from prefetchd.supervise.states import DaemonState

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

_SUMMED = (
    "objects_downloaded",
    "bytes_downloaded",
    "objects_skipped",
    "integrity_failures",
    "objects_unverified",
    "verify_requests",
    "records_written",
    "shards_written",
    "bytes_written",
    "objects_consumed",
    "retries",
    "errors",
)


@dataclass
class Totals:
    """Counters summed over children, carried across child restarts."""

    carried: dict[str, dict[str, float]] = field(default_factory=dict)  # from dead instances

    def add_dead(self, name: str, last: dict[str, Any]) -> None:
        base = self.carried.setdefault(name, {})
        for key in _SUMMED:
            base[key] = base.get(key, 0) + float(last.get(key, 0) or 0)

    def sum(self, reports: dict[str, dict[str, Any]]) -> dict[str, int]:
        totals: dict[str, float] = dict.fromkeys(_SUMMED, 0)
        for name in set(reports) | set(self.carried):
            live = reports.get(name, {})
            base = self.carried.get(name, {})
            for key in _SUMMED:
                totals[key] += float(live.get(key, 0) or 0) + base.get(key, 0)
        return {k: int(v) for k, v in totals.items()}


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

    def update(self, reports: dict[str, dict[str, Any]], now: float) -> tuple[float, int, int]:
        """``(total wait seconds, trainers alive, trainers waiting now)``."""
        current: dict[str, float] = {}
        waiting = 0
        for owner, report in reports.items():
            wait = float(report.get("wait_s", 0) or 0)
            since = report.get("waiting_since")
            if since is not None:
                wait += max(0.0, now - float(since))
                waiting += 1
            current[owner] = max(wait, self.last.get(owner, 0.0))
        for owner, wait in self.last.items():
            if owner not in current:
                self.carried += wait
        self.last = current
        return self.carried + sum(current.values()), len(current), waiting


def read_consumers(layout: Layout) -> dict[str, dict[str, Any]]:
    """The wait figures each live trainer process keeps in ``consumers/<owner>.lock``."""
    reports: dict[str, dict[str, Any]] = {}
    try:
        entries = list(os.scandir(layout.ram_consumers))
    except FileNotFoundError:
        return reports
    for entry in entries:
        if not entry.name.endswith(".lock") or entry.name.startswith("."):
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
            report = json.loads(raw.decode("utf-8").strip() or "{}")
        except ValueError:
            continue
        if isinstance(report, dict):
            reports[entry.name.removesuffix(".lock")] = report
    return reports


def eta_seconds(remaining_bytes: float, rate: float) -> float | None:
    """Seconds to move ``remaining_bytes`` at ``rate`` bytes/s; None when nothing moves."""
    if remaining_bytes <= 0:
        return 0.0
    if rate <= 0:
        return None
    return round(remaining_bytes / rate, 1)


def read_status(layout: Layout) -> dict[str, Any] | None:
    """The last status record, or None if there is none. Raises ``RuntimeFailure`` when it
    cannot be read (the state directory is private to the daemon's user): that is not "not
    running"."""
    try:
        data: dict[str, Any] = json.loads(layout.status_file.read_text(encoding="utf-8"))
    except PermissionError:
        raise RuntimeFailure(
            f"cannot read {layout.status_file}: permission denied "
            "(status.state_dir is private to the daemon's user: run as that user)"
        ) from None
    except (OSError, ValueError):
        return None
    return data


def is_running(status: dict[str, Any] | None) -> bool:
    """Whether the status belongs to a live daemon: its pid runs and it was updated lately."""
    if not status or status.get("state") in (DaemonState.DONE, DaemonState.FAILED):
        return False
    pid = int(status.get("pid", 0) or 0)
    fresh = time.time() - float(status.get("updated", 0)) < HEARTBEAT_STALE
    return fresh and pid > 0 and psutil.pid_exists(pid) and pid != os.getpid()


def read_children(layout: Layout) -> dict[str, dict[str, Any]]:
    reports: dict[str, dict[str, Any]] = {}
    for path in layout.children.glob("*.json"):
        try:
            reports[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return reports


# --- the table --------------------------------------------------------------------------------

BAR_WIDTH = 20
MAX_TEXT = 100  # longest key or message shown in the table (the JSON has them whole)


def _integrity(get: Callable[..., Any]) -> str:
    """Verification figures for the table, shown only when there is something to see."""
    failed, unverified = get("integrity_failures", 0), get("objects_unverified", 0)
    text = f", {failed} fetches failed verification" if failed else ""
    return text + (f", {unverified} objects checked for size only" if unverified else "")


def _bar(used: float, limit: float, width: int = BAR_WIDTH) -> str:
    frac = 0.0 if limit <= 0 else min(1.0, max(0.0, used / limit))
    filled = round(frac * width)
    return "[" + "#" * filled + "." * (width - filled) + f"] {frac * 100:3.0f}%"


def _safe(text: object, limit: int = MAX_TEXT) -> str:
    """One printable line: object keys and error messages may hold newlines, escapes or
    right-to-left overrides that would garble (or forge lines of) a terminal."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return out if len(out) <= limit else out[: limit - 1] + "…"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    s = round(seconds)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def render_table(status: dict[str, Any]) -> str:
    """A readable summary of a status record: is the trainer waiting on data, and why?

    Depends only on the record (and the local time zone for error times), so a recorded
    status always renders the same table.
    """
    get = status.get
    epochs = get("epochs_total")
    epoch_text = f"{get('epoch')} of {epochs}" if epochs else f"{get('epoch')} (endless)"
    lines = [
        f"prefetchd {get('state', '?')}"
        + (f": {_safe(get('reason'), 300)}" if get("reason") else "")
        + f"   pid {get('pid', '-')}, up {_duration(get('uptime_s'))}",
        f"  config        {_safe(get('config', '?'), 300)}",
    ]
    bottleneck = get("bottleneck") or {}
    if bottleneck:
        lines.append(f"  bottleneck    {bottleneck.get('verdict')}: {bottleneck.get('summary')}")
        lines += [f"                - {_safe(e)}" for e in bottleneck.get("evidence", [])]
    lines += [
        "",
        "  throughput    last 10 s       since start",
        f"    download    {get('download_bytes_per_s', 0) / 1e6:8.1f} MB/s  "
        f"{get('download_bytes_per_s_avg', 0) / 1e6:8.1f} MB/s   "
        f"{get('objects_downloaded', 0)} objects, {format_size(get('bytes_downloaded', 0))}",
        f"    write       {get('write_records_per_s', 0):8.0f} rec/s "
        f"{get('write_records_per_s_avg', 0):8.0f} rec/s    "
        f"{get('records_written', 0)} records, {get('shards_written', 0)} shards",
        f"    trainers    waiting {_pct(get('consumer_wait_ratio', 0))} of the last 10 s, "
        f"{_duration(get('consumer_wait_s', 0))} in all; "
        f"{get('consumers', 0)} reading, {get('consumers_waiting', 0)} waiting now",
        f"    writers     blocked on RAM {_pct(get('writer_ram_wait_ratio', 0))} of the last "
        f"10 s, {_duration(get('writer_ram_wait_s', 0))} in all (summed over writers)",
        "",
        f"  window        {_bar(get('window_bytes', 0), get('window_limit', 0))}"
        f"  {format_size(get('window_bytes', 0))} of {format_size(get('window_limit', 0))}",
        f"  RAM disk      {_bar(get('ram_bytes', 0), get('ram_budget', 0))}"
        f"  {format_size(get('ram_bytes', 0))} of {format_size(get('ram_budget', 0))}",
        f"  shards        {get('shards_ready', 0)} ready, {get('shards_claimed', 0)} being read",
        "",
        f"  epoch         {epoch_text}"
        + (f", whole job ETA {_duration(get('job_eta_s'))}" if epochs else ""),
    ]
    for ep in get("epochs") or []:
        done, total = ep.get("bytes_done", 0), ep.get("bytes", 0)
        eta = f"ETA {_duration(ep.get('eta_s'))}" if ep.get("state") == "downloading" else ""
        lines.append(
            f"    epoch {ep.get('epoch'):<5} {_bar(done, total)}  "
            f"{ep.get('objects_done', 0)}/{ep.get('objects', 0)} objects  "
            f"{ep.get('state')} {eta}".rstrip()
        )
    lines += [
        f"  retries       {get('retries', 0)}, errors {get('errors', 0)}{_integrity(get)}",
        "",
        "  children      state     health      pid       restarts  activity",
    ]
    for name, child in sorted((get("children") or {}).items()):
        if not child.get("alive"):
            health = "dead"
        elif child.get("healthy"):
            health = "ok"
        else:
            age = child.get("heartbeat_age_s")
            health = "silent" if age is None else f"silent {_duration(age)}"
        lines.append(
            f"    {name:<12}{child.get('state', ''):<10}{health:<12}"
            f"{child.get('pid') or '-'!s:<10}{child.get('restarts', 0):<10}"
            f"{_safe(child.get('activity') or '-', 60)}"
        )
    errors = get("last_errors") or []
    if errors:
        lines += ["", "  last errors"]
        for err in errors[-5:]:
            when = time.strftime("%H:%M:%S", time.localtime(err.get("time", 0)))
            lines.append(f"    {when} {_safe(err.get('key') or '-')}")
            lines.append(f"             {_safe(err.get('error'))}")
    return "\n".join(lines)
