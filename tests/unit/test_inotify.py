"""The inotify binding: a burst of events larger than one read is returned by one
``read_now()`` (several reads), and a call that finds nothing returns nothing."""

from __future__ import annotations

from pathlib import Path

from prefetchd.inotify import IN_CREATE, Watch


def test_a_burst_larger_than_one_read_is_returned_whole(tmp_path: Path) -> None:
    names = [f"{i:05d}-" + "x" * 100 for i in range(2000)]  # 2000 x 128 bytes: four reads
    with Watch(tmp_path, IN_CREATE) as watch:
        for name in names:
            (tmp_path / name).touch()
        assert [event.name for event in watch.read_now()] == names
        assert watch.read_now() == []
