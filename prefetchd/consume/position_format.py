"""The one position format of every trainer: ``Position``, ``parse_position``, ``job_tag``.

Written by ``ReadyFiles.position()``, ``records()``'s ``position()``, ``TrainingPosition``
(``consume/position.py``) and the torch state (``consume/torch.py``)::

    {"version": 2, "job": {"dataset": "3f0c9a1e5b7d2c44", "seed": 0, "host": [0, 1]},
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
and host; a position of another job, or of an unknown version, raises ``PositionError``.
Version 1 positions (no ``job``, no ``claimant``) still load. Readers ignore keys they do not
know, so a later version can add one (e.g. which objects of the interrupted epoch each host
finished, for a changed number of hosts) without breaking this one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefetchd.config import Config, source_identity
from prefetchd.errors import PositionError
from prefetchd.layout import parse_shard_name

POSITION_VERSION = 2
_READABLE = (1, 2)


def job_tag(config: Config) -> dict[str, Any]:
    """What a position is only valid for: the dataset (a hash of what selects and parses its
    records: with several sources, every source's, its name and weight, ``on_exhausted`` and
    ``weights_by_epoch``, which decide each epoch's records), the shuffle seed, and this
    host's share (``[worker_index, num_workers]``). A job of one source hashes what it always
    did, so its saved positions still load."""
    dataset: list[Any] = source_identity(config.source)
    if config.mixed:
        epochs = config.epochs
        dataset = [
            [[*source_identity(s), s.name, s.weight] for s in config.sources],
            epochs.on_exhausted,
            [[first, dict(weights)] for first, weights in epochs.weights_by_epoch],
        ]
    digest = hashlib.sha256(json.dumps(dataset, sort_keys=True).encode()).hexdigest()[:16]
    epochs, sharding = config.epochs, config.sharding
    return {
        "dataset": digest,
        "seed": epochs.seed if epochs.shuffle else None,
        "host": [sharding.worker_index, sharding.num_workers],
    }


def check_job(raw: Mapping[str, Any], config: Config) -> None:
    """Raise ``PositionError`` if the position ``raw`` was saved by another job."""
    saved, here = raw.get("job"), job_tag(config)
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
            f"config is host [{index}, {count}]: load each host's own position"
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
        return out


def parse_position(raw: Mapping[str, Any], config: Config | None = None) -> Position:
    """A saved position (``{}`` = the start); raises ``PositionError`` (a ``ValueError``)
    naming what is wrong, or which job it belongs to if not ``config``'s."""
    if not raw:
        return Position(0, frozenset(), job=job_tag(config) if config else None)
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
    if config is not None:
        check_job(raw, config)
    job = job_tag(config) if config is not None else raw.get("job")
    return Position(epoch, frozenset(consumed), records, claimant, job, holder)


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
