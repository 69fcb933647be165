"""Where a resumable ``ready_files()`` stream stands, and the shards it keeps for it.

The position it writes is ``consume/position_format.py``'s. Resumable streams keep the shards
they yielded on the RAM disk until a position the trainer has certainly saved covers them;
after a crash the daemon returns them to ``ready/``, and a stream resumed from the saved
position first takes back what the saved one held (``take_back.py``): exactly once relative to
it. Which objects the covered shards held is ``trained_shards.py``'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from prefetchd.atomic import dir_bytes
from prefetchd.consume.claims import give_back, retire
from prefetchd.consume.position_format import (
    POSITION_VERSION,
    Position,
    check_job,
    check_job_id,
    parse_position,
)
from prefetchd.consume.releaser import ShardReleaser
from prefetchd.consume.trained_shards import TrainedShards
from prefetchd.exactly_once.trained_objects import TrainedObjects
from prefetchd.layout import (
    Layout,
    claim_name,
    parse_claim_name,
    parse_shard_name,
)

__all__ = [
    "POSITION_VERSION",
    "Position",
    "StreamPosition",
    "check_job",
    "parse_position",
]

log = logging.getLogger(__name__)


class StreamPosition:
    """One stream's position and the claims it keeps for it.

    Owns the claims yielded since the last ``position()`` (``since``), those the last one
    covered (``covered``: freed by the next call, as the trainer saved that position before
    asking for another), the shards the saved position covers that may still come back
    (``skip``), and the epoch being read. A stream made without a saved position keeps
    nothing. ``position()``, ``give_back()`` and ``release()`` may be called from another
    thread than the one iterating.
    """

    def __init__(
        self, layout: Layout, saved: Position | None, job: Mapping[str, Any] | None = None
    ) -> None:
        self.layout = layout
        self.resumable = saved is not None
        self.skip = set(saved.consumed) if saved is not None else set()
        self.epoch = saved.epoch if saved is not None else 0
        self.saved = saved
        self.job = job
        # records of a shard trained before the saved position: skipped when it comes back
        self.resume_records = dict(saved.records) if saved is not None else {}
        self.reclaimed: list[str] = []  # shards in progress taken back: yielded first
        self.releaser: ShardReleaser | None = None  # the process's, once the stream has one
        # which objects of the epoch the covered shards held (positions, for a resume on
        # another number of hosts): carried over from the saved position
        self.objects = (
            TrainedShards.resumed(layout, saved) if saved is not None else TrainedShards(layout)
        )
        self._folded: set[str] = set()  # claims ``snapshot`` folded into ``objects`` already
        self.handed = 0  # claims handed out, kept or not
        self._covered: list[str] = []  # claimed names covered by the last position()
        self._since: list[str] = []  # claimed names yielded since the last position()
        self._lock = threading.Lock()  # _covered and _since

    def check_job(self, running: str) -> None:
        """Raise ``PositionError`` if the saved position is of another job than ``running``
        (the job the daemon fences): resuming it would skip or take that job's shards."""
        if self.saved is not None:
            check_job_id(self.saved, running)

    def adopt_job(self, running: str) -> None:
        """The stream reads the daemon's job ``running`` (``JobGuard``): positions name it."""
        self.check_job(running)
        if self.job is not None and self.job.get("id") != running:
            self.job = {**self.job, "id": running}

    def yielded(self, claimed: str) -> None:
        """The stream hands out ``claimed``: a resumable one keeps it until covered."""
        self.handed += 1
        if self.resumable:
            with self._lock:
                self._since.append(claimed)

    def covers(self, shard: str) -> bool:
        """Whether the saved position covers ``shard`` (consumed before it; once only)."""
        if shard not in self.skip:
            return False
        self.skip.discard(shard)
        return True

    def epoch_ended(self, prefix: str) -> None:
        """Nothing of the epoch of ``prefix`` can come back now: forget its covered shards."""
        self.skip = {n for n in self.skip if not n.startswith(prefix)}

    def position(
        self, finished: int | None, unfinished: int, records: Mapping[str, int] | None = None
    ) -> dict[str, Any]:
        """``ReadyFiles.position``: free what the last one covered and cover the first
        ``finished`` claims yielded since (all but the last ``unfinished`` if None);
        ``records``: those trained of the shards in progress."""
        if not self.resumable:
            raise ValueError("position() needs a resumable stream: ready_files(..., position={})")
        with self._lock:
            if finished is None:
                finished = len(self._since) - max(unfinished, 0)
            return self._position(finished, records)

    def _position(self, finished: int, records: Mapping[str, int] | None = None) -> dict[str, Any]:
        self.free(self._covered)
        cut = max(0, min(finished, len(self._since)))
        self._covered, self._since = self._since[:cut], self._since[cut:]
        for claim in map(parse_claim_name, self._covered):
            if claim is not None:
                self.objects.fold(claim[1])
        # Shards the saved position covered that have not come back yet (their dead claimant's
        # claims are returned about once a second) stay covered by this one too.
        covered = [claim[1] for claim in map(parse_claim_name, self._covered) if claim]
        consumed = covered + sorted(self.skip)
        # A retained shard of an earlier epoch may come back after a crash: resume from there.
        reading = [claim[1] for claim in map(parse_claim_name, self._since) if claim]
        epochs = [p[0] for p in map(parse_shard_name, consumed + reading) if p is not None]
        return self._json(min([self.epoch, *epochs]), consumed, records or {}, objects=True)

    def _json(
        self,
        epoch: int,
        consumed: list[str],
        records: Mapping[str, int],
        *,
        objects: bool = False,
    ) -> dict[str, Any]:
        claimant = self.releaser.claimant if self.releaser is not None else None
        # Records of a shard the saved position was in and that has not come back yet stay.
        records = {**{n: k for n, k in self.resume_records.items() if k}, **records}
        trained = self.objects.objects(epoch, records) if objects else None
        return Position(
            epoch, frozenset(consumed), records, claimant, self.job, objects=trained
        ).to_json()

    def snapshot(self, unfinished: int, records: Mapping[str, int]) -> dict[str, Any]:
        """A position covering every claim yielded but the last ``unfinished``, with the
        records trained of those (``records``), freeing nothing: for callers that cannot know
        which of their positions was saved (a DataLoader worker snapshots at every batch).
        They free what a saved position covers with ``free_saved``. Claims freed that way
        since are left out, so it stays as small as what the RAM disk keeps."""
        with self._lock:
            kept = [
                c for c in self._covered + self._since if (self.layout.ram_claimed / c).exists()
            ]
            self._covered, self._since = [], kept
            done = kept[: max(0, len(kept) - unfinished)]
            reading = kept[len(done) :]
            # Each claim's mix is read once, the first time it is done (not at every batch).
            fresh = [c for c in done if c not in self._folded]
            self._folded = {c for c in self._folded if c in kept} | set(fresh)
        for claim in map(parse_claim_name, fresh):
            if claim is not None:
                self.objects.fold(claim[1])
        consumed = [c[1] for c in map(parse_claim_name, done) if c] + sorted(self.skip)
        in_progress = [c[1] for c in map(parse_claim_name, reading) if c] + list(records)
        epochs = [p[0] for p in map(parse_shard_name, in_progress) if p is not None]
        return self._json(min([self.epoch, *epochs]), consumed, records, objects=True)

    def start_keeping(self, reading: str | None) -> None:
        """Become resumable now: keep what is yielded from here on, and ``reading``, the claim
        being read (what was read before is covered by any position taken from now on)."""
        if self.resumable:
            return
        self.resumable = True
        # what was handed out before is not kept, nor known: unless nothing was
        late = "the stream became resumable after it had handed out shards"
        unknown = late if self.handed else None
        self.objects.trained = TrainedObjects(self.epoch, unknown=unknown)
        if reading is not None:
            with self._lock:
                self._since.append(reading)
            if self.releaser is not None:
                self.releaser.retain(reading)

    def kept_claims(self) -> list[str]:
        """The claims this stream keeps (yielded, not freed)."""
        with self._lock:
            return self._covered + self._since

    def hand_off(self, holder: str) -> None:
        """The stream ended in a process that may exit before a saved position covers what it
        keeps (a DataLoader worker): rename its claims to ``holder``'s, a claimant whose
        process lives on (the trainer's main process), so the daemon does not take them back."""
        with self._lock:
            kept, self._covered, self._since = self._covered + self._since, [], []
            fresh = [c for c in kept if c not in self._folded]
            self._folded = set()
        for claimed in fresh:  # the pass ended: all of them were read
            parsed = parse_claim_name(claimed)
            if parsed is not None:
                self.objects.fold(parsed[1])
        for claimed in kept:
            parsed = parse_claim_name(claimed)
            if parsed is None or parsed[0] == holder:
                continue
            if self.releaser is not None:
                self.releaser.untrack(claimed)
            with contextlib.suppress(FileNotFoundError):
                os.rename(
                    self.layout.ram_claimed / claimed,
                    self.layout.ram_claimed / claim_name(holder, parsed[1]),
                )

    def free(self, claimed: list[str]) -> None:
        """Retire ``claimed`` to ``done/``: finished, no position needs them any more."""
        for name in claimed:
            if self.releaser is not None:
                self.releaser.untrack(name)
            retire(self.layout.ram_claimed, self.layout.ram_done, name)

    def give_back(self) -> None:
        """Return the claims yielded since the last ``position()`` to ``ready/`` unread."""
        with self._lock:
            since, self._since = self._since, []
        for claimed in since:
            if self.releaser is not None:
                self.releaser.untrack(claimed)
            give_back(self.layout, claimed)

    def release(self) -> None:
        """Free every claim still kept: all of them are finished."""
        with self._lock:
            kept, self._covered, self._since = self._covered + self._since, [], []
        self.free(kept)

    def retention_hint(self) -> str:
        """Why a resumable stream may starve: the shards it keeps fill the RAM budget."""
        kept = self._covered + self._since
        if not kept:
            return ""
        size = dir_bytes(self.layout.ram_claimed) if kept else 0
        return (
            f"; this resumable stream keeps {len(kept)} read shards on the RAM disk until "
            f"position() is called again ({size} bytes claimed in total): call position() at "
            "every checkpoint, or raise output.ram_budget"
        )
