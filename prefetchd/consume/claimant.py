"""This trainer process's claimant tag and its lock file, ``consumers/<claimant>.lock``.

The claimant tag names the process in its claims (``claimed/<claimant>-<shard>``): its pid
plus a random tag, because trainers in other containers may share a pid. The lock file,
flock-held for the life of the process, tells the daemon the process's claims are not
orphaned (a claim whose claimant's lock is free is returned to ``ready/``), and holds the
process's wait figures (``ConsumerStats``), rewritten in place.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import threading
import time

from prefetchd.atomic import create_exclusive
from prefetchd.consume.waits import ConsumerStats
from prefetchd.layout import Layout

log = logging.getLogger(__name__)


class ClaimantLock:
    """Owns the claimant tag, its lock file and the wait figures written into it.

    Made by the process's ``ShardReleaser`` (one per process and ``ram_dir``). After a fork
    the child's copy is its parent's (``foreign``): it never writes the parent's lock file nor
    removes it, and ``after_fork`` gives it a fresh lock (a parent thread may have held it).
    """

    def __init__(self, layout: Layout) -> None:
        self.pid = os.getpid()
        self.claimant = f"{self.pid}x{secrets.token_hex(4)}"
        # Held for the life of this process: the daemon tests it to find claims of dead trainers.
        # Locked before it gets its final name, so the daemon never sees it unlocked.
        path = layout.consumer_lock(self.claimant)
        tmp = layout.consumer_lock_temp(self.claimant)
        self._fd = create_exclusive(tmp)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._stats = ConsumerStats(self.pid)
        os.pwrite(self._fd, self._stats.encode(), 0)
        os.rename(tmp, path)
        self._path = path
        self._lock = threading.Lock()  # _stats and the file's record

    def foreign(self) -> bool:
        """Whether this is another process's (inherited by a fork)."""
        return os.getpid() != self.pid

    def after_fork(self) -> None:
        """In a forked child: the lock may be held by a parent thread that does not exist here."""
        self._lock = threading.Lock()

    def begin_wait(self) -> None:
        """One of the process's iterators starts waiting for a shard."""
        with self._lock:
            self._stats.begin(time.monotonic())  # the supervisor compares its own
            self._write()

    def end_wait(self, *, waiting: bool, claimed: int) -> None:
        """An iterator stopped waiting (``waiting``) and/or got ``claimed`` shards."""
        with self._lock:
            if waiting:
                self._stats.end(time.monotonic())
            self._stats.shards += claimed
            self._write()

    def note_resumed(self, where: str) -> None:
        """The process resumed from a saved position at ``where``: the daemon's status shows it."""
        with self._lock:
            self._stats.resumed = where
            self._write()

    def _write(self) -> None:
        """Publish the wait figures in the lock file, rewritten in place (fixed width, so a
        reader never sees a shorter record's leftovers)."""
        if self.foreign():
            return
        data = self._stats.encode()
        try:
            os.pwrite(self._fd, data, 0)
        except OSError as exc:  # statistics must never break the trainer
            log.debug("cannot write consumer stats: %s", exc)

    def remove(self) -> None:
        """At exit: the process's claims are settled; a forked child leaves its parent's file."""
        if not self.foreign():
            self._path.unlink(missing_ok=True)
