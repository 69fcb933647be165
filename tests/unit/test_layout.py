"""Local names never come from object keys; directories are private; writes are atomic."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from prefetchd.config import config_from_dict
from prefetchd.errors import RuntimeFailure
from prefetchd.layout import (
    Layout,
    claim_name,
    claimed_object,
    dir_bytes,
    dir_problem,
    epoch_prefix,
    key_hash,
    make_private_dir,
    object_name,
    open_append,
    parse_claim_name,
    parse_object_name,
    parse_shard_name,
    shard_name,
    write_atomic,
    write_new,
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


# --- private directories ----------------------------------------------------------------------


def test_make_private_dir_creates_0700_with_parents(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c"
    make_private_dir(path)
    assert path.is_dir()
    assert mode_of(path) == 0o700
    assert mode_of(path.parent) == 0o700


def test_make_private_dir_ignores_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        make_private_dir(tmp_path / "d")
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "d") == 0o700


def test_make_private_dir_tightens_our_own_0750_dir(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.mkdir()
    path.chmod(0o750)
    (path / "kept").write_bytes(b"data")
    make_private_dir(path, tighten=True)
    assert mode_of(path) == 0o700
    assert (path / "kept").read_bytes() == b"data"


def test_make_private_dir_never_changes_the_mode_of_a_dir_it_did_not_make(tmp_path: Path) -> None:
    """docs/reliability.md invariant 7: an existing directory someone else made keeps its mode."""
    path = tmp_path / "d"
    path.mkdir()
    path.chmod(0o750)
    assert make_private_dir(path) is False
    assert mode_of(path) == 0o750


def test_make_private_dir_accepts_an_existing_private_dir(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.mkdir(mode=0o700)
    make_private_dir(path)
    make_private_dir(path)
    assert mode_of(path) == 0o700


def test_make_private_dir_refuses_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(RuntimeFailure) as info:
        make_private_dir(link)
    assert str(link) in str(info.value)
    assert "symlink" in str(info.value)


def test_make_private_dir_refuses_a_dangling_symlink(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(RuntimeFailure, match="symlink"):
        make_private_dir(link)
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o702])
def test_make_private_dir_refuses_a_dir_others_can_write(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "shared"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(RuntimeFailure) as info:
        make_private_dir(path)
    assert str(path) in str(info.value)
    assert "writable" in str(info.value)
    assert mode_of(path) == mode, "an unsafe dir is reported, not silently changed"


def test_make_private_dir_refuses_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"")
    with pytest.raises(RuntimeFailure) as info:
        make_private_dir(path)
    assert str(path) in str(info.value)


def test_make_private_dir_under_a_regular_file_is_a_clear_failure(tmp_path: Path) -> None:
    # regression: a parent that is a file escaped as a raw NotADirectoryError traceback
    (tmp_path / "file").write_bytes(b"")
    path = tmp_path / "file" / "sub"
    with pytest.raises(RuntimeFailure) as info:
        make_private_dir(path)
    assert str(path) in str(info.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_make_private_dir_refuses_another_users_dir(tmp_path: Path) -> None:
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(RuntimeFailure) as info:
        make_private_dir(path)
    assert str(path) in str(info.value)
    assert "another user" in str(info.value)


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


# --- atomic writes ----------------------------------------------------------------------------


def test_write_atomic_writes_a_private_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_atomic(path, b'{"state": "running"}')
    assert path.read_bytes() == b'{"state": "running"}'
    assert mode_of(path) == 0o600
    assert os.listdir(tmp_path) == ["status.json"]


def test_write_atomic_replaces_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_atomic(path, b"old")
    write_atomic(path, b"new", fsync=True)
    assert path.read_bytes() == b"new"
    assert mode_of(path) == 0o600
    assert os.listdir(tmp_path) == ["status.json"]


def test_write_atomic_file_is_private_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        write_atomic(tmp_path / "f", b"x")
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "f") == 0o600


def test_failed_write_atomic_keeps_the_old_file_and_removes_its_temp(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_atomic(path, b"old")
    with pytest.raises(TypeError):
        write_atomic(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["status.json"]


# --- byte accounting --------------------------------------------------------------------------


def test_dir_bytes_sums_file_sizes_over_several_dirs(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "one").write_bytes(b"x" * 1000)
    (a / "two").write_bytes(b"")
    (b / "three").write_bytes(b"y" * 24)
    assert dir_bytes(a) == 1000
    assert dir_bytes(a, b) == 1024
    assert dir_bytes(a, tmp_path / "missing", b) == 1024
    assert dir_bytes() == 0


def test_dir_bytes_counts_only_regular_files(tmp_path: Path) -> None:
    # regression: subdirectories and symlinks were counted, unlike the docstring says
    (tmp_path / "shard").write_bytes(b"z" * 100)
    (tmp_path / "subdir").mkdir()
    (tmp_path / "subdir" / "nested").write_bytes(b"n" * 5000)
    (tmp_path / "link").symlink_to(tmp_path / "shard")
    assert dir_bytes(tmp_path) == 100


def test_dir_bytes_of_a_missing_dir_is_zero(tmp_path: Path) -> None:
    assert dir_bytes(tmp_path / "missing") == 0


def shared_dir(tmp_path: Path, mode: int = 0o1777) -> Path:
    """A directory anyone may create names in, like /dev/shm or /tmp."""
    shared = tmp_path / "shm"
    shared.mkdir()
    shared.chmod(mode)
    return shared


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a name as another user")
def test_make_private_dir_refuses_a_symlink_another_user_planted_above_it(tmp_path: Path) -> None:
    """ram_dir /dev/shm/prefetchd/train, and someone else made /dev/shm/prefetchd a symlink to
    a directory of theirs: nothing may be created through it."""
    victim = tmp_path / "victim"
    victim.mkdir()
    link = shared_dir(tmp_path) / "prefetchd"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)
    with pytest.raises(RuntimeFailure) as info:
        make_private_dir(link / "train")
    assert "symlink" in str(info.value) and "another user" in str(info.value)
    assert list(victim.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a name as another user")
def test_make_private_dir_refuses_a_directory_another_user_planted_above_it(
    tmp_path: Path,
) -> None:
    planted = shared_dir(tmp_path) / "prefetchd"
    planted.mkdir(mode=0o755)
    os.chown(planted, 65534, 65534)
    with pytest.raises(RuntimeFailure, match="belongs to another user"):
        make_private_dir(planted / "train")
    assert list(planted.iterdir()) == []


def test_make_private_dir_under_a_shared_dir_without_sticky_bit_is_refused(
    tmp_path: Path,
) -> None:
    shared = shared_dir(tmp_path, 0o777)
    with pytest.raises(RuntimeFailure, match="not sticky"):
        make_private_dir(shared / "prefetchd" / "train")


def test_make_private_dir_in_a_sticky_shared_dir_creates_private_ancestors(
    tmp_path: Path,
) -> None:
    path = shared_dir(tmp_path) / "prefetchd" / "train"
    make_private_dir(path)
    assert mode_of(path) == mode_of(path.parent) == 0o700
    make_private_dir(path)  # and accepts it the next time


def test_make_private_dir_follows_our_own_symlink_above_it(tmp_path: Path) -> None:
    """Like /var/run -> /run: a link only we or root could have made is fine."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "alias").symlink_to(real)
    make_private_dir(tmp_path / "alias" / "state")
    assert mode_of(real / "state") == 0o700


def test_open_append_creates_a_private_log_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "e0.log"
    for line in (b"P a\n", b"P b\n"):
        fd = open_append(path)
        os.write(fd, line)
        os.close(fd)
    assert path.read_bytes() == b"P a\nP b\n"
    assert mode_of(path) == 0o600


def test_open_append_never_writes_through_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / "e0.log").symlink_to(victim)
    with pytest.raises(OSError):
        open_append(tmp_path / "e0.log")
    assert victim.read_bytes() == b"keep"


def test_dir_problem_reports_without_changing_anything(tmp_path: Path) -> None:
    missing = tmp_path / "new" / "dir"
    assert dir_problem(missing) is None
    assert not (tmp_path / "new").exists()
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    assert "writable by other users" in str(dir_problem(loose))
    assert mode_of(loose) == 0o777
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    assert "symlink" in str(dir_problem(link))


def test_write_new_creates_a_private_file_and_never_overwrites(tmp_path: Path) -> None:
    """A first meta is written without a temp name; one that exists (a reader may hold it)
    is left to write_atomic, and a symlink is never followed."""
    path = tmp_path / "m.json"
    assert write_new(path, b'{"a": 1}')
    assert path.read_bytes() == b'{"a": 1}'
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not write_new(path, b"{}")
    assert path.read_bytes() == b'{"a": 1}'
    target = tmp_path / "elsewhere"
    (tmp_path / "link.json").symlink_to(target)
    assert not write_new(tmp_path / "link.json", b"{}")
    assert not target.exists()
