"""The trainer's side of the job fence (``fence.py``): claim only the shards of the job it reads.

A trainer started before its daemon (as a job script does) finds whatever an earlier daemon
left in ``ram_dir``: shards of a job whose state was removed, or of a config since changed.
Those must not be read, and the earlier job's epoch markers in ``state_dir`` must not end an
epoch. So a stream claims, and decides that an epoch is over, only under the fence of the job
it reads: the first *live* fence it sees (its daemon holds the lock) is adopted; a stale one
is waited out (the daemon about to start removes it, and writes its own). Once adopted, the
check is one ``stat`` per claim round while the fence is the same file (held open, so that a
new fence cannot take its inode number); a daemon restart
that resumed the job writes a new fence of the same job (read once, adopted); a fence of
another job raises ``JobChanged`` naming both, never a quiet switch of datasets.
"""

from __future__ import annotations

import contextlib
import os

from prefetchd.atomic import holds_lock
from prefetchd.errors import JobChanged
from prefetchd.fence import open_fence
from prefetchd.layout import LOCK_FILE, Layout
from prefetchd.messages.status_record import DaemonState, StatusRecord

_RUNNING = (DaemonState.STARTING, DaemonState.RUNNING, DaemonState.DRAINING)


class JobGuard:
    """Owns which job a trainer's stream reads: the fence it adopted (its job id, and a
    descriptor open on its file, closed by ``close``), or that the daemon is of a release that
    writes no fence."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.path = layout.job_fence
        self.job: str | None = None  # the job adopted
        self.note = ""
        self._inode: tuple[int, int] | None = None  # the fence file adopted (st_dev, st_ino)
        self._fd: int | None = None  # open on it, so that its inode number is not reused
        self._legacy = False  # the daemon writes no fence (an earlier release)

    def may_claim(self) -> bool:
        """Whether the shards in ``ready/`` (and the epoch markers) are this stream's job's now;
        False: wait (no fence yet, or a stale one of an earlier daemon). Raises ``JobChanged``
        when the fence names another job than the one adopted."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return self._legacy or self._no_fence()
        if (info.st_dev, info.st_ino) == self._inode:
            return True  # the common case: one stat
        return self._look()

    def _look(self) -> bool:
        opened = open_fence(self.path)
        if opened is None:
            return self._no_fence()
        fence, fd = opened
        if self.job is None and not fence.live:
            os.close(fd)
            return False  # an earlier daemon's: its shards may be about to be wiped
        if self.job is not None and fence.job != self.job:
            os.close(fd)
            raise JobChanged(
                f"output.ram_dir {self.layout.ram}: the daemon now runs job {fence.job} "
                f"({fence.note or 'no note'}), not job {self.job} that this trainer was "
                "reading; its shards are not this trainer's: start the trainer again for the "
                "new job"
            )
        self.job, self.note = fence.job, fence.note
        self._hold(fd, fence.inode)
        return True

    def _hold(self, fd: int | None, inode: tuple[int, int] | None) -> None:
        """Keep ``fd`` open on the fence adopted (so its inode number names it alone)."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._inode = fd, inode
        self._legacy = False

    def close(self) -> None:
        self._hold(None, None)

    def _no_fence(self) -> bool:
        """No fence: a daemon between its start and its fence (wait), or one of an earlier
        release, which writes none (claim as before). The latter is running now: its status
        names no job, says it runs, and was written by the process holding ram_dir's lock."""
        self.close()
        if self.job is not None:
            return False  # our daemon restarts: wait for its fence
        self._legacy = _legacy_daemon(self.layout)
        return self._legacy


def _legacy_daemon(layout: Layout) -> bool:
    try:
        status = StatusRecord.decode(layout.status_file.read_bytes())
    except (OSError, ValueError):
        return False
    if status.job_id is not None or status.state not in _RUNNING or not status.pid:
        return False
    lock = layout.ram / LOCK_FILE
    if not holds_lock(lock):
        return False
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(lock.read_text(encoding="ascii").split()[0]) == status.pid
    return False
