"""What a position keeps for a resume on another number of hosts (``trained_objects.py``),
the shard mix it is read from (``messages/shard_mix.py``) and the remainder each new host
works out (``download/rehost.py``)."""

from __future__ import annotations

import json
import random
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from prefetchd.config import Config
from prefetchd.consume.position_format import job_for
from prefetchd.download.order import SourceObject, epoch_order, host_of
from prefetchd.download.rehost import split_remainder
from prefetchd.download.share import ListingDigest, ShareTable
from prefetchd.exactly_once.host_positions import (
    ResumeError,
    check_listings,
    read_host_positions,
    resumed_epoch,
)
from prefetchd.exactly_once.trained_objects import (
    ALL_TRAINED,
    ListingId,
    TrainedObjects,
    add_range,
    in_ranges,
    job_tag,
)
from prefetchd.kernel import choice
from prefetchd.messages.shard_mix import ShardMix, ShardPart
from prefetchd.write.frames import Frames, without

from ..configs import unit_config


def test_ranges_merge_and_answer_membership() -> None:
    ranges: list[list[int]] = []
    for a, b in [(5, 7), (0, 2), (2, 3), (10, 12), (6, 11)]:
        add_range(ranges, a, b)
    assert ranges == [[0, 3], [5, 12]]
    assert [v for v in range(14) if in_ranges(ranges, v)] == [0, 1, 2, *range(5, 12)]


def test_an_object_is_done_once_every_record_up_to_its_last_was_trained() -> None:
    progress = TrainedObjects(3)
    progress.add(7, 0, 10, None)
    progress.add(7, 20, 5, 25)  # its last part, trained before the middle one
    assert progress.trained(7) == [[0, 10], [20, 25]]
    progress.add(7, 10, 10, None)
    assert progress.trained(7) is ALL_TRAINED and progress.done == [[7, 8]]
    progress.add(8, 0, 0, 0)  # an object without records, drained
    assert progress.done == [[7, 9]] and not progress.partial
    again = TrainedObjects.from_json(json.loads(json.dumps(progress.to_json())))
    assert again == progress


def test_positions_of_two_trainer_processes_of_a_host_add_up() -> None:
    one, two = TrainedObjects(0), TrainedObjects(0)
    one.add(1, 0, 4, None)
    two.add(1, 4, 6, 10)
    two.add(2, 0, 3, 3)
    one.merge(two)
    assert one.done == [[1, 3]] and not one.partial


def test_the_objects_of_a_1m_object_epoch_stay_small() -> None:
    """A trainer 600,000 objects into an epoch of 1,000,000: objects complete in their order
    but for the ~mix x writers open around the frontier (64 x 8 here), half of which are done
    and half begun; the position's objects stay a few KB."""
    rng = random.Random(1)
    progress = TrainedObjects(0)
    frontier, window = 600_000, 512
    for ordinal in range(frontier - window):
        progress.add(ordinal, 0, 100, 100)
    for ordinal in range(frontier - window, frontier + window):
        if rng.random() < 0.5:
            progress.add(ordinal, 0, 100, 100)
        else:
            progress.add(ordinal, 0, rng.randrange(1, 100), None)
    size = len(json.dumps(progress.to_json()))
    assert len(progress.done) < window
    assert size < 32 * 1024, size


def _expand(mix: ShardMix) -> list[str]:
    """The object of every record of the shard, one by one (what ``trained`` avoids)."""
    names = []
    for state, count, at, stop, slots, by_source in mix.steps:
        if by_source is None:
            drawn = choice.KERNEL.picks(len(slots), count, state)[0]
        else:
            groups, rates, credits = by_source
            drawn = choice.KERNEL.source_picks(
                array("I", groups).tobytes(),
                array("Q", rates).tobytes(),
                array("q", credits),
                count,
                state,
            )[0]
        picks = memoryview(drawn).cast("I")
        names += [mix.objects[slots[p]].name for p in picks[at:stop]]
    return names


def test_a_shard_mix_tells_which_objects_the_first_k_records_came_from() -> None:
    parts = tuple(ShardPart(f"e00000-00000000{i}-{'0' * 24}", 0, 0, False) for i in range(3))
    steps = (
        (11, 50, 0, 20, (0, 1), None),
        (11, 50, 20, 50, (0, 1), None),
        (99, 30, 0, 25, (0, 1, 2), None),
    )
    mix = ShardMix.decode(ShardMix(parts, steps).encode())
    every = _expand(mix)
    for k in (0, 1, 19, 20, 21, 50, 60, 75):
        assert mix.trained(k) == {n: c for n, c in Counter(every[:k]).items()}


def test_a_shard_mix_drawn_by_source_tells_which_objects_the_first_k_records_came_from() -> None:
    """Steps drawn by source (``sources:``): each slot's source, the rates and the credits
    before the draw are kept, and ``trained`` redraws the same choices from them."""
    parts = tuple(ShardPart(f"e00000-00000000{i}-{'0' * 24}", 0, 0, False) for i in range(4))
    by_source = ((0, 1, 0, 2), (3 << 30, 1 << 30, 1 << 28), (5, -7, 2))
    steps = (
        (11, 60, 0, 30, (0, 1, 2, 3), by_source),
        (11, 60, 30, 60, (0, 1, 2, 3), by_source),
        (99, 30, 0, 25, (0, 1, 2), None),
    )
    mix = ShardMix.decode(ShardMix(parts, steps).encode())
    assert mix.steps == steps
    every = _expand(mix)
    assert every != _expand(ShardMix(parts, tuple((*s[:5], None) for s in steps)))
    for k in (0, 1, 29, 30, 31, 60, 70, 85):
        assert mix.trained(k) == {n: c for n, c in Counter(every[:k]).items()}


def test_records_already_trained_are_left_out_of_an_objects_batches() -> None:
    records = [bytes([i]) * (i + 1) for i in range(10)]
    batches = [
        Frames.of(*choice.KERNEL.frame_records(records[:4])),
        Frames.of(*choice.KERNEL.frame_records(records[4:])),
    ]
    kept = [p for f in without(batches, [[0, 2], [3, 6], [9, 10]]) for p in f.payloads()]
    assert kept == [records[2], records[6], records[7], records[8]]
    assert [p for f in without(batches, []) for p in f.payloads()] == records


def _config(root: Path, positions: Path, workers: int, index: int = 0) -> Config:
    sharding = {"num_workers": workers, "worker_index": index, "resume_from": str(positions)}
    return unit_config(root, sharding=sharding)


def _save(positions: Path, config: Config, index: int, workers: int, **fields: Any) -> None:
    job = {**job_for(config), "host": [index, workers]}
    job.pop("resumed", None)
    raw = {"version": 2, "epoch": 0, "consumed": [], "records": {}, "job": job, **fields}
    (positions / f"host{index}.json").write_text(json.dumps(raw))


def test_a_missing_host_position_is_named(tmp_path: Path) -> None:
    positions = tmp_path / "positions"
    positions.mkdir()
    plain = unit_config(tmp_path)
    for index in (0, 2):
        _save(positions, plain, index, 3, objects={"epoch": 0, "done": [], "partial": {}})
    with pytest.raises(ResumeError, match=r"no position of host 1 of 3 .*\[1, 3\]"):
        read_host_positions(_config(tmp_path, positions, 2))


def test_positions_of_another_dataset_or_without_objects_are_refused(tmp_path: Path) -> None:
    positions = tmp_path / "positions"
    positions.mkdir()
    plain = unit_config(tmp_path)
    _save(positions, plain, 0, 1, consumed=["e00000-w00-0000001.tfrecord"])
    with pytest.raises(ResumeError, match="does not say which objects"):
        read_host_positions(_config(tmp_path, positions, 2))
    other = unit_config(tmp_path, epochs={"seed": 5})
    _save(positions, other, 0, 1)
    with pytest.raises(ResumeError, match=r"another dataset or epochs\.seed"):
        read_host_positions(_config(tmp_path, positions, 2))


def test_a_second_change_of_hosts_inside_the_resumed_epoch_is_refused(tmp_path: Path) -> None:
    positions, again = tmp_path / "positions", tmp_path / "again"
    positions.mkdir()
    again.mkdir()
    plain = unit_config(tmp_path)
    _save(positions, plain, 0, 1, objects={"epoch": 0, "done": [], "partial": {}})
    resumed = _config(tmp_path, positions, 2)
    assert job_for(resumed)["resumed"] == 0
    for index in (0, 1):
        _save(again, plain, index, 2)
        raw = json.loads((again / f"host{index}.json").read_text())
        raw["job"]["resumed"] = 0
        (again / f"host{index}.json").write_text(json.dumps(raw))
    with pytest.raises(ResumeError, match="only once that epoch is over"):
        read_host_positions(_config(tmp_path, again, 3))


def test_the_job_tag_is_pure_and_the_resumed_epoch_is_read_each_time_it_is_asked(
    tmp_path: Path,
) -> None:
    """``job_tag`` reads nothing: the resumed epoch is the caller's (``resumed_epoch`` reads
    the old hosts' positions, now, not from a cache filled by an earlier config)."""
    positions = tmp_path / "positions"
    positions.mkdir()
    plain = unit_config(tmp_path)
    _save(positions, plain, 0, 1, objects={"epoch": 0, "done": [], "partial": {}})
    resumed = _config(tmp_path, positions, 2)
    assert job_tag(resumed, 7)["resumed"] == 7
    assert "resumed" not in job_tag(plain, None)
    with pytest.raises(ValueError, match="resume_from"):
        job_tag(resumed, None)
    assert resumed_epoch(resumed) == 0 and resumed_epoch(plain) is None
    _save(positions, plain, 0, 1, epoch=1, objects={"epoch": 1, "done": [], "partial": {}})
    assert resumed_epoch(resumed) == 1
    assert job_for(resumed)["resumed"] == 1


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_the_new_hosts_split_exactly_what_the_old_ones_left(
    tmp_path: Path, old: int, new: int
) -> None:
    """Old hosts finished some objects and began others; the union of the new hosts'
    remainders is every other object once, with the trained records of the begun ones."""
    objects = [SourceObject(f"k/{i:04d}", 100 + i) for i in range(300)]
    listed = ShareTable.of(objects)
    rng = random.Random(old * 10 + new)
    positions = tmp_path / "positions"
    positions.mkdir()
    plain = unit_config(tmp_path)
    expected: dict[str, list[list[int]] | None] = {}
    for h in range(old):
        old_share = [o for o in objects if host_of(o.key, old) == h]
        order = epoch_order(old_share, seed=0, epoch=0, shuffle=True)
        progress = TrainedObjects(0)
        for ordinal, obj in enumerate(order):
            roll = rng.random()
            if roll < 0.4:
                progress.add(ordinal, 0, 5, 5)
            elif roll < 0.6:
                progress.add(ordinal, 0, 3, None)
                expected[obj.key] = [[0, 3]]
            else:
                expected[obj.key] = None
        _save(positions, plain, h, old, objects=progress.to_json())
    got: dict[str, list[list[int]] | None] = {}
    for j in range(new):
        (tmp_path / f"n{j}").mkdir()
        config = _config(tmp_path / f"n{j}", positions, new, j)
        share, remainder = split_remainder(listed, config, read_host_positions(config))
        assert all(host_of(o.key, new) == j for o in share)
        for row in remainder.rows:
            key = share[row].key
            assert key not in got
            got[key] = remainder.skips.get(row)
    assert got == expected


def test_a_dataloader_state_saved_as_json_gives_every_workers_position(tmp_path: Path) -> None:
    """A loader state holds one position per worker; a worker whose pass ended is at the next
    epoch and keeps the objects of the one it finished: they add up to the host's."""
    positions = tmp_path / "positions"
    positions.mkdir()
    plain = unit_config(tmp_path)
    job = {**job_for(plain), "host": [0, 1]}
    first, second = TrainedObjects(0), TrainedObjects(0)
    first.add(0, 0, 5, 5)
    second.add(1, 0, 2, None)
    workers = {
        "worker_0": {
            "version": 2,
            "epoch": 1,
            "consumed": [],
            "job": job,
            "objects": first.to_json(),
        },
        "worker_1": {
            "version": 2,
            "epoch": 0,
            "consumed": [],
            "job": job,
            "records": {"e00000-w00-0000003.tfrecord": 2},
            "objects": second.to_json(),
        },
    }
    state = {"_snapshot": {"_worker_snapshots": workers, "_main_snapshot": {"steps": 3}}}
    (positions / "host0.rank0.json").write_text(json.dumps(state))
    hosts = read_host_positions(_config(tmp_path, positions, 2))
    assert hosts.epoch == 0 and hosts.num_workers == 1
    assert hosts.trained[0].done == [[0, 1]] and hosts.trained[0].partial == {1: [[0, 2]]}


def test_prefetchd_check_says_whether_the_positions_are_all_there(tmp_path: Path) -> None:
    from prefetchd.commands.check import _check_resume_from

    positions = tmp_path / "positions"
    positions.mkdir()
    plain = unit_config(tmp_path)
    _save(positions, plain, 0, 2, objects={"epoch": 0, "done": [], "partial": {}})
    missing = _check_resume_from(_config(tmp_path, positions, 3))
    assert missing.level == "fail" and "no position of host 1 of 2" in missing.message
    _save(positions, plain, 1, 2)
    found = _check_resume_from(_config(tmp_path, positions, 3))
    assert found.level == "ok" and "all 2 hosts" in found.message


# --- the listing a position's ordinals are places in ----------------------------------------

OBJECTS = [SourceObject(f"k/{i:04d}", 100 + i, f"etag{i}") for i in range(60)]


def test_a_shares_listing_identity_is_its_count_and_a_digest_of_keys_sizes_and_etags() -> None:
    same = ShareTable.of(OBJECTS).identity()
    assert same.n == 60 and len(same.digest) == 16 and int(same.digest, 16) >= 0
    assert ShareTable.of(reversed(OBJECTS)).identity() == same, "depends on the listing's order"
    added = ShareTable.of([*OBJECTS, SourceObject("k/0030a", 5)]).identity()
    removed = ShareTable.of(OBJECTS[:30] + OBJECTS[31:]).identity()
    assert (added.n, removed.n) == (61, 59) and same.digest not in (added.digest, removed.digest)
    resized = [*OBJECTS[:7], SourceObject("k/0007", 1, "etag7"), *OBJECTS[8:]]
    rewritten = [*OBJECTS[:7], SourceObject("k/0007", 107, "other"), *OBJECTS[8:]]
    for changed in (resized, rewritten):
        other = ShareTable.of(changed).identity()
        assert other.n == same.n and other.digest != same.digest
    digest = ListingDigest()
    for obj in OBJECTS:
        digest.add(obj)
    assert digest.identity() == same


def test_a_positions_objects_carry_their_listing_and_older_ones_have_none() -> None:
    progress = TrainedObjects(2, listing=ListingId(60, "0123456789abcdef"))
    progress.add(4, 0, 3, None)
    raw = json.loads(json.dumps(progress.to_json()))
    assert raw["listing"] == {"n": 60, "digest": "0123456789abcdef"}
    assert TrainedObjects.from_json(raw) == progress
    assert TrainedObjects.from_json({"epoch": 2, "done": [], "partial": {}}).listing is None
    with pytest.raises(ValueError, match=r"objects\.listing"):
        TrainedObjects.from_json({"epoch": 2, "done": [], "partial": {}, "listing": {"n": 3}})
    other = TrainedObjects(2, listing=ListingId(61, "fedcba9876543210"))
    progress.merge(other)
    assert progress.unknown, "positions of one host over two listings added up silently"


def _old_positions(tmp_path: Path, objects: list[SourceObject], old: int, **kept: bool) -> Path:
    """Positions of ``old`` hosts over ``objects``, each having trained its first objects;
    ``kept[f"host{h}"] = False``: host h's position predates the listing (names none)."""
    positions = tmp_path / "positions"
    positions.mkdir()
    plain = unit_config(tmp_path)
    for h in range(old):
        share = ShareTable.of(o for o in objects if host_of(o.key, old) == h)
        progress = TrainedObjects(0, listing=share.identity())
        progress.add(0, 0, 5, 5)
        progress.add(1, 0, 2, None)
        raw = progress.to_json()
        if not kept.get(f"host{h}", True):
            del raw["listing"]
        _save(positions, plain, h, old, objects=raw)
    return positions


@pytest.mark.parametrize("change", ["added", "removed"])
def test_a_source_whose_keys_changed_since_the_old_job_is_refused(
    tmp_path: Path, change: str
) -> None:
    """A key added or removed moves the old hosts' ordinals: the new host refuses, naming the
    old host whose share changed and its counts then and now, instead of splitting wrongly."""
    positions = _old_positions(tmp_path, OBJECTS, 2)
    extra = SourceObject("k/0030a", 5, "new")
    gone = OBJECTS[30]
    now = [*OBJECTS, extra] if change == "added" else [o for o in OBJECTS if o != gone]
    moved = host_of((extra if change == "added" else gone).key, 2)
    then = sum(host_of(o.key, 2) == moved for o in OBJECTS)
    after = then + 1 if change == "added" else then - 1
    config = _config(tmp_path, positions, 3)
    hosts = read_host_positions(config)
    assert hosts.listings[moved].n == then
    expected = (
        rf"the source changed since the old job: host {moved} of 2 had {then} objects in its "
        rf"share then and has {after} now.*same keys as the old job \(a source\.manifest"
    )
    with pytest.raises(ResumeError, match=expected):
        split_remainder(ShareTable.of(now), config, hosts)
    assert split_remainder(ShareTable.of(OBJECTS), config, hosts)[1].rows, "the same keys pass"


def test_an_object_rewritten_under_its_key_is_refused_too(tmp_path: Path) -> None:
    positions = _old_positions(tmp_path, OBJECTS, 2)
    config = _config(tmp_path, positions, 3)
    hosts = read_host_positions(config)
    rewritten = [o if o.key != "k/0007" else SourceObject(o.key, o.size, "other") for o in OBJECTS]
    host = host_of("k/0007", 2)
    count = hosts.listings[host].n
    with pytest.raises(ResumeError, match=rf"{count} now \(other keys, sizes or ETags\)"):
        split_remainder(ShareTable.of(rewritten), config, hosts)


def test_positions_saved_before_the_listing_was_kept_still_resume_unchecked(
    tmp_path: Path,
) -> None:
    positions = _old_positions(tmp_path, OBJECTS, 2, host1=False)
    config = _config(tmp_path, positions, 3)
    hosts = read_host_positions(config)
    assert list(hosts.listings) == [0]
    now = [ShareTable.of(o for o in OBJECTS if host_of(o.key, 2) == h).identity() for h in (0, 1)]
    assert check_listings(hosts, now) == [1]
    changed = [*OBJECTS, *(SourceObject(f"z/{i}", 1) for i in range(4))]
    later = [ShareTable.of(o for o in changed if host_of(o.key, 2) == h).identity() for h in (0, 1)]
    if later[0] == now[0]:  # every new key went to host 1, which cannot be checked
        assert check_listings(hosts, later) == [1]
    else:
        with pytest.raises(ResumeError, match="host 0 of 2"):
            check_listings(hosts, later)


def test_positions_of_one_host_over_two_listings_are_refused(tmp_path: Path) -> None:
    positions = _old_positions(tmp_path, OBJECTS, 1)
    raw = json.loads((positions / "host0.json").read_text())
    raw["objects"]["listing"]["n"] += 1
    (positions / "host0.rank1.json").write_text(json.dumps(raw))
    with pytest.raises(ResumeError, match="host 0 were saved over different listings"):
        read_host_positions(_config(tmp_path, positions, 2))
