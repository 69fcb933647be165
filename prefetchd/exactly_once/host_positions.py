"""The positions of every host of a job, read back to resume it on another number of hosts
(``sharding.resume_from``).

``read_host_positions`` reads the positions of every host of the old job (the directory
``sharding.resume_from`` names), checks that they are of this dataset and seed, of one
``num_workers`` and all there, and says where each host stood: what each host's trainers
finished of the interrupted epoch (``trained_objects.TrainedObjects``). ``check_listings``
compares the listing each old host's positions name with the one listed now;
``resumed_epoch`` is the epoch a resumed job's positions are tagged with (``job_tag``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefetchd.config import Config
from prefetchd.errors import ConfigError
from prefetchd.exactly_once.trained_objects import ListingId, TrainedObjects, dataset_digest
from prefetchd.layout import parse_shard_name


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


def check_listings(hosts: HostPositions, now: list[ListingId], sources: int = 1) -> list[int]:
    """Compare each old host's listing (``now``: recomputed from the new listing, by old host;
    with several ``sources``, over its shares of them all, ``ListingId.of_sources``) with the
    one its positions name; raises ``ResumeError`` on the first that differs. Returns the old
    hosts whose positions name none (saved before it was kept): those cannot be checked."""
    what, share, pin = "source", "share", "a source.manifest"
    if sources > 1:
        what, share, pin = "sources", f"shares of the {sources} sources", "each source's manifest"
    for index in range(hosts.num_workers):
        then = hosts.listings.get(index)
        if then is None or then == now[index]:
            continue
        also = " (other keys, sizes or ETags)" if then.n == now[index].n else ""
        raise ResumeError(
            f"{hosts.where}: the {what} changed since the old job: host {index} of "
            f"{hosts.num_workers} had {then.n} objects in its {share} then and has "
            f"{now[index].n} now{also}; its trained objects are found again by their place in "
            "its order over the listing, which keys added or removed move: resume with the "
            f"same keys as the old job ({pin} pins them)"
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


def resumed_epoch(config: Config) -> int | None:
    """The epoch a job with ``sharding.resume_from`` resumed on another number of hosts: the
    one its old hosts' positions stand in (read from the files; raises ``ResumeError``).
    None without ``sharding.resume_from``."""
    if config.sharding.resume_from is None:
        return None
    return read_host_positions(config).epoch
