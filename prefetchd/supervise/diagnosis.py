"""The bottleneck verdict: is the trainer waiting on data, and if so, why? (pure)

It reads figures of the status record (``docs/status.md``), all over the last 10 s, and the
downloader's ``Activity`` as the downloader reported it:

- first of all, an outage: the downloader saw nothing but failures from the store (refused or
  reset connections, timeouts, 5xx) since ``store_unreachable_since`` -> ``store-bound``,
  "the object store is unreachable since 12:03:04: N errors, last: connection reset", whatever
  the trainers, writers and RAM look like (they only wait for it); the next answer from the
  store clears it, so the verdict is back to normal at the next status record;
- ``consumer_wait_ratio``: the share of their time trainers spent inside ``ready_files()``
  waiting for a shard. Below ``STARVED`` the trainers are the slow part: all is well.
- otherwise the stage that holds the others back, checked in this order:
  - downloads ``PAUSED`` on store errors or throttling -> ``store-bound``;
  - writers blocked on ``output.ram_budget`` for ``RAM_BLOCKED`` of their time while trainers
    wait -> ``ram-bound`` (the budget is held by shards the trainers have claimed);
  - the downloader ``LISTING`` the source (a restarted downloader, or ``download.keep``
    listing again before an epoch) -> ``store-bound``: nothing is fetched until the listing
    ends, and the store's listing is the limit; the evidence says how far it got
    (``objects_listed``), not a download rate that is 0 because nothing is asked for yet;
  - everything downloaded, or the window full (at least ``WINDOW_FULL``, or the downloader
    waiting for room) with less than ``LATE`` of it still being fetched -> ``writer-bound``
    (objects are here, writers cannot turn them into shards fast enough);
  - the window full, but mostly of objects still being fetched -> ``store-bound``: downloads
    are merely late (a slow store or network, first-byte latency), not the writers;
  - else -> ``store-bound`` (the window is not filling: downloads are the limit).

A daemon not ``running`` gets ``unknown``; while it starts and the downloader lists, the summary
says so, with the objects listed so far.
"""

from __future__ import annotations

import time

from prefetchd.messages.activity import Activity
from prefetchd.messages.status_record import VERDICTS, StatusRecord, Verdict

__all__ = ["DOWNLOADS_AHEAD", "VERDICTS", "Verdict", "diagnose"]

STARVED = 0.10  # trainers waiting this share of their time or more are starved
RAM_BLOCKED = 0.50
WINDOW_FULL = 0.80
LATE = 0.50  # share of the window still being fetched above which downloads, not writers, lag

# The downloader's activities when it has nothing to fetch right now: all done, or no room.
DOWNLOADS_AHEAD = frozenset({Activity.FINISHED, Activity.WAITING_FOR_WINDOW})


def _fill(used: float, limit: float) -> float:
    return used / limit if limit > 0 else 0.0


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _listing(status: StatusRecord) -> str:
    return f"the downloader is listing the source, {status.objects_listed} objects so far"


def outage_summary(status: StatusRecord) -> str | None:
    """ "the object store is unreachable since 12:03:04: N errors, last: ..." or None."""
    since = status.store_unreachable_since
    if since is None:
        return None
    clock = time.strftime("%H:%M:%S", time.localtime(since))
    last = f", last: {status.store_last_error}" if status.store_last_error else ""
    return f"the object store is unreachable since {clock}: {status.store_errors} errors{last}"


def diagnose(status: StatusRecord, activity: Activity | None) -> Verdict:
    """The verdict for one status record and the downloader's ``activity``; never raises."""
    outage = outage_summary(status)
    if outage is not None and status.state in ("starting", "running", "draining"):
        return Verdict(
            "store-bound",
            outage,
            [
                f"downloader {status.download_activity or 'waiting for the store'}",
                f"trainers waited for shards {_pct(status.consumer_wait_ratio)} of the last 10 s",
                f"retries {status.counts.retries}",
            ],
        )
    if status.state != "running":
        summary = f"the daemon is {status.state or 'not running'}"
        if status.state == "starting" and activity is Activity.LISTING:
            summary += f": {_listing(status)}"
        return Verdict("unknown", summary)
    wait, consumers = status.consumer_wait_ratio, status.consumers
    window = _fill(status.window_bytes, status.window_limit)
    ram = _fill(status.ram_bytes, status.ram_budget)
    ram_wait = status.writer_ram_wait_ratio
    rate, records = status.download_bytes_per_s, status.write_records_per_s
    words = status.download_activity or ""  # the evidence quotes what the table shows
    ready, claimed = status.shards_ready, status.shards_claimed
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
    if activity is Activity.PAUSED:
        return Verdict(
            "store-bound",
            "downloads are paused by errors from the object store",
            [evidence_wait, f"downloader {words}", f"retries {status.counts.retries}"],
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
    if activity is Activity.LISTING:
        return Verdict(
            "store-bound",
            f"{_listing(status)}: downloads start once the listing is complete",
            [evidence_wait, f"{status.objects_listed} objects listed so far"],
        )
    fetching = _fill(status.window_fetching_bytes, status.window_bytes)
    window_full = window >= WINDOW_FULL or activity in DOWNLOADS_AHEAD
    if activity is Activity.FINISHED or (window_full and fetching < LATE):
        return Verdict(
            "writer-bound",
            "objects are downloaded but writers cannot turn them into shards fast enough: "
            "raise output.writers",
            [
                evidence_wait,
                f"download window {_pct(window)} full, downloader {words or 'idle'}",
                f"writers at {records:.0f} records/s",
            ],
        )
    if window_full:
        return Verdict(
            "store-bound",
            "downloads are late: the window is full of objects still being fetched, so the "
            "store or network is the limit, not the writers",
            [
                evidence_wait,
                f"download window {_pct(window)} full, {_pct(fetching)} of it still downloading",
                f"downloading {rate / 1e6:.1f} MB/s",
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
