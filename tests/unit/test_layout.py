"""Local names never come from object keys; layout makes every name, parses it into a named
result, and recognises as its own exactly the names it makes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from prefetchd.config import config_from_dict
from prefetchd.layout import (
    Layout,
    LedgerName,
    ShardClaim,
    ShardName,
    claim_name,
    claimed_object,
    claimed_shard,
    epoch_prefix,
    file_epoch,
    is_own_file,
    key_hash,
    object_digest,
    object_name,
    parse_claim_name,
    parse_object_name,
    parse_shard_name,
    shard_name,
    writer_claim_name,
)

HOSTILE_KEYS = [
    "../../etc/passwd",
    "/abs/path",
    "a/../../b",
    "..",
    ".",
    "",
    "x" * 1000,
    "dir/" * 300 + "file",
    "é/ü/日本語/🙂",
    "\u202eevil\u202c.txt",  # right-to-left override
    "a\x00b",
    "line\nbreak\r\n",
    "\udcff\udcfe",  # undecodable bytes kept by surrogateescape
    "C:\\Windows\\system32",
    "~root/.ssh/authorized_keys",
]


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- object names -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_object_name_of_a_hostile_key_is_a_plain_file_name(key: str, tmp_path: Path) -> None:
    digest = key_hash("bucket", key)
    name = object_name(3, 41, digest)
    assert "/" not in name and "\\" not in name
    assert ".." not in name
    assert name.isascii() and name.isprintable()
    assert len(name.encode()) < 255
    assert parse_object_name(name) == (3, 41, digest)
    # creating it really stays inside the directory
    (tmp_path / name).write_bytes(b"x")
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_key_hash_is_stable_and_distinguishes_keys_and_buckets() -> None:
    hashes = {key_hash("bucket", k) for k in HOSTILE_KEYS}
    assert len(hashes) == len(HOSTILE_KEYS)
    assert key_hash("bucket", "k") == key_hash("bucket", "k")
    assert key_hash("bucket", "k") != key_hash("bucket2", "k")
    # the separator keeps ("ab", "c") and ("a", "bc") apart
    assert key_hash("ab", "c") != key_hash("a", "bc")


@pytest.mark.parametrize(
    ("epoch", "seq"), [(0, 0), (7, 123), (99_999, 999_999_999), (123_456, 10**10)]
)
def test_object_name_round_trips(epoch: int, seq: int) -> None:
    digest = key_hash("b", "k")
    name = object_name(epoch, seq, digest)
    assert parse_object_name(name) == (epoch, seq, digest)
    assert name.startswith(epoch_prefix(epoch))


def test_epoch_prefix_does_not_match_other_epochs() -> None:
    digest = key_hash("b", "k")
    assert not object_name(10, 0, digest).startswith(epoch_prefix(1))
    assert not shard_name(10, 0, 0).startswith(epoch_prefix(1))
    assert not object_name(1, 0, digest).startswith(epoch_prefix(10))


def test_shard_and_object_names_sort_by_epoch_then_sequence() -> None:
    digest = key_hash("b", "k")
    names = [object_name(e, s, digest) for e in (0, 1, 2) for s in (0, 9, 10, 100)]
    assert sorted(names) == names
    shards = [shard_name(e, 0, c) for e in (0, 1) for c in (0, 9, 10, 1000)]
    assert sorted(shards) == shards


@pytest.mark.parametrize(
    "name",
    [
        "",
        "passwd",
        "e00000-000000000-abc",
        "e00000-000000000-" + "g" * 24,
        "e00000-000000000-" + "A" * 24,
        "e0000-000000000-" + "a" * 24,
        "e00000-000000000-" + "a" * 24 + ".part",
        ".e00000-000000000-" + "a" * 24,
        "e00000-000000000-" + "a" * 24 + "\n",  # regression: $ matched before a newline
        "e" + "\u0660" * 5 + "-000000000-" + "a" * 24,  # regression: non-ASCII digits
    ],
)
def test_parse_object_name_rejects_names_that_are_not_ours(name: str) -> None:
    assert parse_object_name(name) is None


# --- shard and claim names --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("epoch", "writer", "counter", "gzip"),
    [(0, 0, 0, False), (3, 12, 4567, False), (3, 12, 4567, True), (100_000, 100, 10**8, False)],
)
def test_shard_name_round_trips(epoch: int, writer: int, counter: int, gzip: bool) -> None:
    name = shard_name(epoch, writer, counter, gzip=gzip)
    assert name.endswith(".tfrecord.gz" if gzip else ".tfrecord")
    assert parse_shard_name(name) == (epoch, writer, counter)
    assert name.startswith(epoch_prefix(epoch))


@pytest.mark.parametrize(
    "name",
    [
        "",
        "data.tfrecord",
        "e00000-w00-0000000.tfrecord.part",
        "e00000-w00-0000000.tfrecord.gz.part",
        "e00000-w00-0000000.tfrecord.zst",
        ".e00000-w00-0000000.tfrecord",
        "e00000-w0-0000000.tfrecord",
        "e00000-w00-0000000.tfrecord\n",  # regression: $ matched before a newline
        "e00000-w\u0660\u0660-0000000.tfrecord",  # regression: non-ASCII digits
    ],
)
def test_parse_shard_name_rejects_names_that_are_not_shards(name: str) -> None:
    assert parse_shard_name(name) is None


@pytest.mark.parametrize("gzip", [False, True])
@pytest.mark.parametrize("owner", ["1", "4242", "4242a1b2c3d4", "Zz9"])
def test_claim_name_round_trips(owner: str, gzip: bool) -> None:
    shard = shard_name(2, 1, 17, gzip=gzip)
    name = claim_name(owner, shard)
    assert "/" not in name
    assert parse_claim_name(name) == (owner, shard)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "1234",
        "1234-",
        "-e00000-w00-0000000.tfrecord",
        "12_a-e00000-w00-0000000.tfrecord",
        "12 a-e00000-w00-0000000.tfrecord",
        "../x-e00000-w00-0000000.tfrecord",
        "1234-not-a-shard.tfrecord",
        "1234-e00000-w00-0000000.tfrecord.part",
        "1234-e00000-w00-0000000.tfrecord\n",
        "\u00b2-e00000-w00-0000000.tfrecord",  # superscript two: isdigit() but not int()
        "\u0661\u0662-e00000-w00-0000000.tfrecord",
    ],
)
def test_parse_claim_name_rejects_names_that_are_not_claims(name: str) -> None:
    assert parse_claim_name(name) is None


@pytest.mark.parametrize("writer", [0, 1, 12])
def test_writer_claim_name_round_trips(writer: int) -> None:
    obj = object_name(3, 42, key_hash("bucket", "a/key"))
    name = writer_claim_name(writer, obj)
    assert "/" not in name
    assert claimed_object(name) == obj


@pytest.mark.parametrize(
    "name",
    [
        "",
        "w0",
        "w0-",
        "x0-e00000-000000001-0123456789abcdef01234567",
        "w-e00000-000000001-0123456789abcdef01234567",
        "w\u00b2-e00000-000000001-0123456789abcdef01234567",
        "w0-e00000-000000001-0123456789abcdef01234567.part",
        "w0-not-an-object",
    ],
)
def test_claimed_object_rejects_names_that_are_not_writer_claims(name: str) -> None:
    assert claimed_object(name) is None


# --- the tree -------------------------------------------------------------------------------


def test_layout_create_makes_every_directory_private(tmp_path: Path) -> None:
    config = config_from_dict(
        {
            "source": {"url": "s3://bucket/data/"},
            "download": {"cache_dir": "cache"},
            "output": {"ram_dir": "ram"},
            "status": {"state_dir": "state"},
        },
        base_dir=tmp_path,
    )
    layout = Layout.of(config)
    layout.create()
    for path in layout.all_dirs():
        assert path.is_dir(), path
        assert mode_of(path) == 0o700, path
        assert path.resolve().is_relative_to(tmp_path.resolve())


@pytest.fixture
def tree(tmp_path: Path) -> Layout:
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    return layout


def test_parsed_names_are_named_results() -> None:
    obj = parse_object_name(object_name(3, 41, "ab" * 12))
    assert obj is not None and (obj.epoch, obj.seq, obj.digest) == (3, 41, "ab" * 12)
    assert object_digest(object_name(3, 41, "ab" * 12)) == "ab" * 12
    assert parse_shard_name(shard_name(2, 1, 7)) == ShardName(epoch=2, writer=1, counter=7)
    claim = claim_name("42xab", shard_name(0, 0, 1))
    assert parse_claim_name(claim) == ShardClaim(claimant="42xab", shard=shard_name(0, 0, 1))
    assert claimed_shard(claim) == shard_name(0, 0, 1)


def test_every_per_epoch_file_layout_names_is_its_own_and_knows_its_epoch(tree: Layout) -> None:
    """The start-up sweep and ``reset_epochs`` delete by ``is_own_file`` and ``file_epoch``:
    every name layout makes must pass both, with the epoch it was made for."""
    obj = object_name(12, 3, "cd" * 12)
    shard = shard_name(12, 1, 4)
    made = [
        tree.download_part(obj),
        Path(tree.meta_file(obj)),
        tree.cache_ready / obj,
        Path(tree.writer_claims(1) + obj),
        tree.shard_part(shard),
        tree.ram_ready / shard,
        tree.ram_claimed / claim_name("9x1", shard),
        tree.ram_done / claim_name("9x1", shard),
        tree.download_log(12),
        tree.downloaded_marker(12),
        tree.complete_marker(12),
        tree.epoch_listing(12),
        tree.keep_figures(12),
        tree.published_ledger(12, 1),
        tree.delivered_ledger(12),
    ]
    for path in made:
        assert is_own_file(path.parent.name, path.name), path
        assert file_epoch(path.name) == 12, path
    for path in (tree.journal_file(1), tree.parse_attempts_file(1), tree.child_report("w1")):
        assert path.parent in (tree.journal, tree.children), path
    assert is_own_file("journal", tree.journal_file(1).name)


def test_listings_find_only_the_names_layout_makes(tree: Layout) -> None:
    for path in (
        tree.published_ledger(0, 1),
        tree.delivered_ledger(0),
        tree.shards / "e0.notes",
        tree.journal_file(0),
        tree.journal_file(11),
        tree.parse_attempts_file(0),
        tree.download_log(2),
        tree.download_log(10),
        tree.download_logs / "x.log",
        tree.consumer_lock("42xab"),
        tree.consumer_lock_temp("43xcd"),
        tree.child_report("downloader"),
        tree.children / ".downloader.json.12.tmp",
    ):
        path.write_bytes(b"")
    assert [name for _, name in tree.ledger_files()] == [LedgerName(0, None), LedgerName(0, 1)]
    assert tree.journal_files() == {0: tree.journal_file(0), 11: tree.journal_file(11)}
    assert tree.download_log_epochs() == [2, 10]
    assert tree.consumer_locks() == {"42xab": tree.consumer_lock("42xab")}
    assert tree.child_reports() == {"downloader": tree.child_report("downloader")}
