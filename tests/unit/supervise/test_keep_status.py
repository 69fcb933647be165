"""``download.keep`` in status: the per-epoch figures the downloader saves, the hit ratio, and
the table's ``kept`` lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefetchd.layout import Layout
from prefetchd.messages.epoch_keep import EpochKeep, hit_ratio, read_epoch_keep
from prefetchd.messages.status_record import StatusRecord
from prefetchd.messages.wire import MessageError
from prefetchd.supervise.keep_status import keep_epochs
from prefetchd.supervise.status_table import render_table


def test_hit_ratio_is_of_the_bytes_and_none_before_any_object() -> None:
    assert hit_ratio(0, 0) is None
    assert hit_ratio(300, 100) == 0.75


def test_keep_epochs_reads_the_last_epochs_figures_in_order(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "c", tmp_path / "r", tmp_path / "s")
    layout.epochs.mkdir(parents=True)
    for k in range(10):
        figures = {"hits": k, "hit_bytes": 100 * k, "misses": 1, "miss_bytes": 100}
        layout.keep_figures(k).write_text(json.dumps(figures))
    (layout.epochs / "3.complete").write_text("{}")  # other markers are not figures
    (layout.epochs / "x.keep.json").write_text("{}")
    shown = keep_epochs(layout)
    assert [e.epoch for e in shown] == list(range(2, 10))
    assert shown[-1].hits == 9 and shown[-1].hit_ratio == 0.9
    assert keep_epochs(Layout(tmp_path / "no", tmp_path / "no", tmp_path / "no")) == ()


def test_the_table_shows_the_kept_bytes_and_hit_ratio_only_with_keep_on() -> None:
    raw = {
        "state": "running",
        "keep_limit": 2 * 1024**3,
        "keep_bytes": 1024**3,
        "keep_hits": 40,
        "keep_hit_bytes": 3 * 1024**3,
        "keep_misses": 40,
        "keep_miss_bytes": 1024**3,
        "keep_gets_saved": 400,
        "keep_hit_ratio": 0.75,
        "keep_epochs": [
            {"epoch": 1, "hits": 40, "hit_bytes": 1024**3, "misses": 0, "miss_bytes": 0,
             "hit_ratio": 1.0},
        ],
    }  # fmt: skip
    record = StatusRecord.decode(json.dumps(raw).encode())
    table = render_table(record)
    assert "hit ratio   75% of the bytes: 40 objects from disk, 40 downloaded, 400 GETs saved" in (
        table
    )
    assert "epoch 1     100% hit" in table
    off = StatusRecord.decode(b'{"state": "running"}')
    assert "hit ratio" not in render_table(off)
    assert json.loads(record.encode())["keep_epochs"] == raw["keep_epochs"]


def test_the_figures_file_has_a_version_and_one_without_is_version_0(tmp_path: Path) -> None:
    path = tmp_path / "2.keep.json"
    figures = EpochKeep(2).hit(300).miss(100)
    path.write_bytes(figures.encode())
    assert json.loads(path.read_bytes()) == {
        "version": EpochKeep.VERSION,
        "epoch": 2,
        "hits": 1,
        "hit_bytes": 300,
        "misses": 1,
        "miss_bytes": 100,
    }
    assert read_epoch_keep(path, 2) == figures and figures.hit_ratio == 0.75
    path.write_text('{"hits": 4, "hit_bytes": 40, "misses": 0, "miss_bytes": 0, "new": 1}')
    assert read_epoch_keep(path, 2) == EpochKeep(2, 4, 40, 0, 0, version=0)
    path.write_text("{torn")
    assert read_epoch_keep(path, 2) == EpochKeep(2)  # unreadable: zeros
    assert read_epoch_keep(tmp_path / "none.keep.json", 5) == EpochKeep(5)
    with pytest.raises(MessageError):
        EpochKeep.decode(b"[1]")
