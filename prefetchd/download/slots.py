"""The crt transfer's request slots: a counting semaphore taken by one thread and given back by any.

``threading.Semaphore`` would do, but it is Python code around a ``Condition``: each wait
allocates a lock and each release walks the waiter list, and the release runs once per object,
on the thread that finished it, holding the GIL the main loop waits for. With thousands of
small objects a second, that showed in the downloader's CPU per object (issue #12). Here a
release is one put on a C ``SimpleQueue``, and the taker keeps the count.

Both clients take their request slots here, so the adaptive limit (``adaptive.py``) applies to
both: a slot is free only while fewer than ``limit.allowed`` are taken. Without throttling that
is every slot, and the check is one comparison per acquire. ``extra`` slots beyond the limit
(the native client's requests queued in its engine, ``native.py``) are open only while the
limit is at its ceiling: throttled, the limit bounds every request taken, queued or not.
"""

from __future__ import annotations

import queue

from prefetchd.download.adaptive import AdaptiveLimit


class Slots:
    """``total`` slots. ``acquire`` may be called from one thread only (the downloader's main
    loop); ``release`` from any thread."""

    def __init__(self, total: int, limit: AdaptiveLimit | None = None, extra: int = 0) -> None:
        self._total = total
        self._free = total  # only the acquiring thread reads and writes it
        self._limit = limit
        self._extra = extra
        self._returned: queue.SimpleQueue[int] = queue.SimpleQueue()

    @property
    def in_use(self) -> int:
        """Slots taken and not yet seen released (acquiring thread)."""
        return self._total - self._free

    def _open(self) -> bool:
        """Whether one more slot may be taken: one is free, and the adaptive limit allows it."""
        if not self._free:
            return False
        limit = self._limit
        if limit is None:
            return True
        allowed = limit.allowed
        if allowed >= limit.ceiling:
            allowed += self._extra
        return self._total - self._free < allowed

    def acquire(self, timeout: float) -> bool:
        """Take one slot, waiting up to ``timeout`` seconds for one to be released; False if
        none was."""
        if not self._open():
            self._collect()
            if not self._open():
                if timeout <= 0:
                    return False
                try:
                    self._free += self._returned.get(timeout=timeout)
                except queue.Empty:
                    return False
                if not self._open():
                    return False
        self._free -= 1
        return True

    def release(self, count: int) -> None:
        """Give ``count`` slots back (any thread)."""
        self._returned.put(count)

    def _collect(self) -> None:
        """Add every slot released so far without waiting."""
        while True:
            try:
                self._free += self._returned.get_nowait()
            except queue.Empty:
                return
