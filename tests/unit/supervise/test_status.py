"""The status people read: the table rendered from a recorded status record (golden file),
the bottleneck verdict, and the wait figures trainers publish."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from prefetchd.consume.waits import ConsumerStats
from prefetchd.messages.activity import Activity
from prefetchd.messages.consumer_report import ConsumerReport
from prefetchd.messages.status_record import StatusRecord
from prefetchd.supervise.diagnosis import VERDICTS, diagnose
from prefetchd.supervise.status import (
    REQUIRED_KEYS,
    ConsumerWaits,
    Series,
    eta_seconds,
    is_running,
)
from prefetchd.supervise.status_table import render_table

DATA = Path(__file__).resolve().parents[2] / "data" / "status"
UPDATE = os.environ.get("PREFETCHD_UPDATE_GOLDEN") == "1"  # rewrite the expected tables


@pytest.fixture
def utc() -> Iterator[None]:
    """Error times render in local time; pin it so the golden files hold anywhere."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if saved is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = saved
    time.tzset()


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text())
    return data


def decoded(raw: dict[str, Any]) -> StatusRecord:
    return StatusRecord.decode(json.dumps(raw).encode())


@pytest.mark.parametrize("name", ["running_consumer_bound", "running_starved_with_errors"])
def test_table_of_a_recorded_status_matches_the_expected_file(name: str, utc: None) -> None:
    table = render_table(decoded(recorded(name))) + "\n"
    expected = DATA / f"{name}.txt"
    if UPDATE:
        expected.write_text(table)
    assert table == expected.read_text()


def test_recorded_statuses_have_every_documented_key() -> None:
    for path in DATA.glob("*.json"):
        status = json.loads(path.read_text())
        assert not [k for k in REQUIRED_KEYS if k not in status], path.name


def test_table_shows_hostile_keys_on_one_printable_line(utc: None) -> None:
    status = recorded("running_consumer_bound")
    status["last_errors"] = [
        {"time": 0, "key": "evil\n12:00:00 forged line\u202e", "error": "bad\x1b[2Jthing"}
    ]
    table = render_table(decoded(status))
    assert "\x1b" not in table and "\u202e" not in table
    tail = table.splitlines()[-2:]
    assert tail[0].strip().startswith("00:00:00 evil\\n12:00:00 forged line")
    assert "bad\\x1b[2Jthing" in tail[1]


def test_table_of_a_minimal_record_does_not_fail() -> None:
    assert "prefetchd starting" in render_table(decoded({"state": "starting"}))


# --- the verdict --------------------------------------------------------------------------------

RUNNING = StatusRecord(
    state="running",
    consumers=2,
    consumer_wait_ratio=0.6,
    window_bytes=10,
    window_limit=100,
    ram_bytes=50,
    ram_budget=100,
    writer_ram_wait_ratio=0.0,
    download_bytes_per_s=75e6,
    download_activity="downloading",
    shards_ready=0,
)


@pytest.mark.parametrize(
    ("changes", "verdict"),
    [
        ({"consumer_wait_ratio": 0.02, "shards_ready": 5}, "consumer-bound"),
        ({}, "store-bound"),
        ({"window_bytes": 95}, "writer-bound"),
        ({"window_bytes": 95, "window_fetching_bytes": 40}, "writer-bound"),
        # a window full of objects still in flight: downloads are late, the writers wait
        ({"window_bytes": 95, "window_fetching_bytes": 80}, "store-bound"),
        ({"writer_ram_wait_ratio": 0.9, "ram_bytes": 100, "window_bytes": 95}, "ram-bound"),
        ({"consumers": 0}, "idle"),
        ({"state": "starting"}, "unknown"),
        ({"state": "draining"}, "unknown"),
    ],
)
def test_bottleneck_verdict(changes: dict[str, Any], verdict: str) -> None:
    result = diagnose(replace(RUNNING, **changes), Activity.DOWNLOADING)
    assert result.verdict == verdict
    assert result.verdict in VERDICTS
    assert result.summary
    if verdict not in ("unknown", "idle"):
        assert any("trainers waited" in e for e in result.evidence), result.evidence


# The verdict for trainers starved while the window is not filling, by the downloader's activity.
VERDICT_BY_ACTIVITY = {
    Activity.PAUSED: "store-bound",  # the store refuses: nothing else matters
    Activity.FINISHED: "writer-bound",  # everything is downloaded: writers are behind
    Activity.WAITING_FOR_WINDOW: "writer-bound",
    Activity.DOWNLOADING: "store-bound",
    Activity.LISTING: "store-bound",
    # writers' activities (the downloader never reports them): no evidence either way
    Activity.STARTING: "store-bound",
    Activity.WAITING_FOR_DOWNLOADS: "store-bound",
    Activity.WAITING_TO_MIX: "store-bound",
    Activity.WAITING_FOR_RAM: "store-bound",
    Activity.WRITING: "store-bound",
    Activity.STOPPED: "store-bound",
}


def test_every_activity_has_a_stated_verdict() -> None:
    assert set(VERDICT_BY_ACTIVITY) == set(Activity)


@pytest.mark.parametrize("activity", list(Activity))
def test_verdict_by_downloader_activity(activity: Activity) -> None:
    assert diagnose(RUNNING, activity).verdict == VERDICT_BY_ACTIVITY[activity]


def test_verdict_of_an_unknown_activity_is_decided_by_the_figures() -> None:
    """A newer downloader's activity this version cannot read: the window fill decides."""
    assert diagnose(RUNNING, None).verdict == "store-bound"
    assert diagnose(replace(RUNNING, window_bytes=95), None).verdict == "writer-bound"


def test_late_downloads_are_named_as_such_not_blamed_on_the_writers() -> None:
    """Behind first-byte latency every object in the window can be in flight at once: the
    window is full, the downloader waits for room, and the writers have nothing to write."""
    late = replace(RUNNING, window_bytes=100, window_fetching_bytes=90)
    result = diagnose(late, Activity.WAITING_FOR_WINDOW)
    assert result.verdict == "store-bound"
    assert "late" in result.summary
    assert any("90% of it still downloading" in e for e in result.evidence), result.evidence
    finished = diagnose(replace(late, window_fetching_bytes=0), Activity.FINISHED)
    assert finished.verdict == "writer-bound"


def test_paused_verdict_quotes_the_downloaders_words() -> None:
    words = "paused: store errors (SlowDown), retrying in 4s"
    result = diagnose(replace(RUNNING, download_activity=words), Activity.PAUSED)
    assert f"downloader {words}" in result.evidence


def test_verdict_evidence_names_the_figures() -> None:
    result = diagnose(replace(RUNNING, window_bytes=95), Activity.DOWNLOADING)
    assert "download window 95% full, downloader downloading" in result.evidence
    assert "trainers waited for shards 60% of the last 10 s" in result.evidence


def test_verdict_of_an_empty_record_is_unknown() -> None:
    assert diagnose(decoded({"state": ""}), None).verdict == "unknown"


# --- wait figures -------------------------------------------------------------------------------


def test_consumer_stats_count_finished_and_running_waits() -> None:
    stats = ConsumerStats(pid=7)
    stats.begin(100.0)
    stats.begin(101.0)  # a second iterator in the same process: one wait, not two
    stats.end(102.0)
    assert stats.waiting_since == 100.0
    stats.end(103.0)
    assert stats.wait_s == pytest.approx(3.0) and stats.waiting_since is None
    record = stats.encode()
    assert len(record) == ConsumerStats.RECORD_SIZE
    assert json.loads(record) == {
        "version": 1,
        "pid": 7,
        "wait_s": 3.0,
        "waiting_since": None,
        "shards": 0,
        "waiting_since_monotonic": None,
        "resumed": None,
    }


def test_consumer_waits_add_the_wait_in_progress_and_keep_exited_trainers() -> None:
    waits = ConsumerWaits()
    total, alive, waiting = waits.update(
        {
            "a": ConsumerReport(wait_s=2.0, waiting_since_monotonic=10.0),
            "b": ConsumerReport(wait_s=1.0),
        },
        now=13.0,
    )
    assert total == pytest.approx(6.0) and (alive, waiting) == (2, 1)
    total, alive, waiting = waits.update({"b": ConsumerReport(wait_s=1.5)}, now=20.0)  # a exited
    assert total == pytest.approx(6.5) and (alive, waiting) == (1, 0)


def test_series_rate_over_the_last_seconds() -> None:
    series = Series()
    for t in range(0, 30):
        series.add(float(t), {"x": 2.0 * t})
    assert series.rate("x") == pytest.approx(2.0)
    assert series.rate("missing") == 0.0


def test_eta() -> None:
    assert eta_seconds(100, 10) == 10.0
    assert eta_seconds(0, 0) == 0.0
    assert eta_seconds(5, 0) is None


def test_every_key_of_a_recorded_status_is_documented() -> None:
    docs = (DATA.parents[2] / "docs" / "status.md").read_text()
    documented = set(re.findall(r"`([a-z_0-9]+)`", docs))
    for path in DATA.glob("*.json"):
        status = json.loads(path.read_text())
        assert not sorted(set(status) - documented), path.name
        for child in status["children"].values():
            undocumented = [k for k in child if not re.search(rf"\b{k}\b", docs)]
            assert not undocumented, undocumented


def test_an_unreadable_status_is_an_error_not_not_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status as another user than the daemon's: the state dir is private. Saying "not running"
    would send an operator hunting for a dead daemon."""
    from prefetchd.errors import RuntimeFailure
    from prefetchd.layout import Layout
    from prefetchd.supervise.status import read_status

    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    assert read_status(layout) is None

    def denied(self: Path, *args: Any, **kwargs: Any) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(RuntimeFailure, match=r"permission denied.*run as that user"):
        read_status(layout)


# --- is a daemon running? -----------------------------------------------------------------------


def test_a_fresh_status_of_a_live_process_is_running_and_of_a_dead_one_is_not() -> None:
    """``prefetchd status`` exits 3 unless the record's pid runs and the record is fresh."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        record = StatusRecord(state="running", pid=live.pid, updated=time.time())
        assert is_running(record)
        assert not is_running(replace(record, updated=time.time() - 3600)), "a stale record"
        assert not is_running(replace(record, state="done"))
    finally:
        live.kill()
        live.wait()
    assert not is_running(record), "the process is gone"
    assert not is_running(None)


def test_table_says_which_job_the_daemon_runs() -> None:
    """The daemon's first log line is also the table's ``job`` line (``supervise/job.py``)."""
    note = "starting a new job 9ab2c3d4e5f60718 (epochs.seed changed 0 -> 1)"
    table = render_table(decoded({"state": "running", "job_id": "9ab2c3d4e5f60718", "job": note}))
    assert f"  job           {note}" in table.splitlines()
