"""Adaptive concurrency: how many requests may be in flight now, below ``download.concurrency``.

AIMD, as TCP's congestion control, on a clock rather than on round trips: each throttling answer
(503 SlowDown, 429, any 503) halves the limit, at most once per ``COOLDOWN`` seconds (the
answers of requests already in flight when it was cut describe the old rate, not the new one);
every ``GROW_EVERY`` seconds with successes and no cut add one. It never drops below 1 nor
exceeds ``download.concurrency``. Growing per round trip, as TCP does, would add 1 / latency a
second - 40 a second at 25 ms - and a cut once a second could never hold that back; one every
2 s is what cuts once a second balance, judged on answers that come back within a retry's
delay. A fleet of hosts each doing this converges on
shares of what the store grants, as TCP flows share a link.

One request in flight still sends 1 / latency requests a second: tens a second to a nearby
store, which 100 hosts multiply. So once the limit is down to 1 and the store still throttles,
the same rule goes on with a rate: ``rate`` starts at half what this host was sending, halves
on each further cut and grows by one request a second every ``GROW_EVERY``; once it is back at
twice what one request in flight sent, it is lifted and the limit on requests in flight grows
again. The transfer clients keep the rate through the pacer (``pacing.Pacer``).

Without throttling the limit stays at ``download.concurrency`` and a success costs one float
comparison: no lock, no clock, no extra work per object.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

DECREASE = 0.5
COOLDOWN = 1.0  # seconds between two cuts
# Seconds between two steps up, after a cut or a step: a throttled request's answer comes back
# up to hooks.MAX_RETRY_DELAY (2 s) later, so a step is judged before the next one is taken.
GROW_EVERY = 2.0
MIN_RATE = 0.2  # requests a second: the least a host is throttled down to


class AdaptiveLimit:
    """The limit on requests in flight (and the rate below one); ``throttle`` and ``success``
    from any thread."""

    def __init__(self, ceiling: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self.throttled = 0  # throttling answers seen (status: throttled)
        self.cuts = 0
        self.rate: float | None = None  # requests a second, once the limit is down to 1
        self._clock = clock
        self._cut_at = -COOLDOWN  # the last cut
        self._changed_at = -COOLDOWN  # the last cut or step up
        self._throttled_at = -COOLDOWN  # the last throttling answer, cut or not
        self._answers = 0  # answers since then, counted below the ceiling only
        self._lift = 0.0  # the rate is lifted once it is back at this
        self._lock = threading.Lock()

    @property
    def allowed(self) -> int:
        """Requests that may be in flight now."""
        return int(self.limit)

    def throttle(self) -> None:
        """The store asked us to slow down."""
        with self._lock:
            self.throttled += 1
            self._answers += 1
            now = self._throttled_at = self._clock()
            if now - self._cut_at < COOLDOWN:
                return  # a step up just before does not hold a cut back
            if self.limit > 1:
                self.limit = max(1.0, self.limit * DECREASE)
            else:
                sent = self._answers / max(now - self._changed_at, COOLDOWN)
                if self.rate is None:
                    self._lift = 2 * sent
                self.rate = max(MIN_RATE, min(self.rate or sent, sent) * DECREASE)
            self._cut_at = self._changed_at = now
            self._answers = 0
            self.cuts += 1

    def success(self) -> None:
        """A request succeeded."""
        if self.limit >= self.ceiling:
            return
        with self._lock:
            self._answers += 1
            now = self._clock()
            if now - max(self._changed_at, self._throttled_at) < GROW_EVERY:
                return  # judged on 2 s of answers with no throttling among them
            if self.rate is None:
                self.limit = min(float(self.ceiling), self.limit + 1)
            elif self.rate + 1 >= self._lift:
                self.rate = None
            else:
                self.rate += 1
            self._changed_at = now
            self._answers = 0
