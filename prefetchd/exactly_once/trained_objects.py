"""Which of a host's objects of an epoch its trainers finished, and the positions of every host
of a job read back to resume it with another number of hosts (pure).

A position (``consume/position_format.py``) names shards, which mean something only with the
daemon state of the host that wrote them. To resume a job on another number of hosts, each
position also carries ``objects``, the trained part of the host's epoch in terms of the source:

    "objects": {"epoch": 1, "done": [[0, 4180], [4183, 4190]],
                "partial": {"4180": {"r": [[0, 37]], "n": 52}, "4181": {"r": [[0, 12]]}},
                "listing": {"n": 9000, "digest": "3f2a9c0d51e8b774"}}

``done`` are ranges (half-open) of *ordinals*, positions in the host's epoch order
(``download/order.py``: the host's share sorted by key, permuted by ``(seed, epoch)``), of the
objects all of whose records were trained; ``partial`` gives, for the others with a record
trained, the ranges of record indices trained (in the order the writer takes an object's
records, which ``write/shuffle.py`` makes the same on every read) and ``n``, its number of
records once its last record was trained. Objects complete nearly in their order (a writer
opens them in order, ``output.mix`` at a time), so ``done`` is a few ranges and ``partial``
holds at most about ``output.mix`` x ``output.writers`` objects plus those of the shards read
ahead: about 10-30 KB for any epoch, 1M objects included (``test_trained_objects.py``).
``listing`` (``ListingId``) names the listing those ordinals are places in: the host's share's
object count and a digest of its keys, sizes and ETags in key order, which the downloader
writes to ``state_dir/epochs/<k>.listing`` when it lays out epoch k and a trainer reads once
per epoch. The epoch order is a function of the key-sorted share, the seed and the epoch, so
the same ``listing`` means the same ordinals; a resume on another number of hosts recomputes
each old host's from the new listing and refuses a mismatch (``check_listings``). With several
sources the ordinals are places in the host's mixed plan of every source (an object may be read
twice in it), and ``listing`` covers all its shares (``ListingId.of_sources``).

What a position is valid for, ``job_tag``, is here too (pure). The positions of every host of
the old job are read back by ``host_positions.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefetchd.config import Config, source_identity

Ranges = list[list[int]]  # sorted, disjoint, half-open [a, b), never empty ones
ALL_TRAINED: Ranges = [[0, -1]]  # ``TrainedObjects.trained``: every record of the object


def add_range(ranges: Ranges, start: int, stop: int) -> None:
    """Add ``[start, stop)`` to ``ranges`` in place, merging what touches it."""
    if stop <= start:
        return
    out: Ranges = []
    placed = False
    for a, b in ranges:
        if b < start:
            out.append([a, b])
        elif stop < a:
            if not placed:
                out.append([start, stop])
                placed = True
            out.append([a, b])
        else:
            start, stop = min(a, start), max(b, stop)
    if not placed:
        out.append([start, stop])
    out.sort()
    ranges[:] = out


def in_ranges(ranges: Ranges, value: int) -> bool:
    """Whether ``value`` lies in one of ``ranges`` (a bisection: ``done`` may be long)."""
    lo, hi = 0, len(ranges)
    while lo < hi:
        mid = (lo + hi) // 2
        if ranges[mid][1] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo < len(ranges) and ranges[lo][0] <= value


@dataclass(frozen=True)
class ListingId:
    """Which listing a host's ordinals are places in: its share's object count ``n`` and a
    digest of its keys, sizes and ETags in key order (``download/share.py``, ``identity``)."""

    n: int
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "digest": self.digest}

    @classmethod
    def of_sources(cls, shares: Sequence[ListingId]) -> ListingId:
        """The listing of a host's shares of several sources (``sources:``): their object
        count and a digest of each share's, in the sources' order. The ordinals of a job of
        several sources are places in the host's mixed plan, a function of every share."""
        digest = hashlib.sha256()
        for share in shares:
            digest.update(f"{share.n}\0{share.digest}\n".encode())
        return cls(sum(share.n for share in shares), digest.hexdigest()[:16])

    @classmethod
    def from_json(cls, raw: Any) -> ListingId:
        """Raises ``ValueError`` naming what is malformed."""
        if (
            not isinstance(raw, Mapping)
            or not _count(raw.get("n"))
            or not isinstance(raw.get("digest"), str)
            or not raw["digest"]
        ):
            raise ValueError("objects.listing: expected {n, digest}")
        return cls(int(raw["n"]), raw["digest"])


@dataclass
class TrainedObjects:
    """What a host's trainers finished of epoch ``epoch``: the ordinals of the objects done,
    the trained record ranges of the others begun (``partial``) and their record counts once
    known (``ends``), and the listing the ordinals are places in (``listing``; None: not
    known, as in positions saved before it was kept). ``unknown`` says why it could not be
    kept (a shard's summary was not readable): such a record must not be used."""

    epoch: int
    done: Ranges = field(default_factory=list)
    partial: dict[int, Ranges] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)
    unknown: str | None = None
    listing: ListingId | None = None

    def add(self, ordinal: int, start: int, count: int, end: int | None) -> None:
        """Records ``[start, start + count)`` of object ``ordinal`` were trained; ``end``: its
        number of records, when this is known to be the object's last part."""
        if in_ranges(self.done, ordinal):
            return
        ranges = self.partial.setdefault(ordinal, [])
        add_range(ranges, start, start + count)
        if end is not None:
            self.ends[ordinal] = end
        known = self.ends.get(ordinal)
        if known is not None and (known == 0 or ranges == [[0, known]]):
            del self.partial[ordinal]
            self.ends.pop(ordinal, None)
            add_range(self.done, ordinal, ordinal + 1)

    def merge(self, other: TrainedObjects) -> None:
        """Add what ``other`` (another trainer process of the same host) finished."""
        for a, b in other.done:
            for ordinal in list(self.partial):
                if a <= ordinal < b:
                    del self.partial[ordinal]
                    self.ends.pop(ordinal, None)
            add_range(self.done, a, b)
        for ordinal, ranges in other.partial.items():
            for a, b in ranges:
                self.add(ordinal, a, b - a, other.ends.get(ordinal))
        self.unknown = self.unknown or other.unknown
        if self.listing is None:
            self.listing = other.listing
        elif other.listing is not None and other.listing != self.listing and not self.unknown:
            self.unknown = "its shards were laid out over different listings of the source"

    def trained(self, ordinal: int) -> Ranges | None:
        """The record ranges trained of object ``ordinal``: None if none, ``ALL_TRAINED`` if
        all of them."""
        if in_ranges(self.done, ordinal):
            return ALL_TRAINED
        ranges = self.partial.get(ordinal)
        return [list(r) for r in ranges] if ranges else None

    def copy(self) -> TrainedObjects:
        return TrainedObjects(
            self.epoch,
            [list(r) for r in self.done],
            {k: [list(r) for r in v] for k, v in self.partial.items()},
            dict(self.ends),
            self.unknown,
            self.listing,
        )

    def to_json(self) -> dict[str, Any]:
        if self.unknown is not None:
            return {"epoch": self.epoch, "unknown": self.unknown}
        partial: dict[str, Any] = {}
        for ordinal, ranges in sorted(self.partial.items()):
            entry: dict[str, Any] = {"r": ranges}
            if ordinal in self.ends:
                entry["n"] = self.ends[ordinal]
            partial[str(ordinal)] = entry
        out: dict[str, Any] = {"epoch": self.epoch, "done": self.done, "partial": partial}
        if self.listing is not None:
            out["listing"] = self.listing.to_json()
        return out

    @classmethod
    def from_json(cls, raw: Any) -> TrainedObjects:
        """Raises ``ValueError`` naming what is malformed."""
        if not isinstance(raw, Mapping) or not _count(raw.get("epoch")):
            raise ValueError("objects: expected {epoch, done, partial}")
        epoch = int(raw["epoch"])
        if isinstance(raw.get("unknown"), str):
            return cls(epoch, unknown=raw["unknown"])
        done = _ranges(raw.get("done", []), "objects.done")
        partial: dict[int, Ranges] = {}
        ends: dict[int, int] = {}
        entries = raw.get("partial", {})
        if not isinstance(entries, Mapping):
            raise ValueError("objects.partial must map ordinals to record ranges")
        for key, entry in entries.items():
            if not isinstance(key, str) or not key.isdigit() or not isinstance(entry, Mapping):
                raise ValueError("objects.partial must map ordinals to record ranges")
            partial[int(key)] = _ranges(entry.get("r", []), f"objects.partial.{key}")
            if "n" in entry:
                if not _count(entry["n"]):
                    raise ValueError(f"objects.partial.{key}.n must be a record count")
                ends[int(key)] = int(entry["n"])
        listing = ListingId.from_json(raw["listing"]) if "listing" in raw else None
        return cls(epoch, done, partial, ends, listing=listing)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ranges(raw: Any, what: str) -> Ranges:
    if not isinstance(raw, list) or not all(
        isinstance(r, list) and len(r) == 2 and _count(r[0]) and _count(r[1]) and r[0] < r[1]
        for r in raw
    ):
        raise ValueError(f"{what} must be a list of [start, stop) ranges")
    out: Ranges = []
    for a, b in raw:
        add_range(out, a, b)
    return out


# --- the job's identity ----------------------------------------------------------------------


def dataset_digest(config: Config) -> str:
    """A hash of what selects and parses the dataset's records: with several sources, every
    source's, its name and weight, ``on_exhausted`` and ``weights_by_epoch``, which decide each
    epoch's records. A job of one source hashes what it always did, so its saved positions
    still load."""
    dataset: list[Any] = source_identity(config.source)
    if config.mixed:
        epochs = config.epochs
        dataset = [
            [[*source_identity(s), s.name, s.weight] for s in config.sources],
            epochs.on_exhausted,
            [[first, dict(weights)] for first, weights in epochs.weights_by_epoch],
        ]
    return hashlib.sha256(json.dumps(dataset, sort_keys=True).encode()).hexdigest()[:16]


def job_tag(config: Config, resumed: int | None) -> dict[str, Any]:
    """What a position is only valid for: the dataset (a hash of what selects and parses its
    records), the shuffle seed, and this host's share (``[worker_index, num_workers]``); with
    ``sharding.resume_from``, ``resumed``: the epoch the job resumed on other hosts
    (``host_positions.resumed_epoch``, which reads the files; this is pure)."""
    epochs, sharding = config.epochs, config.sharding
    if (resumed is None) != (sharding.resume_from is None):
        raise ValueError("job_tag: resumed is given exactly when sharding.resume_from is set")
    tag: dict[str, Any] = {
        "dataset": dataset_digest(config),
        "seed": epochs.seed if epochs.shuffle else None,
        "host": [sharding.worker_index, sharding.num_workers],
    }
    if sharding.resume_from is not None:
        # the epoch this job resumed on other hosts: its objects are not the whole share's
        tag["resumed"] = resumed
    return tag
