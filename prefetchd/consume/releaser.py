"""Release after reading: a claimed shard goes to ``done/`` once this process has read it.

The RAM of a claimed shard is given back without any acknowledgement from trainer code: a
background thread watches ``claimed/`` with inotify, and when a claim of ours is opened or
closed (by any process) it looks at this process's own file handles (``/proc/self/fd``): a
shard is finished once this process has held it open and holds it no more — never while
TensorFlow still reads it, and never because another process (a ``cat``, a backup, a virus
scanner) opened and closed it. A finished shard is moved to ``done/`` (``claims.retire``),
where the daemon notes it delivered and deletes it: deleting a shard frees its pages, which
costs the kernel ~0.2 CPU-s per GB, and the trainer's CPU is the one prefetchd exists to spare.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import ClassVar

from prefetchd.consume.claimant import ClaimantLock
from prefetchd.consume.claims import retire
from prefetchd.consume.reads import ClaimReads
from prefetchd.inotify import IN_CLOSE, IN_OPEN, Event, Watch
from prefetchd.layout import Layout

log = logging.getLogger(__name__)


class ShardReleaser:
    """Frees this process's claimed shards (``retire``) once this process has read them.

    Owns the inotify watch on ``claimed/`` with the thread that reads it, the scans of this
    process's open files, the retiring of read claims, and the process's ``ClaimantLock``
    (claimant tag, lock file, wait figures); which claims were read is its ``ClaimReads``'s
    (``consume/reads.py``). One per process and ``ram_dir``, shared by every ``ready_files()``
    iterator in it. A claim is UNREAD until a batch of inotify events touching it finds it among
    this process's open files (READING); it is retired at the first such batch that finds it
    closed again. The cost is one scan of ``/proc/self/fd`` per batch of events that touches a
    claim of ours (about two per shard), nothing per record. A claim that was opened and closed
    before any scan saw it open (a whole read faster than this thread wakes up, or another
    process's) is DOUBTFUL: kept, since retiring it could take it from under a trainer that has
    yet to open it, until a scan finds this process reading a claim it made later (trainers open
    their shards in the order they got them, so it was read), or an iterator of this process
    starts waiting for a shard or finds its epoch over (its trainer wants more), or the process
    exits. At most the newest claims wait so, and never while the trainer waits, so RAM cannot
    fill with read shards. A trainer that asks for more before opening a shard it got, which
    another process happened to open and close just then, could find it gone (its open fails
    loudly): the one window left, documented in docs/reliability.md.

    A releaser belongs to the process that made it. A forked child (a DataLoader worker)
    inherits its parent's releasers, perhaps with a lock held by a parent thread that does not
    exist in the child; code of the parent running on there (a leaked ``records()`` stream
    closed by the child's garbage collector) must neither wait for it for ever nor read the
    parent's watch or touch its claims: ``_detach_after_fork`` gives them fresh locks and no
    claims, and their watch and lock file are left alone (``_foreign``).

    Shards claimed by a process that died are returned to ``ready/`` by the daemon (at least
    once across trainer crashes): it finds them by their claimant's free lock file.
    """

    _instances: ClassVar[dict[Path, ShardReleaser]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()
    _every: ClassVar[weakref.WeakSet[ShardReleaser]] = weakref.WeakSet()

    @classmethod
    def for_layout(cls, layout: Layout) -> ShardReleaser:
        with cls._instances_lock:
            releaser = cls._instances.get(layout.ram_claimed)
            if releaser is None or releaser.pid != os.getpid() or releaser.stale():
                releaser = cls(layout)
                cls._instances[layout.ram_claimed] = releaser
            return releaser

    def __init__(self, layout: Layout) -> None:
        self.directory = layout.ram_claimed
        self.done = layout.ram_done
        self.inode = os.stat(self.directory).st_ino
        self._claimant_lock = ClaimantLock(layout)
        self.pid = self._claimant_lock.pid
        self.claimant = self._claimant_lock.claimant  # names this process's claims
        self.released = 0
        self._reads = ClaimReads()
        self._lock = threading.Lock()  # _reads, the watch
        self._watch = Watch(self.directory, IN_OPEN | IN_CLOSE)
        self._thread = threading.Thread(target=self._run, name="prefetchd-releaser", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)
        ShardReleaser._every.add(self)

    @classmethod
    def _detach_after_fork(cls) -> None:
        """In a forked child: every inherited releaser is the parent's (see the class)."""
        cls._instances_lock = threading.Lock()
        cls._instances.clear()
        for releaser in list(cls._every):
            releaser._lock = threading.Lock()
            releaser._claimant_lock.after_fork()
            releaser._reads.clear()

    def _foreign(self) -> bool:
        """Whether this releaser is another process's (inherited by a fork)."""
        return os.getpid() != self.pid

    def begin_wait(self, waiting: bool) -> bool:
        """One ``ready_files()`` iterator waits for a shard (called on every poll while it
        waits): its trainer asks for more, so a doubtful claim it does not hold now was read.
        Checked on every poll, not only when the wait starts: this thread may learn that the
        last claim was opened and closed (doubtful) only after the wait began, and keeping it
        could hold the RAM budget the writers need for the shard the trainer waits for."""
        if not waiting:
            self._claimant_lock.begin_wait()
        self.wants_more()
        return True

    def wants_more(self) -> None:
        """This process asked for another shard (it waits, or the epoch is over): the doubtful
        claims it does not hold now were read; free them."""
        with self._lock:
            if self._reads.has_doubtful():
                self._retire(self._reads.doubtful_not_held(self._held_now()))

    def end_wait(self, waiting: bool, *, claimed: int = 0) -> bool:
        """That iterator got a shard (``claimed``) or stopped waiting."""
        if waiting or claimed:
            self._claimant_lock.end_wait(waiting=waiting, claimed=claimed)
        return False

    def track(self, name: str, *, retain: bool = False) -> None:
        """Watch a claim; ``retain``: keep it once read (its stream frees it)."""
        if self._foreign():
            return
        with self._lock:
            self._reads.track(name, retain=retain)

    def finished(self, name: str) -> None:
        """This process's own code is done with the claim ``name`` (read to its end, or given
        up): free it now, without waiting for the open/close events to show it (``records()``
        says so when it closes a shard; a resumable stream's claim stays until a position
        covers it)."""
        with self._lock:
            self._retire(self._reads.finished(name))

    def note_resumed(self, where: str) -> None:
        """Publish where this process resumed from a saved position (``ClaimantLock``)."""
        if not self._foreign():
            self._claimant_lock.note_resumed(where)

    def retain(self, name: str) -> None:
        """Keep the claim ``name`` once read: its stream frees it."""
        with self._lock:
            self._reads.retain(name)

    def untrack(self, name: str) -> None:
        with self._lock:
            self._reads.untrack(name)

    def stale(self) -> bool:
        """Whether ``claimed/`` was replaced (a fresh job recreated the RAM disk), so this
        releaser's watch sees nothing any more; also true after a fork (another process)."""
        try:
            return os.stat(self.directory).st_ino != self.inode or os.getpid() != self.pid
        except FileNotFoundError:
            return True

    def pending(self) -> int:
        with self._lock:
            return len(self._reads)

    def flush(self) -> None:
        """Apply the events that already arrived (at exit, so finished shards are not left)."""
        if self._foreign():
            return  # the parent's watch: its events are the parent's to read
        with self._lock:
            if not self._watch.closed:
                self._apply(self._watch.read_now())

    def _at_exit(self) -> None:
        self.flush()
        with self._lock:  # nothing of this process can still open them
            self._retire(self._reads.doubtful_not_held(set()))
        self._claimant_lock.remove()

    def _run(self) -> None:
        while not self.stale():
            try:
                if self._watch.wait(1.0):
                    self.flush()
            except Exception:  # the trainer must never die of this thread; log and go on
                log.exception("shard releaser")
                time.sleep(1.0)
        with self._lock:
            self._watch.close()

    def _apply(self, events: list[Event]) -> None:
        """Update our claims that ``events`` touched from this process's open files (called
        with ``_lock`` held)."""
        if any(event.overflow for event in events):
            # Events were lost: trust /proc/self/fd for what is open right now.
            self._retire(self._reads.resync(self._held_now()))
            return
        reads = self._reads
        closed = {e.name for e in events if e.mask & IN_CLOSE and e.name in reads}
        touched = closed | {e.name for e in events if e.mask & IN_OPEN and e.name in reads}
        if not touched:
            return  # other processes' claims, or nothing of ours: no scan
        self._retire(reads.seen(touched, closed, self._held_now()))

    def _held_now(self) -> set[str]:
        """Names in ``claimed/`` this process has open right now (its own file handles)."""
        prefix = str(self.directory) + "/"
        held = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue  # closed meanwhile (the listing's own fd, too)
            if target.startswith(prefix):
                held.add(target[len(prefix) :])
        return held

    def _retire(self, names: list[str]) -> None:
        """Hand the claims found read to the daemon (``done/``)."""
        for name in names:
            self.released += 1
            retire(self.directory, self.done, name)


os.register_at_fork(after_in_child=ShardReleaser._detach_after_fork)
