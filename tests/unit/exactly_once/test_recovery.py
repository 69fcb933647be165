"""A restarted daemon that finds published shards gone: the ledger tells what trainers had read;
it starts the affected epochs again when nothing of them was read, and fails with the reason
otherwise (``exactly_once/ledger.py``, ``exactly_once/recovery.py``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefetchd.config import config_from_dict
from prefetchd.consume.claims import retire
from prefetchd.exactly_once.journal import Journal, JournalEntry
from prefetchd.exactly_once.ledger import (
    Commit,
    assess,
    forget_epoch,
    published_shards,
    read_ledger,
    record_delivered,
    record_published,
)
from prefetchd.exactly_once.recovery import recover, write_disks
from prefetchd.layout import Layout, claim_name, object_name, shard_name, writer_claim_name
from prefetchd.owner import Ownership, claim_dirs

S0, S1, S2 = (shard_name(0, 0, c) for c in range(3))


def test_a_ledger_line_counts_only_once_its_journal_commit_happened() -> None:
    candidates = {S0: 5, S1: 6, S2: 7}
    # writer 0's last commit is shard 1: shard 2's line was written, its commit never was
    assert published_shards(candidates, {0: Commit(1, S1)}) == {S0: 5, S1: 6}
    # a commit that only released objects, at counter 2: shards 0 and 1 are published
    assert published_shards(candidates, {0: Commit(2, None)}) == {S0: 5, S1: 6}


def test_assess_trusts_the_files_while_the_ram_disk_is_intact() -> None:
    found = assess({S0: 5, S1: 6, S2: 7}, {S0}, {S2}, intact=True)
    assert found.delivered == {S0, S1} and not found.lost
    lost = assess({S0: 5, S1: 6, S2: 7}, {S0}, set(), intact=False)
    assert lost.delivered == {S0} and lost.lost == {S1: 6, S2: 7}
    assert lost.first_lost_epoch == 0 and lost.lost_records() == 13


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[tuple[Layout, Ownership]]:
    config = config_from_dict(
        {
            "source": {"url": "s3://bucket/data/"},
            "download": {"cache_dir": "cache"},
            "output": {"ram_dir": "ram"},
            "status": {"state_dir": "state"},
        },
        base_dir=tmp_path,
    )
    lay = Layout.of(config)
    owned = claim_dirs(lay, config)
    lay.create()
    yield lay, owned
    owned.close()


def publish(lay: Layout, epoch: int, counter: int, records: int) -> str:
    name = shard_name(epoch, 0, counter)
    record_published(lay, 0, name, records)
    (lay.ram_ready / name).write_bytes(b"x")
    return name


def read_by_trainer(lay: Layout, shard: str) -> None:
    """What ``ready_files()`` does with a shard: claim it, and once read retire it to done/."""
    claimed = claim_name("7x1", shard)
    os.rename(lay.ram_ready / shard, lay.ram_claimed / claimed)
    retire(lay.ram_claimed, lay.ram_done, claimed)


def lose_ram(lay: Layout) -> None:
    """As a reboot does: the shards go, and the disks.json token no longer matches."""
    for d in lay.ram_shard_dirs:
        for name in os.listdir(d):
            os.unlink(d / name)
    raw = json.loads(lay.disks_file.read_text())
    raw["tokens"]["output.ram_dir"] = "an-earlier-incarnation"
    lay.disks_file.write_text(json.dumps(raw))


def test_shards_lost_after_some_of_their_epoch_was_read_fail_with_the_reason(
    layout: tuple[Layout, Ownership],
) -> None:
    lay, owned = layout
    write_disks(lay, owned)
    first, second = publish(lay, 0, 0, 40), publish(lay, 0, 1, 60)
    Journal(lay.journal_file(0)).rewrite(JournalEntry(second, 1, {}, ()))
    read_by_trainer(lay, first)
    record_delivered(lay, [first])
    lose_ram(lay)
    reason = recover(lay, owned)
    assert reason is not None
    assert "1 published shards of epoch 0 (60 records)" in reason
    assert str(lay.ram) in reason and str(lay.job_file) in reason
    assert "\n" not in reason


def test_shards_lost_before_anything_of_their_epoch_was_read_start_the_epoch_again(
    layout: tuple[Layout, Ownership],
) -> None:
    lay, owned = layout
    write_disks(lay, owned)
    kept = publish(lay, 0, 0, 40)
    Journal(lay.journal_file(0)).rewrite(JournalEntry(kept, 0, {}, ()))
    read_by_trainer(lay, kept)
    record_delivered(lay, [kept])
    (lay.epochs / "0.complete").write_text("{}")
    later = publish(lay, 1, 1, 50)
    obj = object_name(1, 3, "a" * 24)
    (lay.cache_claimed / writer_claim_name(0, obj)).write_bytes(b"raw")
    (lay.cache_meta / f"{obj}.json").write_text("{}")
    lay.download_log(1).write_text("P " + "a" * 24 + "\n")
    Journal(lay.journal_file(0)).rewrite(JournalEntry(later, 1, {obj: 4}, ()))
    lose_ram(lay)
    assert recover(lay, owned) is None
    # epoch 1 is forgotten, to be downloaded and written again; epoch 0 stays done
    assert (lay.epochs / "0.complete").exists()
    assert not lay.download_log(1).exists()
    assert os.listdir(lay.cache_claimed) == [] and os.listdir(lay.cache_meta) == []
    head = Journal(lay.journal_file(0)).last()
    assert head is not None and head.shard is None and head.positions == {}
    published, delivered = read_ledger(lay)
    assert published == {kept: 40} and delivered == {kept}


def test_a_partly_written_object_gone_from_the_cache_is_a_loss(
    layout: tuple[Layout, Ownership],
) -> None:
    lay, owned = layout
    write_disks(lay, owned)
    shard = publish(lay, 0, 0, 10)
    read_by_trainer(lay, shard)
    obj = object_name(0, 1, "b" * 24)
    Journal(lay.journal_file(0)).rewrite(JournalEntry(shard, 0, {obj: 3}, ()))
    reason = recover(lay, owned)  # the RAM disk is intact: the shard was read
    assert reason is not None and obj in reason and "download.cache_dir" in reason
    assert read_ledger(lay)[1] == {shard}  # what trainers finished is remembered


def test_a_shard_in_done_at_a_restart_was_read_and_is_remembered_as_such(
    layout: tuple[Layout, Ownership],
) -> None:
    """A trainer moved it to done/ while the daemon was down (or just before it crashed)."""
    lay, owned = layout
    write_disks(lay, owned)
    shard = publish(lay, 0, 0, 10)
    Journal(lay.journal_file(0)).rewrite(JournalEntry(shard, 0, {}, ()))
    read_by_trainer(lay, shard)
    assert (lay.ram_done / claim_name("7x1", shard)).exists()
    assert recover(lay, owned) is None
    assert read_ledger(lay)[1] == {shard}


def test_an_intact_restart_finds_nothing_to_do(layout: tuple[Layout, Ownership]) -> None:
    lay, owned = layout
    write_disks(lay, owned)
    shard = publish(lay, 0, 0, 10)
    Journal(lay.journal_file(0)).rewrite(JournalEntry(shard, 0, {}, ()))
    assert recover(lay, owned) is None
    assert (lay.ram_ready / shard).exists()


def test_the_ledger_of_an_epoch_read_to_the_end_can_be_forgotten(
    layout: tuple[Layout, Ownership],
) -> None:
    lay, _ = layout
    first, later = publish(lay, 0, 0, 10), publish(lay, 1, 1, 20)
    record_delivered(lay, [first])
    for epoch in (0, 1):
        lay.epoch_listing(epoch).write_text('{"n": 1, "digest": "00"}')
    forget_epoch(lay, 0)
    published, delivered = read_ledger(lay)
    assert published == {later: 20} and delivered == set()
    assert not lay.epoch_listing(0).exists() and lay.epoch_listing(1).exists()
