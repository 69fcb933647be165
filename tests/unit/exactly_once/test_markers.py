"""The first epoch without a marker, found one way by the downloader, the writers and the
supervisor (``exactly_once/markers.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from prefetchd.exactly_once.markers import first_epoch_without, mark_complete, mark_downloaded
from prefetchd.layout import Layout


def tree(tmp_path: Path) -> Layout:
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    return layout


def test_the_first_epoch_without_a_marker_counts_up_from_zero_or_a_previous_answer(
    tmp_path: Path,
) -> None:
    layout = tree(tmp_path)
    assert first_epoch_without(layout.complete_marker) == 0
    mark_complete(layout, 0)
    mark_complete(layout, 1)
    assert first_epoch_without(layout.complete_marker) == 2
    assert first_epoch_without(layout.complete_marker, 1) == 2
    assert first_epoch_without(layout.downloaded_marker) == 0  # the two markers are apart


def test_a_downloaded_marker_is_written_once_with_the_object_count(tmp_path: Path) -> None:
    layout = tree(tmp_path)
    assert mark_downloaded(layout, 0, 7)
    assert not mark_downloaded(layout, 0, 9)
    assert json.loads(layout.downloaded_marker(0).read_bytes()) == {"objects": 7}
    assert first_epoch_without(layout.downloaded_marker) == 1
