"""Adaptive concurrency: how many requests may be in flight now, below ``download.concurrency``.

AIMD, as TCP's congestion control: each throttling answer (503 SlowDown, 429, any 503) halves
the limit, at most once per ``COOLDOWN`` seconds (the answers of requests already in flight
when it was cut describe the old rate, not the new one); each success adds ``1 / limit``, so
the limit grows by about one request per round of ``limit`` successes. It never drops below 1
nor exceeds ``download.concurrency``. A fleet of hosts each doing this converges on a fair
share of what the store grants, the way TCP flows share a link.

Without throttling the limit stays at ``download.concurrency`` and a success costs one float
comparison: no lock, no extra work per object.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

DECREASE = 0.5
COOLDOWN = 1.0  # seconds between two cuts


class AdaptiveLimit:
    """The limit on requests in flight; ``throttled`` and ``success`` from any thread."""

    def __init__(self, ceiling: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self.throttled = 0  # throttling answers seen (status: throttled)
        self.cuts = 0
        self._clock = clock
        self._cut_at = -COOLDOWN
        self._lock = threading.Lock()

    @property
    def allowed(self) -> int:
        """Requests that may be in flight now."""
        return int(self.limit)

    def throttle(self) -> None:
        """The store asked us to slow down."""
        with self._lock:
            self.throttled += 1
            now = self._clock()
            if now - self._cut_at >= COOLDOWN:
                self.limit = max(1.0, self.limit * DECREASE)
                self._cut_at = now
                self.cuts += 1

    def success(self) -> None:
        """A request succeeded."""
        if self.limit >= self.ceiling:
            return
        with self._lock:
            self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)
