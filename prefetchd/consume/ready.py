"""The trainer side: ``ready_files()`` claims finished shards and frees them once read.

A claim is an atomic rename of ``ready/<shard>`` to ``claimed/<owner>-<shard>``, so several
trainer processes on one host get disjoint shards. The RAM of a claimed shard is given back
without any acknowledgement from trainer code: a background thread watches ``claimed/`` with
inotify, and when a claim of ours is opened or closed (by any process) it looks at this
process's own file handles (``/proc/self/fd``): a shard is finished once this process has held
it open and holds it no more — never while TensorFlow still reads it, and never because another
process (a ``cat``, a backup, a virus scanner) opened and closed it. A finished shard is moved
to ``done/`` (``retire``), where the daemon notes it delivered and deletes it: deleting a shard
frees its pages, which costs the kernel ~0.2 CPU-s per GB, and the trainer's CPU is the one
prefetchd exists to spare. Shards claimed by a process that died are returned to ``ready/`` by
the daemon (at-least-once across trainer crashes).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import json
import logging
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from prefetchd.atomic import create_exclusive, dir_bytes, holds_lock
from prefetchd.config import Config, load_config
from prefetchd.consume.access import check_trainer_access
from prefetchd.consume.report import RECORD_SIZE, ConsumerReport
from prefetchd.errors import DaemonFailed
from prefetchd.inotify import IN_CLOSE, IN_MOVED_TO, IN_OPEN, Event, Watch
from prefetchd.layout import Layout, claim_name, epoch_prefix, parse_claim_name, parse_shard_name
from prefetchd.supervise.states import DaemonState
from prefetchd.supervise.status_record import StatusRecord

log = logging.getLogger(__name__)

DEFAULT_GRACE = 60.0
_POLL = 0.2


def ready_files(
    config: str | os.PathLike[str] | Config,
    *,
    epoch: int | None = None,
    timeout: float | None = None,
    grace: float = DEFAULT_GRACE,
    position: Mapping[str, Any] | None = None,
) -> ReadyFiles:
    """Yield paths of complete TFRecord shards, each to exactly one caller on this host.

    With ``epoch=k`` only epoch k's shards are yielded and the iterator returns at that epoch's
    end; without it, all epochs in order, returning after the last. Raises ``DaemonFailed`` if
    the daemon reports ``failed`` or has been gone longer than ``grace`` seconds, and
    ``TimeoutError`` after ``timeout`` seconds without a new shard.

    ``position`` makes the stream resumable: pass a position saved from ``.position()`` (or
    ``{}`` to start one) and delivery is exactly once relative to it (see ``ReadyFiles``);
    without one, a trainer that dies gets at-least-once (its unread claims go to others).
    """
    cfg = config if isinstance(config, Config) else load_config(config, trainer=True)
    count = cfg.epochs.count
    if epoch is not None and (epoch < 0 or (count is not None and epoch >= count)):
        raise ValueError(f"epoch {epoch} is not one of this job's epochs (epochs.count={count})")
    saved = parse_position(position) if position is not None else None
    check_trainer_access(Layout.of(cfg))
    return ReadyFiles(cfg, epoch=epoch, timeout=timeout, grace=grace, saved=saved)


POSITION_VERSION = 1


@dataclass(frozen=True)
class Position:
    """Where a resumable stream stands: ``epoch`` is the first epoch it may still have to
    deliver, ``consumed`` the shards yielded since the position before this one (older ones are
    deleted from the RAM disk, so they can never come back)."""

    epoch: int
    consumed: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        return {"version": POSITION_VERSION, "epoch": self.epoch, "consumed": sorted(self.consumed)}


def parse_position(raw: Mapping[str, Any]) -> Position:
    """A saved position (``{}`` = the start); raises ``ValueError`` naming what is wrong."""
    if not raw:
        return Position(0, frozenset())
    if raw.get("version") != POSITION_VERSION:
        raise ValueError(f"position: version {raw.get('version')!r}, expected {POSITION_VERSION}")
    epoch, consumed = raw.get("epoch"), raw.get("consumed")
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"position: epoch {epoch!r} is not a non-negative integer")
    if not isinstance(consumed, list) or not all(
        isinstance(n, str) and parse_shard_name(n) is not None for n in consumed
    ):
        raise ValueError("position: consumed must be a list of shard names")
    return Position(epoch, frozenset(consumed))


class ReadyFiles(Iterator[str]):
    """The iterator ``ready_files()`` returns.

    Resumable streams (created with a ``position``) keep the shards they yielded on the RAM disk
    until they are covered by a position the trainer has certainly saved: ``position()`` frees
    the shards covered by the previous call (the trainer saved that one before asking for the
    next) and returns one that covers every path yielded so far. Call it when you have finished
    the records of the paths you got, and save what it returns with your checkpoint. After a
    crash the daemon returns the retained shards to ``ready/``; a stream resumed from the saved
    position skips the ones it covers and delivers the rest: exactly once relative to it.
    """

    def __init__(
        self,
        config: Config,
        *,
        epoch: int | None,
        timeout: float | None,
        grace: float,
        saved: Position | None,
    ) -> None:
        count = config.epochs.count
        first = saved.epoch if saved is not None else 0
        self._epochs: Iterable[int] = (
            ([epoch] if first <= epoch else [])
            if epoch is not None
            else (range(first, count) if count else itertools.count(first))
        )
        self._layout = Layout.of(config)
        self._timeout = timeout
        self._health = _DaemonHealth(self._layout, grace)
        self._resumable = saved is not None
        self._skip = set(saved.consumed) if saved is not None else set()
        self._epoch = first
        self._covered: list[str] = []  # claimed names covered by the last position()
        self._since: list[str] = []  # claimed names yielded since the last position()
        self.keep_at_end = False  # True: the shards stay until release() (read-ahead callers)
        self._lock = threading.Lock()  # _covered and _since, for a position() from another thread
        self._stream = self._run()

    def __next__(self) -> str:
        return next(self._stream)

    def position(self, *, finished: int | None = None, unfinished: int = 0) -> dict[str, Any]:
        """A small JSON-able state to save with the trainer's checkpoint (resumable streams).

        ``finished``: cover only the first that many paths yielded since the last position();
        ``unfinished``: the last that many paths yielded are still being read (``records()``
        uses it mid-shard). Paths not covered come again after a crash, stay on the RAM disk
        until a later position covers them. May be called from another thread than the one
        iterating.
        """
        if not self._resumable:
            raise ValueError("position() needs a resumable stream: ready_files(..., position={})")
        with self._lock:
            if finished is None:
                finished = len(self._since) - max(unfinished, 0)
            return self._position(finished)

    def _position(self, finished: int) -> dict[str, Any]:
        self._free(self._covered)
        cut = max(0, min(finished, len(self._since)))
        self._covered, self._since = self._since[:cut], self._since[cut:]
        # Shards the saved position covered that have not come back yet (their dead owner's
        # claims are returned about once a second) stay covered by this one too.
        covered = [claim[1] for claim in map(parse_claim_name, self._covered) if claim]
        consumed = covered + sorted(self._skip)
        # A retained shard of an earlier epoch may come back after a crash: resume from there.
        reading = [claim[1] for claim in map(parse_claim_name, self._since) if claim]
        epochs = [p[0] for p in map(parse_shard_name, consumed + reading) if p is not None]
        return Position(min([self._epoch, *epochs]), frozenset(consumed)).to_json()

    def _free(self, claimed: list[str]) -> None:
        for name in claimed:
            self._releaser.untrack(name)
            retire(self._layout.ram_claimed, self._layout.ram_done, name)

    def _run(self) -> Iterator[str]:
        layout, health = self._layout, self._health
        _wait_for_dirs(layout, health)
        self._releaser = releaser = ShardReleaser.for_layout(layout)
        last_shard = time.monotonic()
        # The time between asking for a shard and getting one (or the epoch's end) is the
        # trainer waiting on data; the daemon reads it from our lock file (`consumer_wait_s`).
        waiting = False
        try:
            with Watch(layout.ram_ready, IN_MOVED_TO) as arrivals:
                _watch_epoch_ends(arrivals, layout)
                for k in self._epochs:
                    self._epoch = k
                    prefix = epoch_prefix(k)
                    while True:
                        claimed = self._claim(prefix)
                        if claimed is not None:
                            last_shard = time.monotonic()
                            waiting = releaser.end_wait(waiting, claimed=1)
                            if self._resumable:
                                with self._lock:
                                    self._since.append(claimed)
                            yield str(layout.ram_claimed / claimed)
                            continue
                        if self._epoch_over(k, prefix, releaser.owner):
                            # an epoch a failed daemon left short is not over: it says why
                            health.check_failed()
                            releaser.wants_more()
                            # nothing of epoch k can come back now: forget its covered shards
                            self._skip = {n for n in self._skip if not n.startswith(prefix)}
                            break
                        waiting = releaser.begin_wait(waiting)
                        health.check()
                        if (
                            self._timeout is not None
                            and time.monotonic() - last_shard > self._timeout
                        ):
                            raise TimeoutError(
                                f"no new shard of epoch {k} for {self._timeout:g} s"
                                + self._retention_hint()
                            )
                        arrivals.read(_POLL)
        finally:
            releaser.end_wait(waiting)
        # Exhausted: every shard was consumed, none needs to be kept for a restart (unless the
        # caller still reads them: then it calls release() once they are finished).
        if not self.keep_at_end:
            self.release()

    def give_back(self) -> None:
        """Return the shards yielded since the last ``position()`` to ``ready/`` unread, for
        another stream (this one was abandoned before they were finished)."""
        with self._lock:
            since, self._since = self._since, []
        for claimed in since:
            self._releaser.untrack(claimed)
            shard = parse_claim_name(claimed)
            with contextlib.suppress(FileNotFoundError):
                if shard is not None:
                    os.rename(self._layout.ram_claimed / claimed, self._layout.ram_ready / shard[1])

    def release(self) -> None:
        """Free every shard this stream still keeps: all of them are finished."""
        with self._lock:
            kept, self._covered, self._since = self._covered + self._since, [], []
        self._free(kept)

    def _retention_hint(self) -> str:
        """Why a resumable stream may starve: the shards it keeps fill the RAM budget."""
        kept = self._covered + self._since
        if not kept:
            return ""
        size = dir_bytes(self._layout.ram_claimed) if kept else 0
        return (
            f"; this resumable stream keeps {len(kept)} read shards on the RAM disk until "
            f"position() is called again ({size} bytes claimed in total): call position() at "
            "every checkpoint, or raise output.ram_budget"
        )

    def _claim(self, prefix: str) -> str | None:
        """Claim the next shard; one the saved position covers is claimed and deleted."""
        releaser = self._releaser
        for name in _ready_names(self._layout, prefix):
            claimed = claim_name(releaser.owner, name)
            releaser.track(claimed, retain=self._resumable)
            try:
                os.rename(self._layout.ram_ready / name, self._layout.ram_claimed / claimed)
            except FileNotFoundError:
                releaser.untrack(claimed)
                continue  # another trainer process claimed it first
            if name in self._skip:
                self._skip.discard(name)
                self._free([claimed])  # consumed before the saved position
                continue
            return claimed
        return None

    def _epoch_over(self, epoch: int, prefix: str, owner: str) -> bool:
        """Epoch k is over once it is complete, nothing of it is ready, and no claim of a dead
        trainer is waiting to be returned to ready/ (the daemon does that about once a second)."""
        layout = self._layout
        if not layout.complete_marker(epoch).exists() or _ready_names(layout, prefix):
            return False
        return not _orphaned_claims(layout, prefix, owner)


def retire(claimed: Path, done: Path, name: str) -> None:
    """Hand the finished claim ``name`` to the daemon: move it from ``claimed`` to ``done``,
    where the daemon notes it delivered and deletes it. A rename costs the trainer a few
    microseconds where the deletion costs it the freeing of every page of the shard. Without
    ``done/`` (the RAM disk of an older release) the shard is deleted here."""
    try:
        os.rename(claimed / name, done / name)
    except FileNotFoundError:
        if not done.is_dir():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(claimed / name)


def _ready_names(layout: Layout, prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(layout.ram_ready) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def _orphaned_claims(layout: Layout, prefix: str, own: str) -> bool:
    try:
        names = os.listdir(layout.ram_claimed)
    except FileNotFoundError:
        return False
    for name in names:
        parsed = parse_claim_name(name)
        if parsed is None or parsed[0] == own or not parsed[1].startswith(prefix):
            continue
        if not holds_lock(layout.consumer_lock(parsed[0])):
            return True
    return False


def _watch_epoch_ends(arrivals: Watch, layout: Layout) -> None:
    """Wake a waiting trainer on an epoch's ``complete`` marker too (published by rename), not
    only on a new shard, so it sees the epoch's end at once rather than at its next poll (the
    last ``_POLL`` of every epoch, and of a whole job of one epoch). Where the state dir cannot
    be watched (not readable by this user) the poll still finds the marker."""
    with contextlib.suppress(OSError):
        arrivals.add(layout.epochs, IN_MOVED_TO)


def _wait_for_dirs(layout: Layout, health: _DaemonHealth) -> None:
    check_trainer_access(layout)  # a daemon of another user: one line, not a PermissionError
    while not all(d.is_dir() for d in (layout.ram_ready, layout.ram_claimed, layout.ram_consumers)):
        health.check()
        time.sleep(_POLL)
        check_trainer_access(layout)


class _DaemonHealth:
    """Raises once the daemon failed or has shown no sign of life for ``grace`` seconds.

    A sign of life is a status record newer than the last one seen; silence is measured on
    this process's monotonic clock, so a step of the wall clock (NTP) neither expires the grace
    nor stretches it. ``monotonic`` is injectable for tests."""

    def __init__(
        self, layout: Layout, grace: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.layout = layout
        self.grace = grace
        self.monotonic = monotonic
        self.started = monotonic()
        self.alive_at = self.started  # when a new status record was last seen
        self.last_seen: tuple[float, float] | None = None

    def _status(self) -> StatusRecord | None:
        try:
            return StatusRecord.from_json(
                json.loads(self.layout.status_file.read_text(encoding="utf-8"))
            )
        except (OSError, ValueError):
            return None

    def check_failed(self) -> None:
        """Raise if the daemon reports ``failed`` (e.g. it found published shards lost)."""
        status = self._status()
        if status is not None and status.state == DaemonState.FAILED:
            raise DaemonFailed(f"prefetchd failed: {status.reason or 'see its log'}")

    def check(self) -> None:
        status = self._status()
        now = self.monotonic()
        if status is None:
            if now - self.started > self.grace:
                raise DaemonFailed(
                    f"prefetchd is not running for {self.layout.state} "
                    f"(no status after {self.grace:g} s)"
                )
            return
        if status.state == DaemonState.FAILED:
            raise DaemonFailed(f"prefetchd failed: {status.reason or 'see its log'}")
        updated = status.updated
        if (updated, status.updated_monotonic) != self.last_seen:
            self.last_seen = (updated, status.updated_monotonic)
            if self.last_seen != (0.0, 0.0) and status.age() < self.grace:
                self.alive_at = now
        if now - self.alive_at > self.grace:
            raise DaemonFailed(
                f"prefetchd has been gone for more than {self.grace:g} s "
                f"(last status update {time.ctime(updated)})"
            )


class ConsumerStats:
    """How long one trainer process waited for shards, as read by the daemon's status.

    Stored in ``consumers/<owner>.lock`` as a ``ConsumerReport`` (``consume/report.py``).
    ``wait_s`` counts finished waits; ``waiting_since`` (time.monotonic(), a system-wide clock,
    so the supervisor compares it with its own) is set while at least
    one of the process's ``ready_files()`` iterators is waiting, so a reader adds the wait still
    in progress.
    """

    RECORD_SIZE = RECORD_SIZE  # the report's fixed size, as callers of ConsumerStats know it

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.wait_s = 0.0
        self.waiters = 0
        self.waiting_since: float | None = None
        self.shards = 0

    def begin(self, now: float) -> None:
        if self.waiters == 0:
            self.waiting_since = now
        self.waiters += 1

    def end(self, now: float) -> None:
        self.waiters = max(0, self.waiters - 1)
        if self.waiters == 0 and self.waiting_since is not None:
            self.wait_s += max(0.0, now - self.waiting_since)
            self.waiting_since = None

    def encode(self) -> bytes:
        since = self.waiting_since
        # Readers from before ``waiting_since_monotonic`` read ``waiting_since`` as epoch seconds.
        wall = None if since is None else round(since + time.time() - time.monotonic(), 3)
        report = ConsumerReport(
            self.pid, round(self.wait_s, 3), wall, self.shards, waiting_since_monotonic=since
        )
        return report.encode()


_UNREAD, _READING, _DOUBTFUL = -1, 1, 0  # states of a tracked claim (see ShardReleaser)


class ShardReleaser:
    """Frees this process's claimed shards (``retire``) once this process has read them.

    One per process and ``ram_dir``, shared by every ``ready_files()`` iterator in it. A claim
    is ``_UNREAD`` until a batch of inotify events touching it finds it among this process's
    open files (``_READING``); it is retired at the first such batch that finds it closed
    again. The cost is one scan of ``/proc/self/fd`` per batch of events that touches a claim
    of ours (about two per shard), nothing per record. A claim that was opened and closed
    before any scan saw it open (a whole read faster than this thread wakes up, or another
    process's) is ``_DOUBTFUL``: kept, since retiring it could take it from under a trainer
    that has yet to open it, until a scan finds this process reading a claim it made later
    (trainers open their shards in the order they got them, so it was read), or an iterator of
    this process starts waiting for a shard or finds its epoch over (its trainer wants more),
    or the process exits. At
    most the newest claims wait so, and never while the trainer waits, so RAM cannot fill
    with read shards. A trainer that asks for more before opening a shard it got, which
    another process happened to open and close just then, could find it gone (its open
    fails loudly): the one window left, documented in docs/reliability.md.

    A releaser belongs to the process that made it. A forked child (a DataLoader worker)
    inherits its parent's releasers, perhaps with a lock held by a parent thread that does not
    exist in the child; code of the parent running on there (a leaked ``records()`` stream
    closed by the child's garbage collector) must neither wait for it for ever nor read the
    parent's watch or touch its claims: ``_detach_after_fork`` gives them fresh locks and no
    claims, and their watch and lock file are left alone (``_foreign``).
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
        self.pid = os.getpid()
        self.owner = f"{self.pid}x{secrets.token_hex(4)}"
        # Held for the life of this process: the daemon tests it to find claims of dead trainers.
        # Locked before it gets its final name, so the daemon never sees it unlocked.
        lock = layout.consumer_lock(self.owner)
        tmp = layout.consumer_lock_temp(self.owner)
        self._alive_fd = create_exclusive(tmp)
        fcntl.flock(self._alive_fd, fcntl.LOCK_EX)
        self._stats = ConsumerStats(self.pid)
        os.pwrite(self._alive_fd, self._stats.encode(), 0)
        os.rename(tmp, lock)
        self._alive_lock = lock
        self.released = 0
        self._opens: dict[str, int] = {}  # claimed name -> _UNREAD | _READING | _DOUBTFUL
        self._order: dict[str, int] = {}  # claimed name -> how many claims came before it
        self._claims = itertools.count()
        self._retained: set[str] = set()  # claims of resumable streams: never deleted here
        self._lock = threading.Lock()
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
            releaser._opens.clear()
            releaser._order.clear()
            releaser._retained.clear()

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
            with self._lock:
                self._stats.begin(time.monotonic())  # the supervisor compares its own
                self._write_stats()
        self.wants_more()
        return True

    def wants_more(self) -> None:
        """This process asked for another shard (it waits, or the epoch is over): the doubtful
        claims it does not hold now were read; free them."""
        with self._lock:
            if _DOUBTFUL not in self._opens.values():
                return
            held = self._held_now()
            for name, state in list(self._opens.items()):
                if state == _DOUBTFUL and name not in held:
                    self._release(name)

    def end_wait(self, waiting: bool, *, claimed: int = 0) -> bool:
        """That iterator got a shard (``claimed``) or stopped waiting."""
        if waiting or claimed:
            with self._lock:
                if waiting:
                    self._stats.end(time.monotonic())
                self._stats.shards += claimed
                self._write_stats()
        return False

    def _write_stats(self) -> None:
        """Publish the wait figures in our lock file, rewritten in place (fixed width, so a
        reader never sees a shorter record's leftovers)."""
        if self._foreign():
            return
        data = self._stats.encode()
        try:
            os.pwrite(self._alive_fd, data, 0)
        except OSError as exc:  # statistics must never break the trainer
            log.debug("cannot write consumer stats: %s", exc)

    def track(self, name: str, *, retain: bool = False) -> None:
        """Watch a claim; ``retain``: keep it once read (its stream frees it)."""
        if self._foreign():
            return
        with self._lock:
            self._opens[name] = _UNREAD
            self._order[name] = next(self._claims)
            if retain:
                self._retained.add(name)

    def finished(self, name: str) -> None:
        """This process's own code is done with the claim ``name`` (read to its end, or given
        up): free it now, without waiting for the open/close events to show it (``records()``
        says so when it closes a shard; a resumable stream's claim stays until a position
        covers it)."""
        with self._lock:
            if name in self._opens:
                self._release(name)

    def untrack(self, name: str) -> None:
        with self._lock:
            self._opens.pop(name, None)
            self._order.pop(name, None)
            self._retained.discard(name)

    def stale(self) -> bool:
        """Whether ``claimed/`` was replaced (a fresh job recreated the RAM disk), so this
        releaser's watch sees nothing any more; also true after a fork (another process)."""
        try:
            return os.stat(self.directory).st_ino != self.inode or os.getpid() != self.pid
        except FileNotFoundError:
            return True

    def pending(self) -> int:
        with self._lock:
            return len(self._opens)

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
            for name, state in list(self._opens.items()):
                if state == _DOUBTFUL:
                    self._release(name)
        if os.getpid() == self.pid:
            self._alive_lock.unlink(missing_ok=True)

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
            self._resync()
            return
        closed = {e.name for e in events if e.mask & IN_CLOSE and e.name in self._opens}
        touched = closed | {e.name for e in events if e.mask & IN_OPEN and e.name in self._opens}
        if not touched:
            return  # other processes' claims, or nothing of ours: no scan
        held = self._held_now()
        for name in touched:
            state = self._opens[name]
            if name in held:
                self._opens[name] = _READING
            elif state == _READING:
                self._release(name)  # we held it and hold it no more: read
            elif name in closed:
                self._opens[name] = _DOUBTFUL
        self._settle_doubtful(held)

    def _settle_doubtful(self, held: set[str]) -> None:
        """Release the doubtful claims older than the newest claim this process reads now."""
        newest = max((self._order.get(n, -1) for n in held), default=-1)
        for name, state in list(self._opens.items()):
            if state == _DOUBTFUL and self._order.get(name, newest) < newest:
                self._release(name)

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

    def _release(self, name: str) -> None:
        del self._opens[name]
        self._order.pop(name, None)
        if name in self._retained:
            return  # read, but kept until a saved position covers it
        self.released += 1
        retire(self.directory, self.done, name)

    def _resync(self) -> None:
        """After an event-queue overflow: trust /proc/self/fd for what is open right now. A
        claim opened and closed entirely within the lost events stays unread: kept, and given
        back to ``ready/`` when this process ends (at least once, never lost)."""
        held = self._held_now()
        for name, state in list(self._opens.items()):
            if name in held:
                self._opens[name] = _READING
            elif state == _READING:
                self._release(name)
        self._settle_doubtful(held)


os.register_at_fork(after_in_child=ShardReleaser._detach_after_fork)
