"""A job of several sources resumed on another number of hosts (``rehost.split_mixed``): the new
hosts together deliver every read of the interrupted epoch that no old host trained, once, with
the records already trained of the reads begun left out; a changed listing is refused."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefetchd.config import Config, load_config
from prefetchd.consume.position_format import job_for
from prefetchd.download.mixture import EpochMix, epoch_mix
from prefetchd.download.order import SourceObject, host_of
from prefetchd.download.rehost import split_mixed, streams_of
from prefetchd.download.share import ShareTable
from prefetchd.exactly_once.host_positions import ResumeError, read_host_positions
from prefetchd.exactly_once.trained_objects import ListingId, Ranges, TrainedObjects

SOURCES = [("web", 0.6, 40), ("code", 0.3, 90), ("books", 0.1, 12)]
EPOCH = 1  # the interrupted epoch: with repeat, books is read several times in it

Read = tuple[int, int, str]  # (source, period, key)


def _listing(extra: int = 0) -> list[list[SourceObject]]:
    rng = random.Random(7)
    out = []
    for s, (name, _, count) in enumerate(SOURCES):
        n = count + (extra if s == 2 else 0)
        out.append(
            [SourceObject(f"{name}/{i:04d}", rng.randint(100, 900), f"e{s}") for i in range(n)]
        )
    return out


def _config(root: Path, **sharding: Any) -> Config:
    raw = {
        "sources": [
            {"url": f"s3://bucket/{name}/", "weight": weight, "name": name, "format": "raw"}
            for name, weight, _ in SOURCES
        ],
        "download": {"cache_dir": str(root / "cache")},
        "output": {"ram_dir": str(root / "ram")},
        "status": {"state_dir": str(root / "state")},
        "sharding": sharding,
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "prefetchd.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_config(path)


def _old_job(
    tmp_path: Path, old: int, seed: int, finished: int | None = None
) -> tuple[Path, dict[Read, Ranges | None]]:
    """Positions of ``old`` hosts that trained part of epoch ``EPOCH`` (some reads whole, some
    begun; host ``finished``: all of it, its position at the next epoch's start), and what is
    left: each untrained read, with the records trained of it."""
    positions = tmp_path / "positions"
    positions.mkdir()
    plain = _config(tmp_path / "old")
    rng = random.Random(seed)
    left: dict[Read, Ranges | None] = {}
    for h in range(old):
        shares = [ShareTable.of(o for o in objs if host_of(o.key, old) == h) for objs in _listing()]
        plan = epoch_mix(streams_of(plain, [share.sizes() for share in shares]), EPOCH)
        progress = TrainedObjects(
            EPOCH, listing=ListingId.of_sources([s.identity() for s in shares])
        )
        for seq in range(len(plan)):
            source, period, row = plan.at(seq)
            read = (source, period, shares[source][row].key)
            roll = rng.random()
            if roll < 0.4:
                progress.add(seq, 0, 4, 4)
            elif roll < 0.6:
                progress.add(seq, 1, 2, None)
                left[read] = [[1, 3]]
            else:
                left[read] = None
        job = {**job_for(plain), "host": [h, old]}
        raw = {"version": 2, "epoch": EPOCH, "consumed": [], "records": {}, "job": job}
        raw["objects"] = progress.to_json()
        if h == finished:
            left = {read: v for read, v in left.items() if not _in_plan(read, shares, plan)}
            raw["epoch"] = EPOCH + 1
            raw["objects"] = TrainedObjects(EPOCH + 1, listing=progress.listing).to_json()
        (positions / f"host{h}.json").write_text(json.dumps(raw))
    return positions, left


def _in_plan(read: Read, shares: list[ShareTable], plan: EpochMix) -> bool:
    source, period, key = read
    return any(
        s == source and p == period and shares[s][r].key == key
        for s, p, r in (plan.at(i) for i in range(len(plan)))
    )


@pytest.mark.parametrize(
    ("old", "new", "finished"), [(2, 3, None), (3, 2, None), (1, 2, None), (2, 3, 1)]
)
def test_the_new_hosts_split_exactly_the_reads_the_old_ones_left(
    tmp_path: Path, old: int, new: int, finished: int | None
) -> None:
    """``finished``: an old host that had trained all of the epoch (none of its reads left)."""
    positions, left = _old_job(tmp_path, old, seed=old * 10 + new, finished=finished)
    assert any(p > 0 for _, p, _ in left), "the epoch reads some object a second time"
    listed = [ShareTable.of(objs) for objs in _listing()]
    got: dict[Read, Ranges | None] = {}
    for j in range(new):
        config = _config(
            tmp_path / f"n{j}", num_workers=new, worker_index=j, resume_from=str(positions)
        )
        shares, remainder = split_mixed(listed, config, read_host_positions(config))
        assert remainder.mix is not None and remainder.epoch == EPOCH
        for share in shares:
            assert all(host_of(o.key, new) == j for o in share)
        for place in range(len(remainder.mix)):
            source, period, row = remainder.mix.at(place)
            read = (source, period, shares[source][row].key)
            assert read not in got, "a read is delivered once"
            got[read] = remainder.skips.get(place)
    assert got == left


def test_a_source_whose_keys_changed_is_refused_naming_the_old_host(tmp_path: Path) -> None:
    positions, _ = _old_job(tmp_path, 2, seed=1)
    config = _config(tmp_path / "n0", num_workers=3, worker_index=0, resume_from=str(positions))
    listed = [ShareTable.of(objs) for objs in _listing(extra=1)]  # a books object added
    moved = host_of(f"books/{SOURCES[2][2]:04d}", 2)
    with pytest.raises(
        ResumeError, match=rf"the sources changed since the old job: host {moved} of 2"
    ):
        split_mixed(listed, config, read_host_positions(config))
