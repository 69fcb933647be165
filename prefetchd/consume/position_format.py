"""The one position format of every trainer: ``Position``, ``parse_position``, ``job_for``.

Written by ``ReadyFiles.position()``, ``records()``'s ``position()``, ``TrainingPosition``
(``consume/position.py``) and the torch state (``consume/torch.py``)::

    {"version": 2, "job": {"dataset": "3f0c9a1e5b7d2c44", "seed": 0, "host": [0, 1],
                           "id": "9ab2c3d4e5f60718"},
     "epoch": 1, "consumed": ["e000001-w00-c000003.tfrecord", ...],
     "records": {"e000001-w00-c000004.tfrecord": 17}, "claimant": "4242xa1b2c3d4"}

``epoch`` is the first epoch not finished; ``consumed`` the shards whose records were all
trained and that may still come back (older ones were deleted: they cannot); ``records`` the
records trained of each shard in progress, in file order; ``claimant`` the tag under which the
saving process held them, so a resumed one takes exactly those back before any other trainer
process can claim them (``holder``: the torch main process that kept what a worker's ended
pass held). Its size is one short name per shard still kept on the RAM disk (bounded by
``output.ram_budget`` / ``output.shard_size``, whatever the epoch's size: about 1-2 KB for a
1M-object epoch), never one entry per record or object. ``job`` ties it to the dataset, seed
and host, and (``id``, once the stream has seen the daemon's job fence, ``fence.py``) to the
daemon's job; a position of another job, or of an unknown version, raises ``PositionError``.
A stream computes its job's tag once (``job_for``: with ``sharding.resume_from`` it reads the
old hosts' positions) and checks and writes positions against that.
Version 1 positions (no ``job``, no ``claimant``) still load. Readers ignore keys they do not
know, so a later version can add one (e.g. which objects of the interrupted epoch each host
finished, for a changed number of hosts) without breaking this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefetchd.config import Config
from prefetchd.errors import PositionError
from prefetchd.exactly_once.host_positions import resumed_epoch
from prefetchd.exactly_once.trained_objects import TrainedObjects, job_tag
from prefetchd.layout import parse_shard_name

POSITION_VERSION = 2
_READABLE = (1, 2)


def job_for(config: Config) -> dict[str, Any]:
    """The tag positions of ``config``'s job carry (``trained_objects.job_tag``). Computed
    once per stream, dataset or position, and passed on: with ``sharding.resume_from`` it
    reads the old hosts' positions (raises ``ResumeError``, exit 2)."""
    return job_tag(config, resumed_epoch(config))


def check_job(raw: Mapping[str, Any], here: Mapping[str, Any]) -> None:
    """Raise ``PositionError`` if the position ``raw`` was saved by another job than ``here``
    (``job_for``)."""
    saved = raw.get("job")
    if saved is None:
        return  # version 1: saved before positions named their job
    if not isinstance(saved, Mapping):
        raise PositionError("position: job must be an object")
    if saved.get("dataset") != here["dataset"]:
        raise PositionError(
            f"position is of another dataset ({saved.get('dataset')}; this config's source is "
            f"{here['dataset']}): resume it with the config it was saved with"
        )
    if saved.get("seed") != here["seed"]:
        raise PositionError(
            f"position was saved with epochs.seed={saved.get('seed')} and this config has "
            f"{here['seed']}: the epochs' record order differs, so it cannot resume"
        )
    if list(saved.get("host", [])) != here["host"]:
        index, count = here["host"]
        raise PositionError(
            f"position is of host {saved.get('host')} ([worker_index, num_workers]) and this "
            f"config is host [{index}, {count}]: load each host's own position (to resume on "
            "another number of hosts, give every host's to sharding.resume_from)"
        )


@dataclass(frozen=True)
class Position:
    """Where a resumable stream stands: ``epoch`` is the first epoch it may still have to
    deliver, ``consumed`` the shards yielded since the position before this one (older ones are
    deleted from the RAM disk, so they can never come back)."""

    epoch: int
    consumed: frozenset[str]
    records: Mapping[str, int] = field(default_factory=dict)
    claimant: str | None = None
    job: Mapping[str, Any] | None = None
    holder: str | None = None  # the claimant its ended streams' shards were handed to
    # which of the host's objects of ``epoch`` were trained (``TrainedObjects``), for a resume
    # on another number of hosts; None: not kept by the trainer that saved it
    objects: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": POSITION_VERSION,
            "epoch": self.epoch,
            "consumed": sorted(self.consumed),
            "records": dict(self.records),
        }
        if self.job is not None:
            out["job"] = dict(self.job)
        if self.claimant is not None:
            out["claimant"] = self.claimant
        if self.holder is not None:
            out["holder"] = self.holder
        if self.objects is not None:
            out["objects"] = dict(self.objects)
        return out


def parse_position(raw: Mapping[str, Any], job: Mapping[str, Any] | None = None) -> Position:
    """A saved position (``{}`` = the start); raises ``PositionError`` (a ``ValueError``)
    naming what is wrong, or which job it belongs to if not ``job`` (``job_for``)."""
    if not raw:
        return Position(0, frozenset(), job=dict(job) if job is not None else None)
    if raw.get("version") not in _READABLE:
        raise PositionError(
            f"position: version {raw.get('version')!r} is not one this prefetchd reads "
            f"({', '.join(map(str, _READABLE))})"
        )
    epoch, consumed = raw.get("epoch"), raw.get("consumed")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise PositionError(f"position: epoch {epoch!r} is not a non-negative integer")
    if not isinstance(consumed, list) or not all(
        isinstance(n, str) and parse_shard_name(n) is not None for n in consumed
    ):
        raise PositionError("position: consumed must be a list of shard names")
    records = _records(raw.get("records", {}))
    claimant, holder = _tag(raw, "claimant"), _tag(raw, "holder")
    saved_job = raw.get("job")
    tag = saved_job
    if job is not None:
        check_job(raw, job)
        tag = dict(job)
        if isinstance(saved_job, Mapping) and saved_job.get("id"):
            tag["id"] = saved_job["id"]  # the daemon's job: checked under its fence
    objects = raw.get("objects")
    if objects is not None:
        try:
            TrainedObjects.from_json(objects)
        except ValueError as exc:
            raise PositionError(f"position: {exc}") from None
    return Position(epoch, frozenset(consumed), records, claimant, tag, holder, objects)


def job_id(position: Position) -> str | None:
    """The daemon's job the position was saved in (``job.id``: ``supervise/job.py``, the job
    fence), or None (saved before the stream saw a fence, or by an earlier release)."""
    found = position.job.get("id") if position.job is not None else None
    return found if isinstance(found, str) and found else None


def check_job_id(position: Position, running: str) -> None:
    """Raise ``PositionError`` if ``position`` was saved in another job than ``running``, the
    one the daemon fences now: its shard names would name that job's shards."""
    saved = job_id(position)
    if saved is not None and saved != running:
        raise PositionError(
            f"position was saved in job {saved}, and the daemon now runs job {running} (a new "
            "job: its config changed or its state was removed): its shards are not the ones "
            "the position names, so it cannot resume; start this trainer without it"
        )


def _tag(raw: Mapping[str, Any], key: str) -> str | None:
    tag = raw.get(key)
    if tag is not None and (not isinstance(tag, str) or not tag or "-" in tag or "/" in tag):
        raise PositionError(f"position: {key} {tag!r} is not a claimant tag")
    return tag


def _records(records: Any) -> dict[str, int]:
    if not isinstance(records, Mapping) or not all(
        isinstance(name, str)
        and parse_shard_name(name) is not None
        and isinstance(n, int)
        and not isinstance(n, bool)
        and n >= 0
        for name, n in records.items()
    ):
        raise PositionError("position: records must map shard names to record counts")
    return dict(records)
