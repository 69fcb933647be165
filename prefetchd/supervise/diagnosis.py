"""The bottleneck verdict: is the trainer waiting on data, and if so, why? (pure)

It reads only figures of the status record (``docs/status.md``), all over the last 10 s:

- ``consumer_wait_ratio``: the share of their time trainers spent inside ``ready_files()``
  waiting for a shard. Below ``STARVED`` the trainers are the slow part: all is well.
- otherwise the stage that holds the others back, checked in this order:
  - downloads paused on store errors or throttling -> ``store-bound``;
  - writers blocked on ``output.ram_budget`` for ``RAM_BLOCKED`` of their time while trainers
    wait -> ``ram-bound`` (the budget is held by shards the trainers have claimed);
  - the download window at least ``WINDOW_FULL`` full, or the downloader with nothing left to
    fetch for now -> ``writer-bound`` (objects are here, writers cannot turn them into shards
    fast enough);
  - else -> ``store-bound`` (the window is not filling: downloads are the limit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STARVED = 0.10  # trainers waiting this share of their time or more are starved
RAM_BLOCKED = 0.50
WINDOW_FULL = 0.80

# The downloader's activity when it is ahead of the writers (nothing to fetch right now).
DOWNLOADS_AHEAD = ("finished", "waiting for the window")

VERDICTS = ("consumer-bound", "store-bound", "writer-bound", "ram-bound", "idle", "unknown")


@dataclass(frozen=True)
class Verdict:
    verdict: str  # one of VERDICTS
    summary: str
    evidence: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "summary": self.summary, "evidence": self.evidence}


def _fill(used: float, limit: float) -> float:
    return used / limit if limit > 0 else 0.0


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def diagnose(status: Mapping[str, Any]) -> Verdict:
    """The verdict for one status record; never raises on missing figures."""
    state = status.get("state")
    if state != "running":
        return Verdict("unknown", f"the daemon is {state or 'not running'}")
    wait = float(status.get("consumer_wait_ratio", 0.0) or 0.0)
    consumers = int(status.get("consumers", 0) or 0)
    window = _fill(float(status.get("window_bytes", 0)), float(status.get("window_limit", 0)))
    ram = _fill(float(status.get("ram_bytes", 0)), float(status.get("ram_budget", 0)))
    ram_wait = float(status.get("writer_ram_wait_ratio", 0.0) or 0.0)
    rate = float(status.get("download_bytes_per_s", 0.0) or 0.0)
    records = float(status.get("write_records_per_s", 0.0) or 0.0)
    activity = str(status.get("download_activity") or "")
    ready = int(status.get("shards_ready", 0) or 0)
    claimed = int(status.get("shards_claimed", 0) or 0)
    evidence_wait = f"trainers waited for shards {_pct(wait)} of the last 10 s"
    if consumers == 0:
        return Verdict(
            "idle",
            "no trainer is reading shards",
            [f"{ready} shards ready", f"RAM disk {_pct(ram)} full"],
        )
    if wait < STARVED:
        return Verdict(
            "consumer-bound",
            "the trainers are the slow part: shards are ready before they ask",
            [evidence_wait, f"{ready} shards ready", f"RAM disk {_pct(ram)} full"],
        )
    if activity.startswith("paused"):
        return Verdict(
            "store-bound",
            "downloads are paused by errors from the object store",
            [evidence_wait, f"downloader {activity}", f"retries {status.get('retries', 0)}"],
        )
    if ram_wait >= RAM_BLOCKED:
        return Verdict(
            "ram-bound",
            "writers wait for RAM held by shards the trainers have claimed: "
            "raise output.ram_budget or have trainers hold fewer shards open",
            [
                evidence_wait,
                f"writers blocked on the RAM budget {_pct(ram_wait)} of the time",
                f"RAM disk {_pct(ram)} full, {claimed} shards being read, {ready} ready",
            ],
        )
    if window >= WINDOW_FULL or activity.startswith(DOWNLOADS_AHEAD):
        return Verdict(
            "writer-bound",
            "objects are downloaded but writers cannot turn them into shards fast enough: "
            "raise output.writers",
            [
                evidence_wait,
                f"download window {_pct(window)} full, downloader {activity or 'idle'}",
                f"writers at {records:.0f} records/s",
            ],
        )
    return Verdict(
        "store-bound",
        "downloads are the limit: raise download.concurrency, or the store or network is slow",
        [
            evidence_wait,
            f"download window only {_pct(window)} full",
            f"downloading {rate / 1e6:.1f} MB/s",
        ],
    )
