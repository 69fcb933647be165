"""The kept store and the downloader's keeper (``download/kept.py``, ``download/keeper.py``):
crash-safe entries keyed by source identity, trusted only while intact and unchanged."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from prefetchd.config import config_from_dict
from prefetchd.download.keeper import Keeper
from prefetchd.download.kept import KeptStore
from prefetchd.download.order import SourceObject
from prefetchd.download.share import ShareTable
from prefetchd.layout import Layout, kept_name
from prefetchd.messages.counters import DownloaderCounters, new_downloader_counters

BUCKET = "bucket"


def download(tmp_path: Path, obj: SourceObject, fill: bytes = b"x") -> Path:
    path = tmp_path / f"dl-{obj.key.replace('/', '_')}"
    path.write_bytes(fill * obj.size)
    return path


@pytest.fixture
def store(tmp_path: Path) -> KeptStore:
    (tmp_path / "keep").mkdir()
    return KeptStore(tmp_path / "keep", BUCKET, capacity=10_000)


def test_the_name_is_the_source_identity_never_the_key(store: KeptStore) -> None:
    obj = SourceObject("../../etc/passwd", 10, "abc")
    name = store.name_of(obj)
    assert name is not None and "/" not in name and "passwd" not in name
    assert store.name_of(SourceObject(obj.key, 10, "abd")) != name  # overwritten: another name
    assert store.name_of(SourceObject(obj.key, 11, "abc")) != name
    assert store.name_of(SourceObject(obj.key, 10, None)) is None  # unknowable: never kept


def test_a_kept_object_survives_a_restart_and_is_handed_over_intact(
    tmp_path: Path, store: KeptStore
) -> None:
    obj = SourceObject("a", 100, "e1")
    name = store.name_of(obj)
    assert name is not None
    store.add(name, obj, download(tmp_path, obj))
    again = KeptStore(store.directory, BUCKET, 10_000)
    again.load()
    assert again.has(name) and again.used == 100
    assert again.hand_over(name, tmp_path / "handed") is None
    assert (tmp_path / "handed").read_bytes() == b"x" * 100
    os.unlink(tmp_path / "handed")  # the writer deletes its copy: the kept bytes stay
    assert (store.directory / name).stat().st_size == 100


def test_a_corrupted_or_truncated_kept_file_is_refused_and_dropped(
    tmp_path: Path, store: KeptStore
) -> None:
    for i, damage in enumerate((b"y", b"")):
        obj = SourceObject(f"k{i}", 50, "e")
        name = store.name_of(obj)
        assert name is not None
        store.add(name, obj, download(tmp_path, obj))
        with open(store.directory / name, "r+b") as f:
            f.seek(10)
            if damage:
                f.write(damage)
            else:
                f.truncate(10)
        problem = store.hand_over(name, tmp_path / f"out{i}")
        assert problem is not None and "corrupt" in problem
        assert not store.has(name) and not (store.directory / name).exists()
        assert not (tmp_path / f"out{i}").exists()


def test_start_up_sweeps_half_entries_and_temp_files(tmp_path: Path, store: KeptStore) -> None:
    obj = SourceObject("a", 10, "e")
    name = store.name_of(obj)
    assert name is not None
    store.add(name, obj, download(tmp_path, obj))
    half = kept_name(BUCKET, "b", "e", 10)
    (store.directory / f"{half}.json").write_text("{}")  # crashed before the link
    orphan = kept_name(BUCKET, "c", "e", 10)
    (store.directory / orphan).write_bytes(b"z" * 10)  # data without the meta vouching for it
    (store.directory / f".{name}.json.123.tmp").write_text("")  # write_atomic's temp
    again = KeptStore(store.directory, BUCKET, 10_000)
    again.load()
    assert sorted(os.listdir(store.directory)) == sorted([name, f"{name}.json"])
    assert list(again.entries) == [name]


def test_retain_drops_what_is_not_chosen_now(tmp_path: Path, store: KeptStore) -> None:
    names = []
    for key in ("a", "b"):
        obj = SourceObject(key, 10, "e")
        name = store.name_of(obj)
        assert name is not None
        store.add(name, obj, download(tmp_path, obj))
        names.append(name)
    assert store.retain([names[1]]) == 1
    assert list(store.entries) == [names[1]] and store.used == 10
    assert not (store.directory / names[0]).exists()


def test_a_failed_add_leaves_nothing_behind(tmp_path: Path, store: KeptStore) -> None:
    obj = SourceObject("a", 10, "e")
    name = store.name_of(obj)
    assert name is not None
    with pytest.raises(OSError):
        store.add(name, obj, tmp_path / "missing")
    path = download(tmp_path, obj)
    os.symlink("/nonexistent", store.directory / name)  # the link will fail with EEXIST
    with pytest.raises(OSError):
        store.add(name, obj, path)
    assert os.listdir(store.directory) == [] and not store.has(name)


def test_nothing_is_kept_beyond_the_capacity(tmp_path: Path) -> None:
    (tmp_path / "keep").mkdir()
    store = KeptStore(tmp_path / "keep", BUCKET, capacity=15)
    for key in ("a", "b"):
        obj = SourceObject(key, 10, "e")
        name = store.name_of(obj)
        assert name is not None
        store.add(name, obj, download(tmp_path, obj))
    assert store.used == 10 and len(store.entries) == 1


# --- the keeper ---------------------------------------------------------------------------------


def counters() -> DownloaderCounters:
    """A fresh downloader's counters (the keeper updates the ``keep_`` ones)."""
    return new_downloader_counters(window_limit=0)


def make_keeper(tmp_path: Path, capacity: int, free: int = 10**12) -> Keeper:
    """A keeper whose disk has ``free`` bytes left besides what it keeps."""
    config = config_from_dict(
        {
            "source": {"url": f"s3://{BUCKET}/"},
            "download": {"cache_dir": str(tmp_path / "cache")},
            "output": {"ram_dir": str(tmp_path / "ram")},
            "status": {"state_dir": str(tmp_path / "state")},
        }
    )
    layout = Layout.of(config)
    layout.create()
    keeper = Keeper(layout, BUCKET, capacity, 8 * 1024**2, counters())
    keeper.free = lambda _path: free - keeper.store.used
    return keeper


OBJECTS = [SourceObject(f"k{i:02d}", 100, f"etag{i}") for i in range(20)]


def test_the_keeper_keeps_only_the_chosen_objects_and_counts_hits_and_misses(
    tmp_path: Path,
) -> None:
    keeper = make_keeper(tmp_path, capacity=1000)
    keeper.plan(ShareTable.of(OBJECTS))
    chosen = [o for o in OBJECTS if keeper.wants(o)]
    assert len(chosen) == 10
    for obj in OBJECTS:
        keeper.downloaded(0, obj, download(tmp_path, obj), reserve=0)
    assert keeper.store.used == 1000 and keeper.counters["keep_bytes"] == 1000
    assert all(keeper.usable(o) for o in chosen)
    for obj in chosen:
        keeper.hit(1, obj)
    keeper.save()
    saved = json.loads(keeper.layout.keep_figures(1).read_text())
    assert saved == {
        "version": 1,
        "epoch": 1,
        "hits": 10,
        "hit_bytes": 1000,
        "misses": 0,
        "miss_bytes": 0,
    }
    assert keeper.counters["keep_misses"] == 20 and keeper.counters["keep_gets_saved"] == 10


def test_a_changed_or_deleted_object_loses_its_kept_copy(tmp_path: Path) -> None:
    keeper = make_keeper(tmp_path, capacity=10_000)
    share = ShareTable.of(OBJECTS)
    keeper.plan(share)
    for obj in OBJECTS:
        keeper.downloaded(0, obj, download(tmp_path, obj), reserve=0)
    changed = SourceObject("k03", 120, "new")
    listing = ShareTable.of([changed if o.key == "k03" else o for o in OBJECTS if o.key != "k07"])
    keeper.refresh(share, listing)
    assert keeper.usable(OBJECTS[3]) is None and keeper.usable(OBJECTS[7]) is None
    assert keeper.current(3, OBJECTS[3]) == changed  # fetched as listed now ...
    assert keeper.wants(changed)  # ... and kept again
    assert keeper.usable(OBJECTS[5]) is not None
    assert keeper.store.used == 18 * 100


def test_with_several_sources_one_choice_covers_every_source_and_names_hold_the_bucket(
    tmp_path: Path,
) -> None:
    """Two sources in two buckets listing the same keys: one choice over both shares (each
    keeps about the capacity's fraction of its bytes), entries named by bucket, so the same key
    in the other bucket is another object; a changed object is refreshed in its own source."""
    keeper = make_keeper(tmp_path, capacity=2000)
    shares = [ShareTable.of(OBJECTS), ShareTable.of(OBJECTS)]
    keeper.plan(*shares, buckets=[BUCKET, "other"])
    chosen = [[o for o in OBJECTS if keeper.wants(o, source)] for source in (0, 1)]
    assert len(chosen[0]) == len(chosen[1]) == 10  # the same rank, the same keys, each bucket
    for source in (0, 1):
        for obj in OBJECTS:
            keeper.downloaded(0, obj, download(tmp_path, obj), reserve=0, source=source)
    assert keeper.store.used == 2000 and len(keeper.store.entries) == 20
    assert all(keeper.usable(o, 1) for o in chosen[1])
    assert keeper.usable(chosen[0][0], 0) != keeper.usable(chosen[0][0], 1)
    changed = SourceObject(chosen[1][0].key, 120, "new")
    row = OBJECTS.index(chosen[1][0])
    listing = ShareTable.of([changed if o.key == changed.key else o for o in OBJECTS])
    keeper.refresh(shares[0], ShareTable.of(OBJECTS), 0)
    keeper.refresh(shares[1], listing, 1)
    assert keeper.usable(chosen[1][0], 1) is None and keeper.usable(chosen[1][0], 0) is not None
    assert keeper.current(row, chosen[1][0], 1) == changed
    assert keeper.current(row, chosen[1][0], 0) == chosen[1][0]


def test_keeping_stops_once_when_the_disk_would_fill(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keeper = make_keeper(tmp_path, capacity=10_000, free=350)
    keeper.plan(ShareTable.of(OBJECTS))
    for obj in OBJECTS:
        keeper.downloaded(0, obj, download(tmp_path, obj), reserve=100)
    # 350 free: two objects of 100 leave 150, a third would leave 50 < 100 for downloads
    assert keeper.store.used == 200
    assert keeper.counters["keep_stopped"] == 1
    assert keeper.counters["keep_misses"] == 20  # training went on
    assert len([r for r in caplog.records if "no longer keeping" in r.getMessage()]) == 1


def test_enospc_while_keeping_stops_keeping_and_leaves_no_half_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper = make_keeper(tmp_path, capacity=10_000)
    keeper.plan(ShareTable.of(OBJECTS))

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("prefetchd.download.kept.write_atomic", full)
    keeper.downloaded(0, OBJECTS[0], download(tmp_path, OBJECTS[0]), reserve=0)
    assert keeper.stopped is not None and "full" in keeper.stopped
    assert keeper.counters["keep_stopped"] == 1
    assert os.listdir(keeper.layout.cache_keep) == []


def test_keep_zero_drops_what_an_earlier_run_kept(tmp_path: Path) -> None:
    keeper = make_keeper(tmp_path, capacity=10_000)
    keeper.plan(ShareTable.of(OBJECTS))
    for obj in OBJECTS[:3]:
        keeper.downloaded(0, obj, download(tmp_path, obj), reserve=0)
    assert keeper.store.used == 300
    off = make_keeper(tmp_path, capacity=0)
    off.plan(ShareTable.of(OBJECTS))
    assert os.listdir(off.layout.cache_keep) == []


def test_no_kept_copy_is_used_while_the_latest_listing_failed(tmp_path: Path) -> None:
    keeper = make_keeper(tmp_path, capacity=10_000)
    share = ShareTable.of(OBJECTS)
    keeper.plan(share)
    keeper.downloaded(0, OBJECTS[0], download(tmp_path, OBJECTS[0]), reserve=0)
    keeper.trusted = False  # what the downloader sets when listing again fails
    assert keeper.usable(OBJECTS[0]) is None
    assert keeper.store.has(keeper.store.name_of(OBJECTS[0]) or "")  # kept, not deleted
    keeper.refresh(share, share)
    assert keeper.usable(OBJECTS[0]) is not None
