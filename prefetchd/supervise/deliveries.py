"""What trainers did with the shards on the RAM disk, as the supervisor learns it: shards read
(noted delivered in the ledger, then deleted), shards of dead trainers (given back), and shards
or whole directories that vanished under the daemon (a loss, which fails it).

A read shard's pages are freed here, not in the trainer: its claimant moves the claim to
``done/`` and the supervisor notes it delivered before it deletes the file, so a crash in
between leaves it noted (``exactly_once/ledger.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Protocol

from prefetchd.atomic import holds_lock
from prefetchd.budget import rename_under_budget_lock
from prefetchd.exactly_once.ledger import record_delivered
from prefetchd.exactly_once.recovery import CACHE, RAM
from prefetchd.inotify import IN_DELETE, Watch
from prefetchd.layout import Layout, parse_claim_name
from prefetchd.owner import Ownership

# the supervisor's lines keep their logger name (it is in every line): operators filter on it
log = logging.getLogger("prefetchd.supervise.supervisor")


class Failing(Protocol):
    """The daemon as its books see it: whether it failed, and how to fail it (the first
    reason stands: callers check ``failed`` first)."""

    @property
    def failed(self) -> bool: ...

    def fail(self, reason: str) -> None: ...


class Deliveries:
    """Owns the supervisor's two watches on ``ram_dir`` (``claimed/``: a trainer deleted a
    shard it read; ``ready/``: nobody but a stranger deletes there) and the checks that the
    RAM disk and the cache are still ours."""

    def __init__(self, layout: Layout, daemon: Failing) -> None:
        self.layout = layout
        self.daemon = daemon
        self.ownership = Ownership([])
        self._finished: Watch | None = None  # claimed/: a trainer deleted a shard it read
        self._vanished: Watch | None = None  # ready/: nobody but a stranger deletes there

    def watch(self, ownership: Ownership) -> None:
        """Start watching, once start-up has taken the directories (``ownership``)."""
        self.ownership = ownership
        self._finished = Watch(self.layout.ram_claimed, IN_DELETE)
        self._vanished = Watch(self.layout.ram_ready, IN_DELETE)

    def close(self) -> None:
        for watch in (self._finished, self._vanished):
            if watch is not None:
                watch.close()

    def note(self) -> None:
        """Record the shards trainers finished (their claimant moved them to ``done/``, or
        deleted them) in the ledger, so a restart after a lost RAM disk knows what was read, and
        delete those in ``done/`` (their pages are freed here, not in the trainer); fail if a
        shard nobody claimed was deleted from ``ready/`` (its records are gone, and no trainer
        got them)."""
        if self._finished is None or self._vanished is None:
            return
        retired = _retired(self.layout.ram_done)
        done = [
            claim.shard
            for event in self._finished.read_now()
            if not event.overflow and (claim := parse_claim_name(event.name)) is not None
        ]
        done += [shard for _, shard in retired]
        if done:
            record_delivered(self.layout, done)
        for shard in done:  # a position covered it before its trainer freed it: no one reads it
            self.layout.shard_mix(shard).unlink(missing_ok=True)
        for name, _ in retired:  # noted first: a crash in between leaves them, still delivered
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.layout.ram_done / name)
        lost = [e.name for e in self._vanished.read_now() if not e.overflow]
        if lost:
            self.check_disks()  # the whole directory emptied says more than one shard gone
        if lost and not self.daemon.failed:
            self.daemon.fail(
                f"output.ram_dir {self.layout.ram}: shard {lost[0]} was deleted from ready/ "
                f"before any trainer read it ({len(lost)} shards in all): its records are lost"
            )

    def lost_something(self) -> bool:
        """Whether the ledger or the disks show a loss now (the daemon is then failed)."""
        self.note()
        self.check_disks()
        return self.daemon.failed

    def check_disks(self) -> None:
        """Fail if the RAM disk or the cache was emptied under us (our owner marker is gone):
        what trainers had not read is lost, and a restart re-creates it or says why not."""
        for claim in self.ownership:
            if claim.key in (RAM, CACHE) and not claim.intact():
                if not self.daemon.failed:
                    self.daemon.fail(
                        f"{claim.key} {claim.path} was emptied under the running daemon (its "
                        "owner marker is gone): restart prefetchd to re-create what trainers "
                        "had not read, or to learn why it cannot"
                    )
                return

    def return_orphaned_claims(self) -> None:
        """Shards claimed by a trainer process that died go back to ``ready/``."""
        lay = self.layout
        dead: dict[str, bool] = {}
        try:
            names = os.listdir(lay.ram_claimed)
        except FileNotFoundError:
            return  # the RAM disk was emptied: check_disks fails the daemon with the reason
        for name in names:
            parsed = parse_claim_name(name)
            if parsed is None:
                continue
            owner, shard = parsed
            if owner not in dead:
                dead[owner] = not holds_lock(lay.consumer_lock(owner))
            if dead[owner]:
                log.warning("trainer %s died holding %s; returning it to ready/", owner, shard)
                # a resumed trainer may have taken it back from the dead claim meanwhile
                with contextlib.suppress(FileNotFoundError):
                    rename_under_budget_lock(lay, lay.ram_claimed / name, lay.ram_ready / shard)
        for claimant, lock in lay.consumer_locks().items():
            is_dead = dead[claimant] if claimant in dead else not holds_lock(lock)
            if is_dead:
                lock.unlink(missing_ok=True)


def _retired(directory: Path) -> list[tuple[str, str]]:
    """``(name, shard)`` of the claims in ``done/``: shards their trainers finished (none if
    it is gone). Anything else there is not ours, and is left alone."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [(name, claim.shard) for name in names if (claim := parse_claim_name(name)) is not None]
