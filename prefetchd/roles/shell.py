"""The child process shell: what runs in every spawned child around its role's main loop.

``child_main`` is the spawn entry point (nothing is inherited but its arguments): it sets up
logging, asks the kernel to stop the child with its parent, turns stop signals into the
``ChildContext`` flag, runs the role's entry and reports how it ended, exiting with
``CHILD_BOOT_FAILURE`` when the role failed before it was ready.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import sys
from collections.abc import Callable

from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.errors import PrefetchdError
from prefetchd.logs import redact, setup_logging

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1

# Exit code a child uses when it cannot boot (bad bucket, credentials): the supervisor stops
# the daemon with the child's reason instead of restarting it (gunicorn's WORKER_BOOT_ERROR).
CHILD_BOOT_FAILURE = 3


def child_main(
    name: str, entry: Callable[[ChildContext, int], None], index: int, config: Config
) -> None:
    """Entry point of every child process (spawned, so nothing is inherited but arguments):
    set up logging and signals, run the role's ``entry(ctx, index)``, report how it ended."""
    setup_logging(config.log.level, name)
    _die_with_parent()
    ctx = ChildContext(name, config)
    signal.signal(signal.SIGTERM, ctx.on_stop_signal)
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
