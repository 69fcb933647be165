"""How long one trainer process waited for shards: ``ConsumerStats``, the trainer's half of
``consumer_wait_s`` and the bottleneck verdict (the daemon reads it; its format is
``messages/consumer_report.py``)."""

from __future__ import annotations

import time

from prefetchd.messages.consumer_report import RECORD_SIZE, RESUMED_CHARS, ConsumerReport


class ConsumerStats:
    """How long one trainer process waited for shards, as read by the daemon's status.

    Owns the figures only; ``ClaimantLock`` stores them in ``consumers/<claimant>.lock`` as a
    ``ConsumerReport`` (``messages/consumer_report.py``). ``wait_s`` counts finished waits;
    ``waiting_since`` (time.monotonic(), a system-wide clock, so the supervisor compares it
    with its own) is set while at least one of the process's ``ready_files()`` iterators is
    waiting, so a reader adds the wait still under way.
    """

    RECORD_SIZE = RECORD_SIZE  # the report's fixed size, as callers of ConsumerStats know it

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.wait_s = 0.0
        self.waiters = 0
        self.waiting_since: float | None = None
        self.shards = 0
        self.resumed: str | None = None

    def begin(self, now: float) -> None:
        if self.waiters == 0:
            self.waiting_since = now
        self.waiters += 1

    def end(self, now: float) -> None:
        self.waiters = max(0, self.waiters - 1)
        if self.waiters == 0 and self.waiting_since is not None:
            self.wait_s += max(0.0, now - self.waiting_since)
            self.waiting_since = None

    def encode(self) -> bytes:
        since = self.waiting_since
        # Readers from before ``waiting_since_monotonic`` read ``waiting_since`` as epoch seconds.
        wall = None if since is None else round(since + time.time() - time.monotonic(), 3)
        report = ConsumerReport(
            self.pid,
            round(self.wait_s, 3),
            wall,
            self.shards,
            waiting_since_monotonic=since,
            resumed=self.resumed[:RESUMED_CHARS] if self.resumed else None,
        )
        return report.encode()
