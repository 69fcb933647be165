"""Directories are private and refused when another user could redirect them; files are
created private and appear whole (``prefetchd/atomic.py``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from prefetchd.atomic import (
    dir_bytes,
    dir_problem,
    make_private_dir,
    open_append,
    write_atomic,
    write_new,
)
from prefetchd.errors import RuntimeFailure


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


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
