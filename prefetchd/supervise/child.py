"""What every child process shares: start-up, stop signals, parent watch, and its report.

A child reports by rewriting ``state_dir/children/<name>.json`` (atomically) from its main
loop about twice a second; the file's ``heartbeat`` tells the supervisor the loop is alive.
The report's format and its rule for other versions are ``child_report.py``.
Signal handlers only set a flag; the loops look at it at least every half second.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping

from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.errors import PrefetchdError
from prefetchd.layout import Layout
from prefetchd.logs import redact, setup_logging
from prefetchd.supervise.child_report import ErrorEntry, report_json
from prefetchd.supervise.states import CHILD_BOOT_FAILURE

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
REPORT_INTERVAL = 0.5
MAX_LAST_ERRORS = 10


class ChildContext:
    """The handle a role's main loop uses to learn it must stop and to publish its counters."""

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
        self._last_report = 0.0
        self._path = self.layout.child_report(name)

    def should_stop(self) -> bool:
        if not self.stopping and os.getppid() != self._parent:
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
        record = report_json(
            name=self.name,
            pid=os.getpid(),
            heartbeat=time.time(),  # for people
            beat=time.monotonic(),  # for the heartbeat check (see ChildReport.beat)
            ready=self.ready,
            counters=self.counters,
            last_errors=self.last_errors,
            boot_error=boot_error,
            fatal=fatal,
            stopped=stopped,
        )
        write_atomic(self._path, json.dumps(record).encode())

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True


def child_main(
    name: str, entry: Callable[[ChildContext, int], None], index: int, config: Config
) -> None:
    """Entry point of every child process (spawned, so nothing is inherited but arguments):
    set up logging and signals, run the role's ``entry(ctx, index)``, report how it ended."""
    setup_logging(config.log.level, name)
    _die_with_parent()
    ctx = ChildContext(name, config)
    signal.signal(signal.SIGTERM, ctx._on_signal)
    # Ctrl-C and a closed terminal signal the whole process group; the supervisor drains us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        entry(ctx, index)
    except PrefetchdError as exc:
        message = redact(str(exc))
        log.error("%s", message)
        ctx.report(force=True, boot_error=message if not ctx.ready else None, fatal=message)
        sys.exit(CHILD_BOOT_FAILURE if not ctx.ready else 1)
    except Exception as exc:
        message = redact(f"{type(exc).__name__}: {exc}")
        log.error("crashed: %s", message, exc_info=True)  # the traceback is masked too
        ctx.report(force=True, boot_error=message if not ctx.ready else None, fatal=message)
        sys.exit(CHILD_BOOT_FAILURE if not ctx.ready else 1)
    ctx.report(force=True, stopped=True)


def _die_with_parent() -> None:
    """Ask the kernel to SIGTERM us if the supervisor dies (Linux); loops also poll getppid."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
