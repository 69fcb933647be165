"""What a restarted downloader does with the cache a killed run left (``download/restart.py``):
a download logged as published is finished, not fetched again; anything else half-done is
removed; an object logged but gone from the cache is fetched again."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefetchd.config import Config
from prefetchd.download.restart import read_logs, roll_forward, sweep_metas
from prefetchd.exactly_once.download_log import PUBLISHED, DownloadLog
from prefetchd.layout import TMP_SUFFIX, Layout, key_hash, object_name
from tests.unit.configs import unit_config


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return unit_config(tmp_path)


@pytest.fixture
def layout(config: Config) -> Layout:
    layout = Layout.of(config)
    layout.create()
    return layout


def name(seq: int) -> str:
    return object_name(0, seq, key_hash("bucket", f"key-{seq}"))


def logged_as_published(layout: Layout, *seqs: int) -> dict[int, set[str]]:
    download_log = DownloadLog(layout)
    for seq in seqs:
        download_log.append(0, name(seq), PUBLISHED)
    download_log.close_all()
    return read_logs(DownloadLog(layout))


def test_a_logged_part_is_published_and_an_unlogged_one_removed(layout: Layout) -> None:
    logged = logged_as_published(layout, 0)
    for seq in (0, 1):
        (layout.cache_tmp / (name(seq) + TMP_SUFFIX)).write_bytes(b"x" * (seq + 1))
    (layout.cache_tmp / "stray").write_bytes(b"")
    roll_forward(layout, logged)
    assert [p.name for p in layout.cache_ready.iterdir()] == [name(0)]
    assert (layout.cache_ready / name(0)).read_bytes() == b"x"
    assert list(layout.cache_tmp.iterdir()) == []


def test_a_logged_object_gone_from_the_cache_is_fetched_again(layout: Layout) -> None:
    logged = logged_as_published(layout, 0, 2)
    for seq in (0, 1, 2):
        (layout.cache_meta / f"{name(seq)}.json").write_text("{}")
    (layout.cache_ready / name(2)).write_bytes(b"x")
    refetch = sweep_metas(layout, logged, {name(2): 1})
    assert refetch == {name(0)}  # logged, its file gone: its meta stays for the new copy
    metas = sorted(p.name for p in layout.cache_meta.iterdir())
    assert metas == sorted([f"{name(0)}.json", f"{name(2)}.json"])  # name(1)'s never logged
