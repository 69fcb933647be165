"""A read shard's pages are freed by the daemon, not by the trainer: the trainer moves a finished
claim to ``done/`` (a rename), and the supervisor notes it delivered, then deletes it.

Deleting a shard costs the kernel ~0.2 CPU-s per GB (every page of it freed); measured in the
trainer's profile on small objects it was ~15 % of what reading cost there. These tests pin who
does the deletion and that the ledger hears of a shard before its file goes."""

from __future__ import annotations

from pathlib import Path

from prefetchd.config import Config
from prefetchd.consume.claims import retire
from prefetchd.consume.releaser import ShardReleaser
from prefetchd.exactly_once.ledger import read_ledger
from prefetchd.layout import Layout, claim_name, shard_name
from prefetchd.supervise.supervisor import Supervisor


def watching_supervisor(config: Config, layout: Layout) -> Supervisor:
    sup = Supervisor(config)
    sup.deliveries.watch(sup.ownership)
    return sup


def test_a_shard_its_claimant_read_goes_to_done_whole_and_the_trainer_frees_nothing(
    layout: Layout,
) -> None:
    releaser = ShardReleaser(layout)
    name = claim_name(releaser.claimant, shard_name(0, 1, 3))
    path = layout.ram_claimed / name
    path.write_bytes(b"r" * 65536)
    releaser.track(name)
    with open(path, "rb") as f:
        releaser.flush()
        f.read()
    releaser.flush()
    assert not path.exists()
    assert (layout.ram_done / name).stat().st_size == 65536, "the trainer deleted it"
    assert releaser.released == 1


def test_the_supervisor_notes_done_shards_delivered_then_deletes_them(
    config: Config, layout: Layout
) -> None:
    sup = watching_supervisor(config, layout)
    shards = [shard_name(0, 0, 1), shard_name(0, 1, 1)]
    for shard in shards:
        (layout.ram_done / claim_name("123xabcd", shard)).write_bytes(b"x" * 4096)
    foreign = layout.ram_done / "notes.txt"
    foreign.write_text("someone else's")
    sup.deliveries.note()
    assert read_ledger(layout)[1] == set(shards)
    assert list(layout.ram_done.iterdir()) == [foreign], "only its own files are deleted"


def test_a_shard_a_trainer_deleted_itself_is_still_noted(config: Config, layout: Layout) -> None:
    """An older trainer library deletes its claims: the daemon still hears of them."""
    sup = watching_supervisor(config, layout)
    shard = shard_name(0, 0, 2)
    claim = layout.ram_claimed / claim_name("123xabcd", shard)
    claim.write_bytes(b"x")
    claim.unlink()
    sup.deliveries.note()
    assert read_ledger(layout)[1] == {shard}


def test_without_done_an_older_ram_disk_gets_its_read_shards_deleted(tmp_path: Path) -> None:
    claimed, done = tmp_path / "claimed", tmp_path / "done"
    claimed.mkdir()
    (claimed / "a").write_bytes(b"x")
    retire(claimed, done, "a")
    assert not (claimed / "a").exists() and not done.exists()
    retire(claimed, done, "a")  # already gone: nothing to do, no error
