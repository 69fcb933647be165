"""The request and byte budgets of one host (``download.max_requests_per_s``,
``download.max_bytes_per_s``): token buckets on the request path of both transfer clients.

A bucket holds at most one second of its rate and may go into debt: a request is let through
whenever the bucket is not in debt, and takes what it costs, so a 64 MiB object under a
10 MiB/s budget passes at once and the next request waits 6.4 s. Over any stretch of T
seconds a bucket lets through at most ``rate x (T + 1)`` plus one request's cost. Pure: the
clock is injected, and ``delay`` never sleeps (``wait`` does, for the classic client's
threads; the crt client asks ``delay`` from the main loop and tries again later).

The pacer also keeps the adaptive rate (``adaptive.AdaptiveLimit.rate``, set only while the
store throttles a host already down to one request in flight), in a bucket that holds a
single token: requests evenly spaced, no burst.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prefetchd.download.adaptive import AdaptiveLimit


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` (default: one second's worth, and at
    least 1) held."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        capacity: float | None = None,
    ) -> None:
        self.rate = rate
        self.capacity = capacity if capacity is not None else max(1.0, rate)
        self._clock = clock
        self._tokens = self.capacity
        self._at = clock()

    def delay(self, cost: float) -> float:
        """0 (and ``cost`` taken) if the bucket is not in debt, else the seconds until it is
        not (nothing taken)."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 0:
            return -self._tokens / self.rate
        self._tokens -= cost
        return 0.0


class Pacer:
    """The host's budgets: requests a second and bytes a second, each optional. Any thread."""

    def __init__(
        self,
        requests_per_s: float | None,
        bytes_per_s: float | None,
        clock: Callable[[], float] = time.monotonic,
        limit: AdaptiveLimit | None = None,
    ) -> None:
        self._requests = TokenBucket(requests_per_s, clock) if requests_per_s else None
        self._bytes = TokenBucket(bytes_per_s, clock) if bytes_per_s else None
        self._clock = clock
        self._limit = limit
        self._adaptive = TokenBucket(1.0, clock, capacity=1.0)  # rate set from the limit
        self._lock = threading.Lock()
        self.waited_s = 0.0  # time requests spent held back by the budgets (status)
        self._held_at = 0.0  # ``admit``: when the budgets began to hold its caller back

    @property
    def active(self) -> bool:
        """Whether a budget, or the adaptive rate, may hold a request back now."""
        return (
            self._requests is not None
            or self._bytes is not None
            or (self._limit is not None and self._limit.rate is not None)
        )

    def delay(self, requests: int, nbytes: int) -> float:
        """0 if ``requests`` requests moving ``nbytes`` bytes may start now (and they are
        counted), else the seconds to wait before asking again (nothing counted)."""
        if not self.active:
            return 0.0
        with self._lock:
            adaptive = self._adaptive_bucket()
            wait = max(self._debt(self._requests), self._debt(self._bytes), self._debt(adaptive))
            if wait > 0:
                return wait
            if adaptive is not None:
                adaptive.delay(requests)
            if self._requests is not None:
                self._requests.delay(requests)
            if self._bytes is not None:
                self._bytes.delay(nbytes)
            return 0.0

    def wait(self, requests: int, nbytes: int, sleep: Callable[[float], None] = time.sleep) -> None:
        """Block until ``requests`` requests of ``nbytes`` may start, then count them."""
        while (pause := self.delay(requests, nbytes)) > 0:
            with self._lock:
                self.waited_s += pause
            sleep(pause)

    def admit(self, requests: int, nbytes: int, timeout: float) -> bool:
        """``delay`` for a caller that must not block longer than ``timeout`` (the crt client's
        main loop, which asks again later): True once the requests may start (and they are
        counted); the time from the first refusal to then is added to ``waited_s``. One
        calling thread."""
        wait = self.delay(requests, nbytes)
        if 0 < wait <= timeout:
            time.sleep(wait)
            wait = self.delay(requests, nbytes)
        now = self._clock()
        if wait > 0:
            self._held_at = self._held_at or now
            return False
        if self._held_at:
            with self._lock:
                self.waited_s += now - self._held_at
            self._held_at = 0.0
        return True

    def _adaptive_bucket(self) -> TokenBucket | None:
        rate = self._limit.rate if self._limit is not None else None
        if rate is None:
            return None
        self._adaptive.delay(0)  # refill at the old rate up to now
        self._adaptive.rate = rate
        return self._adaptive

    @staticmethod
    def _debt(bucket: TokenBucket | None) -> float:
        return 0.0 if bucket is None else bucket.delay(0)
