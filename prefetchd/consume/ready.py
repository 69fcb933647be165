"""The trainer side: ``ready_files()`` claims finished shards and frees them once read.

A claim is an atomic rename of ``ready/<shard>`` to ``claimed/<claimant>-<shard>``
(``consume/claims.py``), so several trainer processes on one host get disjoint shards. The
stream is built from the process's ``ShardReleaser`` (a shard read is handed to ``done/``,
``consume/releaser.py``), the daemon's health (``consume/health.py``) and, for a resumable
stream, its position (``consume/stream_position.py``). Shards claimed by a process that died
are returned to ``ready/`` by the daemon (at-least-once across trainer crashes).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prefetchd.config import Config, load_config
from prefetchd.consume.access import check_trainer_access
from prefetchd.consume.claims import epoch_over, ready_names
from prefetchd.consume.health import DaemonHealth, wait_for_dirs
from prefetchd.consume.job_guard import JobGuard
from prefetchd.consume.position_format import job_for
from prefetchd.consume.releaser import ShardReleaser
from prefetchd.consume.stream_position import Position, StreamPosition, parse_position
from prefetchd.consume.take_back import reclaim
from prefetchd.fence import read_fence
from prefetchd.inotify import IN_MOVED_TO, Watch
from prefetchd.layout import (
    Layout,
    claim_name,
    epoch_prefix,
    parse_claim_name,
)

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
    job = job_for(cfg)  # once per stream: with sharding.resume_from it reads positions
    saved = parse_position(position, job) if position is not None else None
    check_trainer_access(Layout.of(cfg))
    return ReadyFiles(cfg, epoch=epoch, timeout=timeout, grace=grace, saved=saved, job=job)


class ReadyFiles(Iterator[str]):
    """The iterator ``ready_files()`` returns: the claim stream, epoch after epoch.

    Owns the claim loop: which epochs it reads, claiming the next shard, waiting for one (the
    wait the daemon reports, the timeout, the daemon's health) and each epoch's end. What a
    resumable stream keeps is its ``StreamPosition``'s.

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
        job: Mapping[str, Any],
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
        self._health = DaemonHealth(self._layout, grace)
        self._kept = StreamPosition(self._layout, saved, job)
        self.keep_at_end = False  # True: the shards stay until release() (read-ahead callers)
        self.ended = False  # every epoch it was asked for was delivered
        if saved is not None and saved.claimant is not None and self._layout.ram_claimed.is_dir():
            fence = read_fence(self._layout.job_fence)
            if fence is not None:  # ram_dir holds that job's shards: not the position's?
                self._kept.check_job(fence.job)
            # now, not at the first next(): before any other stream of the job claims a shard
            reclaim(self._kept, ShardReleaser.for_layout(self._layout))
        self._stream = self._run()

    def __next__(self) -> str:
        return next(self._stream)

    def position(
        self,
        *,
        finished: int | None = None,
        unfinished: int = 0,
        records: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """A small JSON-able state to save with the trainer's checkpoint (resumable streams).

        ``finished``: cover only the first that many paths yielded since the last position();
        ``unfinished``: the last that many paths yielded are still being read (``records()``
        uses it mid-shard). Paths not covered come again after a crash, stay on the RAM disk
        until a later position covers them. May be called from another thread than the one
        iterating.
        """
        return self._kept.position(finished, unfinished, records)

    def snapshot(
        self, *, unfinished: int = 0, records: Mapping[str, int] | None = None
    ) -> dict[str, Any]:
        """A position covering what was yielded but the last ``unfinished`` paths, freeing
        nothing (see ``StreamPosition.snapshot``); ``records``: those trained of the shards
        in progress."""
        return self._kept.snapshot(unfinished, records or {})

    def trained_before(self, path: str) -> int:
        """How many records of the shard at ``path`` the saved position had trained (skip
        them); asked once per shard."""
        shard = parse_claim_name(os.path.basename(path))
        return self._kept.resume_records.pop(shard[1], 0) if shard else 0

    def start_keeping(self, reading: str | None) -> None:
        """Make a stream made without a position resumable from now on (``StreamPosition``);
        ``reading``: the path of the shard being read, kept too."""
        self._kept.start_keeping(os.path.basename(reading) if reading else None)
        self.keep_at_end = True

    def kept_claims(self) -> list[str]:
        """The claims this stream keeps on the RAM disk (yielded, not freed)."""
        return self._kept.kept_claims()

    def hand_off(self, holder: str) -> None:
        """Keep what this stream holds under ``holder``'s claimant (``StreamPosition``)."""
        self._kept.hand_off(holder)

    def give_back(self) -> None:
        """Return the shards yielded since the last ``position()`` to ``ready/`` unread, for
        another stream (this one was abandoned before they were finished)."""
        self._kept.give_back()

    def release(self) -> None:
        """Free every shard this stream still keeps: all of them are finished."""
        self._kept.release()

    def _run(self) -> Iterator[str]:
        layout, health, kept = self._layout, self._health, self._kept
        wait_for_dirs(layout, health, _POLL)
        self._releaser = kept.releaser = releaser = ShardReleaser.for_layout(layout)
        guard = JobGuard(layout)
        last_shard = time.monotonic()
        # The time between asking for a shard and getting one (or the epoch's end) is the
        # trainer waiting on data; the daemon reads it from our lock file (`consumer_wait_s`).
        waiting = False
        try:
            with Watch(layout.ram_ready, IN_MOVED_TO) as arrivals:
                _watch_epoch_ends(arrivals, layout)
                last: int | None = None
                adopted: str | None = None  # the job the position names (JobGuard's)
                for k in self._epochs:
                    kept.epoch = last = k
                    prefix = epoch_prefix(k)
                    while True:
                        # only the fenced job's shards and markers count (consume/job_guard.py)
                        fenced = guard.may_claim()
                        if fenced and guard.job is not None and guard.job != adopted:
                            kept.adopt_job(guard.job)  # a position of another job raises
                            adopted = guard.job
                        taken = _take_prefixed(kept.reclaimed, prefix) if fenced else []
                        for name in taken:  # the saved position's shards in progress, first
                            kept.yielded(name)
                            yield str(layout.ram_claimed / name)
                        if taken:
                            last_shard = time.monotonic()
                            continue
                        claimed = self._claim(prefix) if fenced else None
                        if claimed is not None:
                            last_shard = time.monotonic()
                            waiting = releaser.end_wait(waiting, claimed=1)
                            kept.yielded(claimed)
                            yield str(layout.ram_claimed / claimed)
                            continue
                        if fenced and epoch_over(layout, k, prefix, releaser.claimant):
                            # an epoch a failed daemon left short is not over: it says why
                            health.check_failed()
                            releaser.wants_more()
                            kept.epoch_ended(prefix)
                            break
                        waiting = releaser.begin_wait(waiting)
                        health.check()
                        if (
                            self._timeout is not None
                            and time.monotonic() - last_shard > self._timeout
                        ):
                            raise TimeoutError(
                                f"no new shard of epoch {k} for {self._timeout:g} s"
                                + kept.retention_hint()
                                + _fence_hint(guard)
                            )
                        arrivals.read(_POLL)
        finally:
            releaser.end_wait(waiting)
            guard.close()
        if last is not None:
            kept.epoch = last + 1  # the first epoch it has not delivered
        self.ended = True
        # Exhausted: every shard was consumed, none needs to be kept for a restart (unless the
        # caller still reads them: then it calls release() once they are finished).
        if not self.keep_at_end:
            self.release()

    def _claim(self, prefix: str) -> str | None:
        """Claim the next shard; one the saved position covers is claimed and deleted."""
        releaser, kept = self._releaser, self._kept
        for name in ready_names(self._layout, prefix):
            claimed = claim_name(releaser.claimant, name)
            releaser.track(claimed, retain=kept.resumable)
            try:
                os.rename(self._layout.ram_ready / name, self._layout.ram_claimed / claimed)
            except FileNotFoundError:
                releaser.untrack(claimed)
                continue  # another trainer process claimed it first
            if kept.covers(name):
                kept.free([claimed])  # consumed before the saved position
                continue
            return claimed
        return None


def _fence_hint(guard: JobGuard) -> str:
    if guard.job is not None:
        return ""
    return (
        f" (no running prefetchd has said which job {guard.path} belongs to: the shards "
        "there, if any, are an earlier daemon's, and are not read; start the daemon)"
    )


def _take_prefixed(names: list[str], prefix: str) -> list[str]:
    """Remove and return the claims in ``names`` of shards starting with ``prefix``."""
    taken = [n for n in names if (c := parse_claim_name(n)) and c[1].startswith(prefix)]
    names[:] = [n for n in names if n not in taken]
    return taken


def _watch_epoch_ends(arrivals: Watch, layout: Layout) -> None:
    """Wake a waiting trainer on an epoch's ``complete`` marker too (published by rename), not
    only on a new shard, so it sees the epoch's end at once rather than at its next poll (the
    last ``_POLL`` of every epoch, and of a whole job of one epoch). Where the state dir cannot
    be watched (not readable by this user) the poll still finds the marker."""
    with contextlib.suppress(OSError):
        arrivals.add(layout.epochs, IN_MOVED_TO)
