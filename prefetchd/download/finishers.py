"""A fixed set of threads that run one call per fetched object (verify it, hand it over).

``concurrent.futures.ThreadPoolExecutor`` would do, but it builds a ``Future`` (with its own
``Condition``) for every call and takes its lock on every submit; nobody here waits on those
futures, and with thousands of small objects a second that cost shows in the downloader's CPU
per object. This pool is a C ``SimpleQueue`` and ``threads`` workers: the same contract as the
executor's ``submit`` / ``shutdown(wait=True)`` for calls whose result nobody reads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Finishers(Generic[T]):
    """Run ``fn(item)`` on one of ``threads`` threads for every ``submit(fn, item)``, in the
    order submitted per thread. An exception from ``fn`` is logged and the thread goes on."""

    def __init__(self, threads: int, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[T], object], T] | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()  # no call queued behind the stops shutdown() queues
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[[T], object], item: T) -> None:
        """Queue ``fn(item)``; raises RuntimeError once ``shutdown()`` has begun (as the
        executor does), so a late caller can run it itself."""
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit after shutdown")
            self._calls.put((fn, item))

    def shutdown(self) -> None:
        """Run every call already submitted, then stop and join the threads."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._calls.put(None)  # after every call already submitted: one per thread
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, item = call
            try:
                fn(item)
            except Exception:  # the executor would keep it in a Future nobody reads: say it
                log.exception("%s failed", getattr(fn, "__qualname__", fn))
