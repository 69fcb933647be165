"""The status record: how the supervisor builds it and how people and programs read it.

``status.json`` in ``status.state_dir`` is rewritten atomically about once a second by the
supervisor. Its keys are interface (DESIGN.md "status --json"); the table is for people.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psutil

from prefetchd.layout import Layout
from prefetchd.sizes import format_size
from prefetchd.states import DaemonState

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


def read_status(layout: Layout) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(layout.status_file.read_text(encoding="utf-8"))
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


def _bar(used: float, limit: float, width: int = 20) -> str:
    frac = 0.0 if limit <= 0 else min(1.0, max(0.0, used / limit))
    filled = round(frac * width)
    return "[" + "#" * filled + "." * (width - filled) + f"] {frac * 100:3.0f}%"


def render_table(status: dict[str, Any]) -> str:
    """A readable multi-line summary of a status record."""
    epochs = status.get("epochs_total")
    epoch_text = f"{status.get('epoch')} of {epochs}" if epochs else f"{status.get('epoch')}"
    done, total = status.get("epoch_objects_done", 0), status.get("epoch_objects", 0)
    lines = [
        f"prefetchd  {status.get('state', '?')}"
        + (f"  ({status['reason']})" if status.get("reason") else ""),
        f"  config          {status.get('config', '?')}",
        f"  epoch           {epoch_text}   (downloading epoch {status.get('download_epoch')}:"
        f" {done}/{total} objects)",
        f"  downloader      {status.get('download_activity', '?')}",
        f"  download        {status.get('download_bytes_per_s', 0) / 1e6:8.1f} MB/s   "
        f"(avg {status.get('download_bytes_per_s_avg', 0) / 1e6:.1f})  "
        f"{status.get('objects_downloaded', 0)} objects, "
        f"{format_size(status.get('bytes_downloaded', 0))}",
        f"  write           {status.get('write_records_per_s', 0):8.0f} rec/s  "
        f"(avg {status.get('write_records_per_s_avg', 0):.0f})  "
        f"{status.get('records_written', 0)} records, {status.get('shards_written', 0)} shards",
        f"  window          {_bar(status.get('window_bytes', 0), status.get('window_limit', 0))}"
        f"  {format_size(status.get('window_bytes', 0))}"
        f" of {format_size(status.get('window_limit', 0))}",
        f"  RAM disk        {_bar(status.get('ram_bytes', 0), status.get('ram_budget', 0))}"
        f"  {format_size(status.get('ram_bytes', 0))}"
        f" of {format_size(status.get('ram_budget', 0))}",
        f"  shards          {status.get('shards_ready', 0)} ready, "
        f"{status.get('shards_claimed', 0)} being read",
        f"  retries/errors  {status.get('retries', 0)} / {status.get('errors', 0)}",
        "  children",
    ]
    for name, child in sorted(status.get("children", {}).items()):
        alive = "alive" if child.get("alive") else "dead"
        lines.append(
            f"    {name:<12} pid {child.get('pid') or '-':<8} {alive:<6} "
            f"{child.get('state', ''):<9} restarts {child.get('restarts', 0)}"
        )
    errors = status.get("last_errors") or []
    if errors:
        lines.append("  last errors")
        for err in errors[-5:]:
            when = time.strftime("%H:%M:%S", time.localtime(err.get("time", 0)))
            lines.append(f"    {when} {err.get('key') or '-'}: {err.get('error')}")
    return "\n".join(lines)
