"""The child process shell: what runs in every spawned child around its role's main loop.

``child_main`` is the spawn entry point (nothing is inherited but its arguments): it sets up
logging, names the process (``process_name``: what ``top`` and ``pgrep -l prefetchd`` show,
``prefetchd-dl`` and ``prefetchd-w<i>``, where a spawned child would otherwise be one more
``python``), asks the kernel to stop the child with its parent, turns stop signals into the
``ChildContext`` flag, runs the role's entry and reports how it ended, exiting with
``CHILD_BOOT_FAILURE`` when the role failed before it was ready.
"""

from __future__ import annotations

import contextlib
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
_PR_SET_NAME = 15
_COMM_MAX = 15  # the kernel keeps 15 bytes of a process's name (TASK_COMM_LEN - 1)
_SHORT_ROLES = {"downloader": "dl", "writer": "w"}

# Exit code a child uses when it cannot boot (bad bucket, credentials): the supervisor stops
# the daemon with the child's reason instead of restarting it (gunicorn's WORKER_BOOT_ERROR).
CHILD_BOOT_FAILURE = 3


def child_main(
    name: str, entry: Callable[[ChildContext, int], None], index: int, config: Config
) -> None:
    """Entry point of every child process (spawned, so nothing is inherited but arguments):
    set up logging and signals, run the role's ``entry(ctx, index)``, report how it ended."""
    setup_logging(config.log.level, name)
    _prctl(_PR_SET_NAME, ctypes.c_char_p(process_name(name).encode()))
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # loops also poll getppid
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


def process_name(child: str) -> str:
    """The process name of child ``child`` (``downloader``, ``writer-3``): ``prefetchd-`` and
    its role's short name and number (``prefetchd-dl``, ``prefetchd-w3``), within the 15
    bytes the kernel keeps; threads the child starts inherit it."""
    role, _, number = child.partition("-")
    return f"prefetchd-{_SHORT_ROLES.get(role, role)}{number}"[:_COMM_MAX]


def _prctl(option: int, arg: object) -> None:
    """``prctl(option, arg)`` where the C library has it (Linux); nothing elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
