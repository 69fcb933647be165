"""The child's side of the contract with the supervisor: ``ChildContext``.

A stage's main loop (downloader, writer) gets one from the child process shell
(``roles/shell.py``): its name, config and layout, whether it must stop (a stop signal, or the
supervisor gone), and where it reports. A child reports by rewriting
``state_dir/children/<name>.json`` (atomically) from its main loop about twice a second; the
file's ``heartbeat`` tells the supervisor the loop is alive. The report's format and its rule
for other versions are ``messages/child_report.py``. Signal handlers only set a flag; the loops
look at it at least every half second (and whether the supervisor is gone at most every
``PARENT_CHECK_INTERVAL``).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections import deque
from collections.abc import Mapping

from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.layout import Layout
from prefetchd.logs import redact
from prefetchd.messages.child_report import ChildReport, ErrorEntry

log = logging.getLogger(__name__)

REPORT_INTERVAL = 0.5
MAX_LAST_ERRORS = 10
# How often ``should_stop`` asks whether the supervisor is still the parent (``getppid``, a
# syscall): the loops ask once per pass, about once per small object in the downloader. The
# kernel's SIGTERM on the parent's death (``roles/shell.py``) is the first line; this is the
# fallback where it is not there, and a tenth of a second is well inside the half second the
# loops promise.
PARENT_CHECK_INTERVAL = 0.1


class ChildContext:
    """The handle a stage's main loop uses to learn it must stop and to publish its counters:
    owns the stop flag, the readiness, the counters' report and the last errors."""

    def __init__(self, name: str, config: Config) -> None:
        self.name = name
        self.config = config
        self.layout = Layout.of(config)
        self.stopping = False
        self.ready = False
        # The role's DownloaderCounters or WriterCounters, which it updates in place.
        self.counters: Mapping[str, object] = {}
        self.last_errors: deque[ErrorEntry] = deque(maxlen=MAX_LAST_ERRORS)
        self._parent = os.getppid()
        self._parent_checked = time.monotonic()
        self._last_report = 0.0
        self._path = self.layout.child_report(name)

    def should_stop(self) -> bool:
        """Whether the loop must stop: a stop signal, or the supervisor gone (looked at every
        ``PARENT_CHECK_INTERVAL``, not on every pass: it is a syscall)."""
        if self.stopping:
            return True
        now = time.monotonic()
        if now - self._parent_checked >= PARENT_CHECK_INTERVAL:
            self._parent_checked = now
            if os.getppid() != self._parent:
                log.warning("the supervisor is gone; stopping")
                self.stopping = True
        return self.stopping

    def error(self, key: str | None, message: str) -> None:
        """Record an error for status (the caller logs it once)."""
        self.last_errors.append(ErrorEntry(time.time(), key, redact(message)))

    def settled(self) -> None:
        """The role is set up (imports, clients, listing, recovery): say so, and take what it
        built out of the cyclic garbage collector's work (``gc.freeze``). Those objects live
        as long as the process, and botocore's service models alone are hundreds of
        thousands: each full collection walked them all again, 7-14 % of a busy writer's or
        downloader's CPU (py-spy --native: ``gc_collect_main``)."""
        self.ready = True
        self.report(force=True)
        gc.freeze()

    def report_due(self) -> bool:
        """Whether ``report()`` would publish now (lets a role skip computing figures)."""
        return time.monotonic() - self._last_report >= REPORT_INTERVAL

    def report(
        self,
        *,
        force: bool = False,
        boot_error: str | None = None,
        fatal: str | None = None,
        stopped: bool = False,
    ) -> None:
        """Publish the counters (at most every ``REPORT_INTERVAL`` unless ``force``); the
        last report of a child that ends says how: ``boot_error``, ``fatal`` or ``stopped``."""
        if not force and not self.report_due():
            return
        self._last_report = time.monotonic()
        report = ChildReport.of(
            self.counters,
            name=self.name,
            pid=os.getpid(),
            heartbeat=time.time(),  # for people
            beat=time.monotonic(),  # for the heartbeat check (see ChildReport.beat)
            ready=self.ready,
            last_errors=self.last_errors,
            boot_error=boot_error,
            fatal=fatal,
            stopped=stopped,
        )
        write_atomic(self._path, report.encode())

    def on_stop_signal(self, signum: int, frame: object) -> None:
        """The handler of a stop signal: set the flag the loops look at."""
        self.stopping = True
