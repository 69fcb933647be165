"""Is the object store reachable? An outage, as status shows it.

Every request the transfer clients and the probe (``probe.py``) make reports here: an answer
from the store (any HTTP status below 500) is ``answered``, a refused or reset connection, a
timeout or a 5xx other than a throttling answer is ``failed``. ``OUTAGE_ERRORS`` failures in a
row with no answer in between are an outage, dated from the first of them; the first answer
ends it. Throttling is not an outage: the store answers, and asks for less (``adaptive.py``).

Pure, clock injected; any thread. ``answered`` costs one comparison while the store is well.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

OUTAGE_ERRORS = 3


@dataclass(frozen=True)
class Outage:
    since: float  # wall-clock seconds of the first failure
    errors: int
    last: str


class StoreHealth:
    """Failures in a row and when they began."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._errors = 0
        self._since = 0.0
        self._last = ""
        self.outages = 0  # outages seen so far (metrics)

    def failed(self, what: str) -> None:
        with self._lock:
            if self._errors == 0:
                self._since = self._clock()
            self._errors += 1
            self._last = what
            if self._errors == OUTAGE_ERRORS:
                self.outages += 1

    def answered(self) -> None:
        if self._errors:
            with self._lock:
                self._errors = 0

    @property
    def failing(self) -> bool:
        """Whether the last request failed (an outage may be beginning)."""
        return self._errors > 0

    def outage(self) -> Outage | None:
        """The outage going on, or None."""
        with self._lock:
            if self._errors < OUTAGE_ERRORS:
                return None
            return Outage(self._since, self._errors, self._last)
