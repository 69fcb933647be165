"""Spare files (``prefetchd/spares.py``): a writer's finished files become the downloader's next
``.part`` files and metas, empty, private, never over an existing file, and a full pool or a
kept object falls back to deleting."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from prefetchd import spares as spares_module
from prefetchd.download.restart import roll_forward
from prefetchd.layout import Layout, is_own_file, is_spare, spare_name
from prefetchd.spares import SpareGiver, Spares
from tests.unit.configs import unit_config


@pytest.fixture
def tmp_dir(tmp_path: Path) -> Path:
    d = tmp_path / ".tmp"
    d.mkdir()
    return d


@pytest.fixture(autouse=True)
def list_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pause between two listings is about time; these tests are about what is taken.
    monkeypatch.setattr(spares_module, "RELIST_AFTER", 0.0)


def finished(tmp_path: Path, name: str, data: bytes = b"x" * 100_000) -> Path:
    """A file a writer is done with, private as the downloader creates every one."""
    path = tmp_path / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)
    return path


def spares_in(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if is_spare(n))


def test_a_given_file_becomes_an_empty_spare_and_then_the_next_part_file(
    tmp_path: Path, tmp_dir: Path
) -> None:
    done = finished(tmp_path, "claimed-object")
    inode = done.stat().st_ino
    SpareGiver(tmp_dir, 0).give(str(done))
    assert not done.exists()
    assert spares_in(tmp_dir) == [spare_name(0, 0)]
    assert (tmp_dir / spare_name(0, 0)).stat().st_size == 0  # no bytes of the old object

    pool = Spares(tmp_dir)
    part = tmp_dir / "obj.part"
    fd = pool.create(part, readable=True)
    try:
        os.write(fd, b"new object")
        assert os.pread(fd, 100, 0) == b"new object"
    finally:
        os.close(fd)
    assert part.stat().st_ino == inode  # the same inode: none made, none freed
    assert stat.S_IMODE(part.stat().st_mode) == 0o600  # as private as it was made
    assert spares_in(tmp_dir) == []
    assert pool.taken == 1


def test_with_no_spare_a_file_is_created_as_before(tmp_dir: Path) -> None:
    pool = Spares(tmp_dir)
    assert pool.write_new(tmp_dir / "meta.json", b"{}")
    assert (tmp_dir / "meta.json").read_bytes() == b"{}"
    assert pool.taken == 0


def test_a_spare_never_replaces_an_existing_file(tmp_path: Path, tmp_dir: Path) -> None:
    SpareGiver(tmp_dir, 0).give(str(finished(tmp_path, "a")))
    existing = tmp_dir / "meta.json"
    existing.write_bytes(b'{"key": "kept"}')
    pool = Spares(tmp_dir)
    assert not pool.write_new(existing, b'{"key": "other"}')  # as atomic.write_new
    assert existing.read_bytes() == b'{"key": "kept"}'
    with pytest.raises(FileExistsError):
        pool.create(existing)
    assert existing.read_bytes() == b'{"key": "kept"}'
    assert spares_in(tmp_dir) == [spare_name(0, 0)]  # still there for the next file


def test_a_meta_made_from_a_spare_holds_exactly_its_data(tmp_path: Path, tmp_dir: Path) -> None:
    giver, pool = SpareGiver(tmp_dir, 0), Spares(tmp_dir)
    giver.give(str(finished(tmp_path, "old-meta", b'{"key": "a much longer old key"}')))
    meta = tmp_dir / "new.json"
    assert pool.write_new(meta, b'{"key": "k"}')
    assert meta.read_bytes() == b'{"key": "k"}'
    assert pool.taken == 1


def test_the_pool_is_bounded_per_writer(
    tmp_path: Path, tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spares_module, "MAX_SPARES", 8)
    giver = SpareGiver(tmp_dir, 3)
    for i in range(8 + 5):
        giver.give(str(finished(tmp_path, f"f{i}", b"y")))
    assert len(spares_in(tmp_dir)) == 8  # the oldest replaced: their inodes freed
    assert all(n.startswith("spare-w3-") for n in spares_in(tmp_dir))
    assert [p for p in tmp_path.iterdir() if p.name.startswith("f")] == []


def test_a_file_already_gone_is_no_error(tmp_path: Path, tmp_dir: Path) -> None:
    SpareGiver(tmp_dir, 0).give(str(tmp_path / "never-there"))
    SpareGiver(tmp_dir, 0, enabled=False).give(str(tmp_path / "never-there"))
    assert spares_in(tmp_dir) == []


def test_disabled_the_writer_deletes_and_a_hard_link_keeps_its_bytes(
    tmp_path: Path, tmp_dir: Path
) -> None:
    # download.keep hard-links objects into keep/: emptying one would empty the kept copy.
    done = finished(tmp_path, "claimed-object", b"kept bytes")
    os.link(done, tmp_path / "kept-copy")
    SpareGiver(tmp_dir, 0, enabled=False).give(str(done))
    assert not done.exists()
    assert spares_in(tmp_dir) == []
    assert (tmp_path / "kept-copy").read_bytes() == b"kept bytes"


def test_writers_delete_instead_with_download_keep(tmp_path: Path) -> None:
    from prefetchd.child.context import ChildContext
    from prefetchd.write.writer import Writer

    for keep, enabled in ((0, True), ("1GiB", False)):
        root = tmp_path / str(keep)
        root.mkdir()
        config = unit_config(root, download={"keep": keep})
        Layout.of(config).create()
        writer = Writer(ChildContext("writer-0", config), 0)
        assert writer.reader.spares.enabled is enabled


def test_spares_are_ours_and_swept_by_the_downloader_at_start_up(
    tmp_path: Path, tmp_dir: Path
) -> None:
    config = unit_config(tmp_path)
    layout = Layout.of(config)
    layout.create()
    SpareGiver(layout.cache_tmp, 1).give(str(finished(tmp_path, "a")))
    assert is_own_file(".tmp", spare_name(1, 0))  # a new job's wipe deletes them too
    assert not is_spare("spare-w1-0.part") and not is_spare("spare-wx-1")
    roll_forward(layout, {})
    assert os.listdir(layout.cache_tmp) == []


def test_without_a_tmp_dir_files_are_created_as_before(tmp_path: Path) -> None:
    pool = Spares(tmp_path / "no-such-dir")
    fd = pool.create(tmp_path / "obj.part")
    os.close(fd)
    assert (tmp_path / "obj.part").exists()
    assert pool.taken == 0


def test_one_pool_per_directory_in_a_process(tmp_path: Path, tmp_dir: Path) -> None:
    # The .part files (main thread) and the metas (transfer threads) drew from two pools that
    # listed the same names: half their renames found the spare already taken.
    assert Spares.shared(tmp_dir) is Spares.shared(str(tmp_dir))
    assert Spares.shared(tmp_dir) is not Spares.shared(tmp_path)
    giver, pool = SpareGiver(tmp_dir, 0), Spares.shared(tmp_dir)
    for i in range(4):
        giver.give(str(finished(tmp_path, f"f{i}")))
    made = [pool.write_new(tmp_dir / f"meta{i}", b"{}") for i in range(2)]
    made += [pool.take(str(tmp_dir / f"part{i}")) for i in range(2)]
    assert made == [True] * 4
    assert pool.taken == 4 and spares_in(tmp_dir) == []


def test_a_stopping_writer_deletes_every_spare_and_nothing_else(
    tmp_path: Path, tmp_dir: Path
) -> None:
    # Writer 12 was SIGKILLed after its last object and not restarted (the job was done):
    # writer 1, stopping last, deletes its spares too.
    mine, killed = SpareGiver(tmp_dir, 1), SpareGiver(tmp_dir, 12)
    for i in range(3):
        mine.give(str(finished(tmp_path, f"a{i}")))
        killed.give(str(finished(tmp_path, f"b{i}")))
    (tmp_dir / "obj.part").write_bytes(b"a download in progress")
    mine.clear()
    assert spares_in(tmp_dir) == []
    assert (tmp_dir / "obj.part").read_bytes() == b"a download in progress"
