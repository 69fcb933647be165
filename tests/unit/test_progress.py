"""What a position keeps for a resume on another number of hosts (``prefetchd/progress.py``),
the shard mix it is read from (``messages/shard_mix.py``) and the remainder each new host
works out (``download/rehost.py``)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from prefetchd.config import Config
from prefetchd.download.order import SourceObject, epoch_order, host_of
from prefetchd.download.rehost import split_remainder
from prefetchd.download.share import ShareTable
from prefetchd.kernel import choice
from prefetchd.messages.shard_mix import ShardMix, ShardPart
from prefetchd.progress import (
    ALL_TRAINED,
    ObjectProgress,
    ResumeError,
    add_range,
    in_ranges,
    job_tag,
    read_host_positions,
)
from prefetchd.write.frames import Frames, without

from .configs import unit_config


def test_ranges_merge_and_answer_membership() -> None:
    ranges: list[list[int]] = []
    for a, b in [(5, 7), (0, 2), (2, 3), (10, 12), (6, 11)]:
        add_range(ranges, a, b)
    assert ranges == [[0, 3], [5, 12]]
    assert [v for v in range(14) if in_ranges(ranges, v)] == [0, 1, 2, *range(5, 12)]


def test_an_object_is_done_once_every_record_up_to_its_last_was_trained() -> None:
    progress = ObjectProgress(3)
    progress.add(7, 0, 10, None)
    progress.add(7, 20, 5, 25)  # its last part, trained before the middle one
    assert progress.trained(7) == [[0, 10], [20, 25]]
    progress.add(7, 10, 10, None)
    assert progress.trained(7) is ALL_TRAINED and progress.done == [[7, 8]]
    progress.add(8, 0, 0, 0)  # an object without records, drained
    assert progress.done == [[7, 9]] and not progress.partial
    again = ObjectProgress.from_json(json.loads(json.dumps(progress.to_json())))
    assert again == progress


def test_positions_of_two_trainer_processes_of_a_host_add_up() -> None:
    one, two = ObjectProgress(0), ObjectProgress(0)
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
    progress = ObjectProgress(0)
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
    for state, count, at, stop, slots in mix.steps:
        picks = memoryview(choice.KERNEL.picks(len(slots), count, state)[0]).cast("I")
        names += [mix.objects[slots[p]].name for p in picks[at:stop]]
    return names


def test_a_shard_mix_tells_which_objects_the_first_k_records_came_from() -> None:
    parts = tuple(ShardPart(f"e00000-00000000{i}-{'0' * 24}", 0, 0, False) for i in range(3))
    steps = ((11, 50, 0, 20, (0, 1)), (11, 50, 20, 50, (0, 1)), (99, 30, 0, 25, (0, 1, 2)))
    mix = ShardMix.decode(ShardMix(parts, steps).encode())
    every = _expand(mix)
    for k in (0, 1, 19, 20, 21, 50, 60, 75):
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
    job = {**job_tag(config), "host": [index, workers]}
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
    assert job_tag(resumed)["resumed"] == 0
    for index in (0, 1):
        _save(again, plain, index, 2)
        raw = json.loads((again / f"host{index}.json").read_text())
        raw["job"]["resumed"] = 0
        (again / f"host{index}.json").write_text(json.dumps(raw))
    with pytest.raises(ResumeError, match="only once that epoch is over"):
        read_host_positions(_config(tmp_path, again, 3))


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
        progress = ObjectProgress(0)
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
    job = {**job_tag(plain), "host": [0, 1]}
    first, second = ObjectProgress(0), ObjectProgress(0)
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
    assert hosts.progress[0].done == [[0, 1]] and hosts.progress[0].partial == {1: [[0, 2]]}


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
