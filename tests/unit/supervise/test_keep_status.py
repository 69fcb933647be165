"""``download.keep`` in status: the per-epoch figures the downloader saves, the hit ratio, and
the table's ``kept`` lines."""

from __future__ import annotations

import json
from pathlib import Path

from prefetchd.layout import Layout
from prefetchd.supervise.keep_status import hit_ratio, keep_epochs
from prefetchd.supervise.status import render_table
from prefetchd.supervise.status_record import StatusRecord


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
    record = StatusRecord.from_json(raw)
    assert record is not None
    table = render_table(record)
    assert "hit ratio   75% of the bytes: 40 objects from disk, 40 downloaded, 400 GETs saved" in (
        table
    )
    assert "epoch 1     100% hit" in table
    off = StatusRecord.from_json({"state": "running"})
    assert off is not None and "hit ratio" not in render_table(off)
