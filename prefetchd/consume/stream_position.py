"""Where a resumable ``ready_files()`` stream stands, to the shard, and the shards it keeps.

A position saved by ``ReadyFiles.position()`` (``TrainingPosition`` in ``consume/position.py``
adds record counts to it)::

    {"version": 1, "epoch": 1, "consumed": ["e000001-w00-c000003.tfrecord", ...]}

Resumable streams keep the shards they yielded on the RAM disk until a position the trainer
has certainly saved covers them; after a crash the daemon returns them to ``ready/``, and a
stream resumed from the saved position skips the ones it covers: exactly once relative to it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefetchd.atomic import dir_bytes
from prefetchd.consume.claims import give_back, retire
from prefetchd.consume.releaser import ShardReleaser
from prefetchd.layout import Layout, parse_claim_name, parse_shard_name

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


class StreamPosition:
    """One stream's position and the claims it keeps for it.

    Owns the claims yielded since the last ``position()`` (``since``), those the last one
    covered (``covered``: freed by the next call, as the trainer saved that position before
    asking for another), the shards the saved position covers that may still come back
    (``skip``), and the epoch being read. A stream made without a saved position keeps
    nothing. ``position()``, ``give_back()`` and ``release()`` may be called from another
    thread than the one iterating.
    """

    def __init__(self, layout: Layout, saved: Position | None) -> None:
        self._layout = layout
        self.resumable = saved is not None
        self.skip = set(saved.consumed) if saved is not None else set()
        self.epoch = saved.epoch if saved is not None else 0
        self.releaser: ShardReleaser | None = None  # the process's, once the stream has one
        self._covered: list[str] = []  # claimed names covered by the last position()
        self._since: list[str] = []  # claimed names yielded since the last position()
        self._lock = threading.Lock()  # _covered and _since

    def yielded(self, claimed: str) -> None:
        """The stream hands out ``claimed``: a resumable one keeps it until covered."""
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

    def position(self, finished: int | None, unfinished: int) -> dict[str, Any]:
        """``ReadyFiles.position``: free what the last one covered and cover the first
        ``finished`` claims yielded since (all but the last ``unfinished`` if None)."""
        if not self.resumable:
            raise ValueError("position() needs a resumable stream: ready_files(..., position={})")
        with self._lock:
            if finished is None:
                finished = len(self._since) - max(unfinished, 0)
            return self._position(finished)

    def _position(self, finished: int) -> dict[str, Any]:
        self.free(self._covered)
        cut = max(0, min(finished, len(self._since)))
        self._covered, self._since = self._since[:cut], self._since[cut:]
        # Shards the saved position covered that have not come back yet (their dead claimant's
        # claims are returned about once a second) stay covered by this one too.
        covered = [claim[1] for claim in map(parse_claim_name, self._covered) if claim]
        consumed = covered + sorted(self.skip)
        # A retained shard of an earlier epoch may come back after a crash: resume from there.
        reading = [claim[1] for claim in map(parse_claim_name, self._since) if claim]
        epochs = [p[0] for p in map(parse_shard_name, consumed + reading) if p is not None]
        return Position(min([self.epoch, *epochs]), frozenset(consumed)).to_json()

    def free(self, claimed: list[str]) -> None:
        """Retire ``claimed`` to ``done/``: finished, no position needs them any more."""
        for name in claimed:
            if self.releaser is not None:
                self.releaser.untrack(name)
            retire(self._layout.ram_claimed, self._layout.ram_done, name)

    def give_back(self) -> None:
        """Return the claims yielded since the last ``position()`` to ``ready/`` unread."""
        with self._lock:
            since, self._since = self._since, []
        for claimed in since:
            if self.releaser is not None:
                self.releaser.untrack(claimed)
            give_back(self._layout, claimed)

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
        size = dir_bytes(self._layout.ram_claimed) if kept else 0
        return (
            f"; this resumable stream keeps {len(kept)} read shards on the RAM disk until "
            f"position() is called again ({size} bytes claimed in total): call position() at "
            "every checkpoint, or raise output.ram_budget"
        )
