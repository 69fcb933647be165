"""Which of a host's objects of an epoch its trainers finished, and the positions of every host
of a job read back to resume it with another number of hosts (pure, but for reading files).

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
each old host's from the new listing and refuses a mismatch (``check_listings``).

``read_host_positions`` reads the positions of every host of the old job (the directory
``sharding.resume_from`` names), checks that they are of this dataset and seed, of one
``num_workers`` and all there, and says where each host stood.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefetchd.config import Config, source_identity
from prefetchd.errors import ConfigError
from prefetchd.layout import parse_shard_name

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
    (``resumed_epoch``, which reads the files; this is pure)."""
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


def resumed_epoch(config: Config) -> int | None:
    """The epoch a job with ``sharding.resume_from`` resumed on another number of hosts: the
    one its old hosts' positions stand in (read from the files; raises ``ResumeError``).
    None without ``sharding.resume_from``."""
    if config.sharding.resume_from is None:
        return None
    return read_host_positions(config).epoch


# --- the old job's positions, for a resume with another number of hosts ----------------------


class ResumeError(ConfigError):
    """``sharding.resume_from`` cannot be resumed from: a host's position is missing, or one is
    of another job, malformed or without its ``objects`` (exit 2, one line naming which)."""


@dataclass
class HostPositions:
    """Where every host of the old job stood: its ``num_workers``, the epoch it was
    interrupted in (``epoch``) and, per old host, what its trainers finished of that epoch
    (``trained``; ``finished``: hosts that had trained all of it), and the listing of each
    old host's share its positions name (``listings``; hosts whose positions predate it are
    not in it)."""

    num_workers: int
    epoch: int
    trained: dict[int, TrainedObjects]
    finished: set[int]
    listings: dict[int, ListingId] = field(default_factory=dict)
    where: str = "sharding.resume_from"


def read_host_positions(config: Config) -> HostPositions:
    """The positions in ``sharding.resume_from``: its ``*.json`` files, each a position or any
    JSON holding positions (a DataLoader state saved as JSON: one per worker); the positions
    of several trainer processes (and workers) of a host are added up. Raises
    ``ResumeError``."""
    directory = config.sharding.resume_from
    assert directory is not None
    where = f"sharding.resume_from ({directory})"
    try:
        files = sorted(p for p in Path(directory).iterdir() if p.suffix == ".json")
    except OSError as exc:
        raise ResumeError(f"{where}: cannot list it: {exc.strerror}") from None
    dataset, seed = dataset_digest(config), config.epochs.seed if config.epochs.shuffle else None
    by_host: dict[int, list[tuple[Path, Mapping[str, Any]]]] = {}
    counts: set[int] = set()
    for path in files:
        for raw in _load(path, where):
            job = raw.get("job")
            if not isinstance(job, Mapping) or not isinstance(job.get("host"), list):
                raise ResumeError(f"{path}: not a position naming its host (version 1)")
            if job.get("dataset") != dataset or job.get("seed") != seed:
                raise ResumeError(
                    f"{path}: a position of another dataset or epochs.seed than this config's"
                )
            index, count = job["host"]
            resumed = job.get("resumed")
            if isinstance(resumed, int) and _epoch(raw) <= resumed:
                raise ResumeError(
                    f"{path}: a position inside epoch {resumed}, which its job resumed from "
                    "another number of hosts: change the number of hosts again only once that "
                    "epoch is over"
                )
            counts.add(count)
            by_host.setdefault(index, []).append((path, raw))
    if not by_host:
        raise ResumeError(f"{where}: no position (*.json) in it")
    if len(counts) != 1:
        raise ResumeError(f"{where}: positions of jobs with num_workers {sorted(counts)}")
    (count,) = counts
    for index in range(count):
        if index not in by_host:
            raise ResumeError(
                f"{where}: no position of host {index} of {count} "
                f"([worker_index, num_workers] = [{index}, {count}]): keep the positions of every "
                "host; without it that host's records would be trained twice or never"
            )
    epoch = min(_epoch(raw) for saved in by_host.values() for _, raw in saved)
    trained: dict[int, TrainedObjects] = {}
    finished: set[int] = set()
    listings: dict[int, ListingId] = {}
    for index, saved in sorted(by_host.items()):
        listings.update(_listing_of(index, saved, where))
        if all(_epoch(raw) > epoch for _, raw in saved):
            for path, raw in saved:
                _check_ahead(path, raw, epoch, index)
            finished.add(index)
            continue
        total = TrainedObjects(epoch)
        for path, raw in saved:
            total.merge(_trained(path, raw, epoch))
        trained[index] = total
    return HostPositions(count, epoch, trained, finished, listings, where)


def _listing_of(
    index: int, saved: list[tuple[Path, Mapping[str, Any]]], where: str
) -> dict[int, ListingId]:
    """The listing host ``index``'s positions name (any epoch's: the share is the same), if
    any; raises ``ResumeError`` if they name different ones."""
    found = {p.listing for path, raw in saved if (p := _objects(path, raw)) and p.listing}
    if len(found) > 1:
        raise ResumeError(
            f"{where}: the positions of host {index} were saved over different listings of the "
            "source (it was changed while the old job ran): resume with another number of "
            "hosts only from positions over one listing"
        )
    return {index: found.pop()} if found else {}


def check_listings(hosts: HostPositions, now: list[ListingId]) -> list[int]:
    """Compare each old host's listing (``now``: recomputed from the new listing, by old host)
    with the one its positions name; raises ``ResumeError`` on the first that differs. Returns
    the old hosts whose positions name none (saved before it was kept): those cannot be
    checked."""
    for index in range(hosts.num_workers):
        then = hosts.listings.get(index)
        if then is None or then == now[index]:
            continue
        also = " (other keys, sizes or ETags)" if then.n == now[index].n else ""
        raise ResumeError(
            f"{hosts.where}: the source changed since the old job: host {index} of "
            f"{hosts.num_workers} had {then.n} objects in its share then and has "
            f"{now[index].n} now{also}; its trained objects are found again by their place in "
            "its order over the listing, which keys added or removed move: resume with the "
            "same keys as the old job (a source.manifest pins them)"
        )
    return [index for index in range(hosts.num_workers) if index not in hosts.listings]


def _load(path: Path, where: str) -> list[Mapping[str, Any]]:
    """The positions in the JSON file at ``path`` (itself one, or any structure holding some)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ResumeError(f"{path}: not a saved prefetchd position ({exc})") from None
    found = list(_positions(raw))
    if not found:
        raise ResumeError(f"{path}: holds no prefetchd position ({where})")
    for position in found:
        if position.get("version") != 2:
            raise ResumeError(f"{path}: a position of version {position.get('version')!r}, not 2")
    return found


def _positions(raw: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(raw, Mapping):
        if isinstance(raw.get("version"), int) and "consumed" in raw and "epoch" in raw:
            yield raw
            return
        for value in raw.values():
            yield from _positions(value)
    elif isinstance(raw, list):
        for value in raw:
            yield from _positions(value)


def _epoch(raw: Mapping[str, Any]) -> int:
    epoch = raw.get("epoch")
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0 else 0


def _objects(path: Path, raw: Mapping[str, Any]) -> TrainedObjects | None:
    objects = raw.get("objects")
    if objects is None:
        return None
    try:
        trained = TrainedObjects.from_json(objects)
    except ValueError as exc:
        raise ResumeError(f"{path}: {exc}") from None
    if trained.unknown is not None:
        raise ResumeError(f"{path}: its objects are unknown: {trained.unknown}")
    return trained


def _trained_in(raw: Mapping[str, Any], epoch: int) -> bool:
    """Whether the position names a shard of ``epoch`` it trained records of."""
    names = [*raw.get("consumed", []), *(n for n, k in raw.get("records", {}).items() if k)]
    epochs = [parsed.epoch for n in names if isinstance(n, str) and (parsed := parse_shard_name(n))]
    return epoch in epochs


def _trained(path: Path, raw: Mapping[str, Any], epoch: int) -> TrainedObjects:
    """What the position at ``path`` finished of ``epoch`` (its own epoch, or the one it
    finished last: a DataLoader worker whose pass over ``epoch`` ended keeps its objects)."""
    trained = _objects(path, raw)
    if trained is not None and trained.epoch == epoch:
        return trained
    if _epoch(raw) == epoch and not _trained_in(raw, epoch):
        return TrainedObjects(epoch)  # nothing of this epoch trained yet
    raise ResumeError(
        f"{path}: this position trained records of epoch {epoch} but does not say which "
        "objects (saved by a trainer that does not keep them, or by an older release): it "
        "cannot resume on another number of hosts"
    )


def _check_ahead(path: Path, raw: Mapping[str, Any], epoch: int, index: int) -> None:
    """A host all of whose positions are past ``epoch`` finished it; it must not have trained
    anything of the next, which the new hosts could not know."""
    later = _epoch(raw)
    objects = _objects(path, raw)
    began = _trained_in(raw, later) or (
        objects is not None and objects.epoch == later and bool(objects.done or objects.partial)
    )
    if later > epoch + 1 or began:
        raise ResumeError(
            f"{path}: host {index} is in epoch {later} and another host in epoch {epoch}: "
            "resume with another number of hosts from positions of one epoch (save them at an "
            "epoch's end, or all at one step)"
        )
