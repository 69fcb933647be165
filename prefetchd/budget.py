"""Back-pressure: the byte budgets, as plain arithmetic plus the writers' shared RAM account.

- The download window: raw bytes on local disk (published + claimed + in flight) never exceed
  ``download.window``, except that one object larger than the whole window may be fetched
  alone (docs/reliability.md, invariant 3).
- The RAM budget: bytes under ``ram_dir`` never exceed ``output.ram_budget``. Writers reserve
  space in chunks before they write (``RamBudget``): under the budget lock a writer adds up
  the sizes of the files under ``ram_dir`` and, if ``chunk`` more fit, grows its file's size
  by ``chunk`` (``ftruncate``: a sparse reservation). Sizes, not allocated blocks, are the
  account every writer (and anyone running ``ls -l``) reads; what the files really occupy is
  never more. Allocating the reservation too (``posix_fallocate``) was ~18 % of a writer's
  samples on tmpfs, for pages the write allocates anyway; so a tmpfs that is itself full (smaller
  than the budget, or shared) is met at the write: ``disk_full`` waits for room there.
  A writer waiting for room sleeps on an inotify watch of the shard directories (a file
  deleted or moved out of one: a shard a trainer finished, deleted by the daemon; a shard
  published) and adds ``ram_dir`` up again when one fires, or every ``ROOM_RECHECK`` seconds
  for what no watch sees (a reservation shrunk in place, the epoch headroom, a stop request).
  It used to look every 20 ms: with the trainer the slow part (the case prefetchd is built
  for, when the budget stays full) that was ~50 walks of ``ram_dir`` a second, 17-19 ms of a
  writer's CPU per second spent waiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prefetchd.atomic import dir_bytes
from prefetchd.config import SMALL_FILES_RESERVE
from prefetchd.inotify import IN_DELETE, IN_MOVED_FROM, Watch
from prefetchd.layout import Layout

log = logging.getLogger(__name__)

RAM_CHUNK_MAX = 16 * 1024 * 1024
PAGE = 4096
ROOM_RECHECK = 0.2  # seconds a writer waiting for room goes at most without looking again
ROOM_POLL = 0.02  # seconds between looks where no watch could be made (inotify limits)
ROOM_FREED = IN_DELETE | IN_MOVED_FROM  # what may leave room in a shard directory


@contextlib.contextmanager
def budget_lock(fd: int) -> Iterator[None]:
    """Hold the RAM budget's lock (``layout.budget_lock``, open as ``fd``)."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def rename_under_budget_lock(layout: Layout, source: Path, target: Path) -> None:
    """``os.rename(source, target)`` for a shard moving backwards (claimed/ to ready/), under
    the budget lock: a writer adding up ``ram_dir`` meanwhile would miss it (ready/ is listed
    before claimed/) and reserve its bytes again. Without the lock file (no writer has run
    yet) the rename is made as it is. Raises what ``os.rename`` raises."""
    try:
        fd = os.open(layout.budget_lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        os.rename(source, target)
        return
    try:
        with budget_lock(fd):
            os.rename(source, target)
    finally:
        os.close(fd)


@dataclass
class Window:
    """The downloader's account of raw bytes, by local object name."""

    limit: int
    held: dict[str, int] = field(default_factory=dict)
    used: int = 0

    def fits(self, size: int, name: str | None = None) -> bool:
        """Whether ``size`` more bytes fit; a reservation ``name`` already holds counts as free
        (an object fetched again keeps its room, perhaps at a new size)."""
        used = self.used - self.held.get(name, 0) if name is not None else self.used
        return used + size <= self.limit or used == 0

    def reserve(self, name: str, size: int) -> None:
        held = self.held
        self.used += size - held.pop(name, 0)  # release()'s, inline: a call per object less
        held[name] = size

    def release(self, name: str) -> None:
        self.used -= self.held.pop(name, 0)

    def release_all(self, names: Iterable[str]) -> None:
        """``release`` of each of ``names``, in one call (a batch of the writers' deletions)."""
        held, used = self.held, self.used
        for name in names:  # a loop, not sum() of a generator: that is a call per name
            used -= held.pop(name, 0)
        self.used = used

    def reset(self, held: dict[str, int]) -> None:
        self.held = dict(held)
        self.used = sum(held.values())


def ram_chunk(shard_size: int) -> int:
    """How much a writer reserves at a time: small enough that reservations track real use,
    large enough that the lock and the walk of ``ram_dir`` are not paid every few records
    (at 4 MiB they took a fifth of a writer's time on 1 MiB records)."""
    return max(64 * 1024, min(shard_size, RAM_CHUNK_MAX))


def ram_fits(used: int, request: int, budget: int) -> bool:
    return used + request <= budget


def split_ranges(size: int, part_size: int) -> list[tuple[int, int]]:
    """Inclusive byte ranges covering ``size`` bytes in parts of ``part_size`` (HTTP Range)."""
    if size <= 0:
        return []
    return [(start, min(start + part_size, size) - 1) for start in range(0, size, part_size)]


class Interrupted(Exception):
    """The process was asked to stop while waiting for room on the RAM disk."""


class RamBudget:
    """The writers' shared RAM account. ``headroom()`` is how much of the budget this writer
    must leave free right now (see ``Writer._headroom``); ``should_stop()`` is called while
    waiting and says whether to give up. Owns the lock file's descriptor and, once this writer
    first waits for room, the watch it waits on (closed with the budget)."""

    def __init__(
        self,
        layout: Layout,
        budget: int,
        chunk: int,
        should_stop: Callable[[], bool],
        headroom: Callable[[], int] = lambda: 0,
    ):
        self.layout = layout
        self.budget = budget
        self.chunk = chunk
        self.should_stop = should_stop
        self.headroom = headroom
        self.waited = 0.0  # seconds spent blocked on the budget (writer-side back-pressure)
        self.full_disk_waits = 0
        lock_fd = os.open(layout.budget_lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self._lock_fd = lock_fd
        self._room: Watch | None = None  # made at the first wait for room
        self._room_unwatchable = False  # no watch could be made: poll every ROOM_POLL
        self.room_looks = 0  # walks of ram_dir made while waiting (for the cost tests)

    def used(self) -> int:
        lay = self.layout
        # consumers/ and ram_dir's own files too (owner, locks): the promise is about every
        # byte under ram_dir. Renames between the shard directories go forwards (.tmp, ready,
        # claimed, done: the order they are listed in, so a file moved meanwhile is counted
        # twice, never missed) except a claim given back to ready/, which is made under this
        # lock (``budget_lock``).
        return dir_bytes(lay.ram, *lay.ram_shard_dirs, lay.ram_consumers)

    def extend(self, fd: int, reserved: int, need: int) -> int:
        """Grow the reservation of ``fd`` from ``reserved`` to at least ``need``; blocks until the
        budget has room. Returns the new reservation. A whole number of chunks when they fit,
        else just ``need`` (in pages): a writer finishing a large record may need the last
        bytes of its share, which ``config.record_size_limit`` counts on."""
        grow = -(-(need - reserved) // self.chunk) * self.chunk
        exact = -(-(need - reserved) // PAGE) * PAGE
        started = time.monotonic()
        try:
            while True:
                for size in (grow, exact) if exact < grow else (grow,):
                    if self._try(fd, reserved, size):
                        return reserved + size
                if self.should_stop():
                    raise Interrupted
                self._wait_for_room()
                self.room_looks += 1
        finally:
            self.waited += time.monotonic() - started

    def _wait_for_room(self) -> None:
        """Return when room may have been freed under ``ram_dir``: a file deleted or moved out
        of a shard directory, or ``ROOM_RECHECK`` seconds passed. The first call arms the watch
        and returns at once, so a shard that left before it existed is not waited for."""
        if self._room is None and not self._room_unwatchable:
            try:
                self._room = self._watch_shard_dirs()
            except OSError as exc:  # inotify's instance or watch limit reached
                log.warning("cannot watch %s for room (%s); polling", self.layout.ram, exc)
                self._room_unwatchable = True
            return
        if self._room is None:
            time.sleep(ROOM_POLL)
            return
        self._room.read(ROOM_RECHECK)  # the events only wake us: the walk is the account

    def _watch_shard_dirs(self) -> Watch:
        first, *others = self.layout.ram_shard_dirs
        watch = Watch(first, ROOM_FREED)
        weakref.finalize(self, watch.close)
        try:
            for directory in others:
                watch.add(directory, ROOM_FREED)
        except OSError:
            watch.close()
            raise
        return watch

    def _try(self, fd: int, reserved: int, grow: int) -> bool:
        with budget_lock(self._lock_fd):
            limit = self.budget - SMALL_FILES_RESERVE - self.headroom()
            if not ram_fits(self.used(), grow, limit):
                return False
            os.ftruncate(fd, reserved + grow)  # the account is the size: nothing is allocated
            return True

    def disk_full(self) -> None:
        """A write within the reservation found the RAM disk itself full (ENOSPC): wait a
        moment for trainers to free room, counted like a wait for the budget; the caller
        writes again. Logged on the 1st, 100th and every 1000th time. Raises ``Interrupted``
        when the process is asked to stop."""
        self.full_disk_waits += 1
        if self.full_disk_waits in (1, 100) or self.full_disk_waits % 1000 == 0:
            log.warning("the RAM disk %s is full; waiting for room", self.layout.ram)
        if self.should_stop():
            raise Interrupted
        time.sleep(0.02)
        self.waited += 0.02
