"""The messages between processes: each one written by its real writer into its real file and
read back by its real reader, and records of other versions (older, newer, partial) read as
their module documents. The status record's verdict by activity is in test_status.py."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefetchd.atomic import write_atomic
from prefetchd.child.context import ChildContext
from prefetchd.commands.cli import main
from prefetchd.config import Config
from prefetchd.consume.health import DaemonHealth
from prefetchd.consume.waits import ConsumerStats
from prefetchd.errors import DaemonFailed
from prefetchd.exactly_once.journal import COMPACT_EVERY, Journal, JournalEntry, JournalError
from prefetchd.layout import Layout
from prefetchd.messages.activity import Activity, activity_text, parse_activity
from prefetchd.messages.child_report import ChildReport
from prefetchd.messages.consumer_report import RECORD_SIZE, ConsumerReport
from prefetchd.messages.status_record import StatusRecord
from prefetchd.supervise.status import Totals, read_children, read_consumers, read_status
from prefetchd.supervise.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "tests" / "data" / "status"


def writer_counters(**changes: Any) -> dict[str, object]:
    """A writer's counters as its report carries them (a few keys; readers default the rest)."""
    counters: dict[str, object] = dict(
        records_written=5,
        shards_written=1,
        bytes_written=1000,
        objects_consumed=2,
        errors=1,
        epoch=0,
        ram_wait_s=1.5,
        objects_open=3,
        activity=Activity.WAITING_FOR_RAM,
    )
    counters.update(changes)
    return counters


def downloader_counters(**changes: Any) -> dict[str, object]:
    """The downloader's counters as its report carries them (a few keys; readers default the
    rest)."""
    counters: dict[str, object] = dict(
        objects_downloaded=7,
        bytes_downloaded=7000,
        retries=2,
        errors=0,
        objects_skipped=0,
        integrity_failures=0,
        objects_unverified=0,
        verify_requests=0,
        epoch=1,
        epoch_objects=10,
        epoch_objects_done=7,
        epoch_bytes=10000,
        epoch_bytes_done=7000,
        window_bytes=3000,
        window_limit=4096,
        activity=Activity.PAUSED,
        activity_detail="store errors (SlowDown), retrying in 4s",
    )
    counters.update(changes)
    return counters


def child_reports(config: Config, name: str, counters: Any, **end: Any) -> dict[str, Any]:
    """What a child of that name publishes: its report, as the supervisor finds it."""
    ctx = ChildContext(name, config)
    ctx.counters = counters
    ctx.ready = True
    ctx.error("train/bad.tfrecord", "not a valid TFRecord file")
    ctx.report(force=True, **end)
    return read_children(Layout.of(config))[name]


# --- child reports ------------------------------------------------------------------------------


def test_a_writers_report_is_read_by_the_supervisor(layout: Layout, config: Config) -> None:
    report = ChildReport.decode_object(child_reports(config, "writer-0", writer_counters()))
    assert (report.name, report.pid, report.ready, report.version) == (
        "writer-0",
        os.getpid(),
        True,
        1,
    )
    assert report.heartbeat > 0
    assert report.activity is Activity.WAITING_FOR_RAM
    assert report.activity_text == "waiting for RAM budget (trainers are behind)"
    assert (report.counts.records_written, report.counts.errors) == (5, 1)
    assert (report.ram_wait_s, report.objects_open, report.epoch) == (1.5, 3, 0)
    assert [(e.key, e.error) for e in report.last_errors] == [
        ("train/bad.tfrecord", "not a valid TFRecord file")
    ]
    assert (report.boot_error, report.fatal, report.stopped) == (None, None, False)


def test_a_paused_downloader_is_shown_with_its_reason(layout: Layout, config: Config) -> None:
    raw = child_reports(config, "downloader", downloader_counters())
    assert raw["activity"] == "paused"  # the code on the wire; the words are the reader's
    report = ChildReport.decode_object(raw)
    assert report.activity is Activity.PAUSED
    assert report.activity_text == "paused: store errors (SlowDown), retrying in 4s"
    assert (report.counts.objects_downloaded, report.window_bytes, report.epoch) == (7, 3000, 1)


def test_a_childs_last_words_are_read(layout: Layout, config: Config) -> None:
    raw = child_reports(config, "writer-1", writer_counters(), boot_error="no bucket", fatal="x")
    report = ChildReport.decode_object(raw)
    assert (report.boot_error, report.fatal) == ("no bucket", "x")
    stopped = ChildReport.decode_object(child_reports(config, "writer-1", {}, stopped=True))
    assert stopped.stopped and stopped.activity is None and stopped.counts.records_written == 0


def test_a_version_0_report_is_read_with_its_activity_text(layout: Layout) -> None:
    """An old child (a rolling restart) wrote display text and no version."""
    old = {
        "name": "downloader",
        "pid": 42,
        "heartbeat": 1700000000.0,
        "ready": True,
        "objects_downloaded": 3,
        "bytes_downloaded": 300,
        "activity": "paused: access denied (ExpiredToken), retrying in 8s",
        "last_errors": [{"time": 1.0, "key": None, "error": "denied"}],
    }
    write_atomic(layout.children / "downloader.json", json.dumps(old).encode())
    report = ChildReport.decode_object(read_children(layout)["downloader"])
    assert report.version == 0
    assert report.activity is Activity.PAUSED
    assert report.activity_text == old["activity"]
    assert (report.counts.objects_downloaded, report.counts.bytes_downloaded) == (3, 300)
    assert report.counts.retries == 0 and report.epoch is None  # missing: the defaults
    assert report.last_errors[0].key is None


@pytest.mark.parametrize("activity", list(Activity))
def test_every_activity_is_read_back_from_its_code_and_from_its_old_text(
    activity: Activity,
) -> None:
    assert parse_activity(activity.value) == (activity, activity_text(activity))
    assert parse_activity(activity_text(activity))[0] is activity  # version 0 wrote the words


def test_a_newer_report_is_read_without_what_this_version_does_not_know() -> None:
    newer = {
        "version": 7,
        "name": "writer-0",
        "pid": 9,
        "heartbeat": "soon",  # a type this version cannot use: the default
        "activity": "compacting",  # an activity this version does not know
        "records_written": 12,
        "gpu_direct_bytes": 5,
        "last_errors": [{"time": 2.0, "key": "k", "error": "e", "severity": 3}, "junk"],
    }
    report = ChildReport.decode_object(newer)
    assert (report.version, report.pid, report.heartbeat) == (7, 9, 0.0)
    assert report.activity is None and report.activity_text == "compacting"
    assert report.counts.records_written == 12
    assert [(e.key, e.error) for e in report.last_errors] == [("k", "e")]
    assert ChildReport.decode_object({}) == ChildReport()


def test_counts_of_a_dead_child_are_carried_over_its_restart(
    layout: Layout, config: Config
) -> None:
    totals = Totals()
    first = child_reports(config, "writer-0", writer_counters())
    totals.add_dead("writer-0", ChildReport.decode_object(first))
    second = ChildReport.decode_object(child_reports(config, "writer-0", writer_counters()))
    assert totals.sum({"writer-0": second}).records_written == 10


# --- the status record --------------------------------------------------------------------------


@pytest.fixture
def supervisor(config: Config, layout: Layout) -> Iterator[Supervisor]:
    sup = Supervisor(config)
    downloader = next(c for c in sup.children if c.name == "downloader")
    downloader.last_report = ChildReport.decode_object(
        child_reports(config, "downloader", downloader_counters())
    )
    yield sup


def test_the_supervisors_status_is_read_by_status_and_the_trainer(
    supervisor: Supervisor, layout: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    supervisor.status.publish(supervisor, force=True)
    written = json.loads(layout.status_file.read_text())
    assert written["version"] == StatusRecord.VERSION
    assert written["download_activity"] == "paused: store errors (SlowDown), retrying in 4s"
    assert written["children"]["downloader"]["activity"] == written["download_activity"]
    assert (written["objects_downloaded"], written["retries"]) == (7, 2)

    status = read_status(layout)
    assert status == supervisor.status.last_snapshot
    DaemonHealth(layout, grace=60).check()  # the trainer: starting is fine

    assert main(["status", "--config", str(supervisor.config.path), "--json"]) == 3
    printed = json.loads(capsys.readouterr().out)  # this pid is ours: "not running", printed
    assert printed == written


def test_a_failed_daemons_reason_reaches_the_trainer(
    supervisor: Supervisor, layout: Layout
) -> None:
    supervisor.fail("writer-0 could not start: no bucket")
    supervisor.status.publish(supervisor, force=True)
    with pytest.raises(DaemonFailed, match="no bucket"):
        DaemonHealth(layout, grace=60).check()


@pytest.mark.parametrize("name", ["running_consumer_bound", "running_starved_with_errors"])
def test_a_version_0_status_keeps_every_key_and_value(name: str) -> None:
    """``status --json`` re-encodes what it read: nothing the daemon wrote may change."""
    raw = json.loads((RECORDED / f"{name}.json").read_text())
    assert "version" not in raw  # recorded before the status record had one
    record = StatusRecord.decode(json.dumps(raw).encode())
    assert record.version == 0
    out = json.loads(record.encode())
    assert {k: out[k] for k in raw} == raw
    added = {k: v for k, v in out.items() if k not in raw}  # keys newer than the recording
    # docs/status.md: a key the recording lacks reads as 0, null or empty (a list such as
    # keep_epochs)
    assert added["version"] == 0 and all(
        v in (0, None, []) for v in added.values() if not isinstance(v, dict)
    )
    # a figure split by reason (quarantined_by_reason) is all zeros, like the flat figures
    assert all(not any(v.values()) for v in added.values() if isinstance(v, dict))


def test_a_newer_status_keeps_what_this_version_does_not_know(
    layout: Layout, config: Config, capsys: pytest.CaptureFixture[str]
) -> None:
    newer = {
        "version": 9,
        "state": "running",
        "pid": 1,
        "updated": 0,
        "gpu_feed": {"lanes": 4},
        "children": {"writer-0": {"pid": 5, "alive": True, "cpu": 0.5}, "bad": 3},
        "epochs": [{"epoch": 0, "state": "downloading", "bytes": 10}, "junk"],
        "bottleneck": {"verdict": "nic-bound", "summary": "s", "evidence": ["e"]},
        "last_errors": "not a list",
    }
    write_atomic(layout.status_file, json.dumps(newer).encode())
    status = read_status(layout)
    assert status is not None
    assert status.extra == {"gpu_feed": {"lanes": 4}}
    assert status.children["writer-0"].pid == 5 and list(status.children) == ["writer-0"]
    assert [e.bytes for e in status.epochs] == [10]
    assert status.bottleneck is not None and status.bottleneck.verdict == "nic-bound"
    assert status.counts.records_written == 0 and status.last_errors == ()  # missing: defaults

    assert main(["status", "--config", str(config.path), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["gpu_feed"] == {"lanes": 4}


@pytest.mark.parametrize("text", ["", "[1, 2]", '{"pid": 1}', '{"state": 3}', "{torn"])
def test_what_is_not_a_status_record_reads_as_no_status(layout: Layout, text: str) -> None:
    layout.status_file.write_text(text)
    assert read_status(layout) is None
    DaemonHealth(layout, grace=60).check()  # no status yet: within the grace period


def test_every_key_the_status_record_writes_is_documented(supervisor: Supervisor) -> None:
    docs = (ROOT / "docs" / "status.md").read_text()
    record = json.loads(supervisor.status.snapshot(supervisor, 0.0).encode())
    assert not [k for k in record if f"`{k}`" not in docs]


# --- writer journal -----------------------------------------------------------------------------


def entry(counter: int, shard: str | None = "e0-w0-0.tfrecord") -> JournalEntry:
    return JournalEntry(shard, counter, {"e0-1-ab": counter * 10}, ("e0-0-cd",))


def test_the_last_commit_is_read_back_and_a_torn_line_skipped(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "w0.log")
    assert journal.last() is None
    journal.append(entry(0))
    journal.append(entry(1, shard=None))
    with journal.path.open("a") as f:
        f.write('{"version": 1, "shard": "e0-w0-2.tf')  # a crash mid-append
    assert Journal(journal.path).last() == entry(1, shard=None)


def test_the_journal_is_compacted_to_its_last_commit(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "w0.log")
    for counter in range(COMPACT_EVERY + 3):
        journal.append(entry(counter))
    assert len(journal.path.read_text().splitlines()) == 4
    assert journal.last() == entry(COMPACT_EVERY + 2)


def test_a_version_0_journal_line_is_resumed_from(tmp_path: Path) -> None:
    """A job resumed by this release after an older one wrote the journal."""
    path = tmp_path / "w0.log"
    old = {"shard": "e0-w0-4.tfrecord", "counter": 4, "positions": {"o": 2}, "finished": ["f"]}
    path.write_text(json.dumps(old) + "\n")
    assert Journal(path).last() == JournalEntry("e0-w0-4.tfrecord", 4, {"o": 2}, ("f",))


def test_unknown_journal_fields_are_ignored_and_shard_may_be_missing(tmp_path: Path) -> None:
    path = tmp_path / "w0.log"
    line = {"version": 1, "counter": 2, "positions": {}, "finished": [], "note": "x"}
    path.write_text(json.dumps(line) + "\n")
    assert Journal(path).last() == JournalEntry(None, 2, {}, ())


@pytest.mark.parametrize(
    "line",
    [
        {"version": 2, "shard": None, "counter": 1, "positions": {}, "finished": []},
        {"version": 1, "shard": None, "counter": 1, "finished": []},
        {"version": 1, "shard": None, "counter": 1, "positions": {"o": "2"}, "finished": []},
    ],
)
def test_a_commit_this_version_cannot_resume_from_stops_the_writer(
    tmp_path: Path, line: dict[str, Any]
) -> None:
    path = tmp_path / "w0.log"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(JournalError, match=str(path)):
        Journal(path).last()


# --- consumer reports ---------------------------------------------------------------------------


def lock_file(layout: Layout, owner: str, data: bytes) -> None:
    """Written as ``ShardReleaser`` does: in place, at offset 0."""
    fd = os.open(layout.consumer_lock(owner), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def test_a_trainers_wait_figures_are_read_by_the_daemon(layout: Layout) -> None:
    stats = ConsumerStats(pid=77)
    stats.begin(10.0)
    stats.end(12.5)
    stats.begin(20.0)
    stats.shards = 4
    lock_file(layout, "77xabc", stats.encode())
    report = read_consumers(layout)["77xabc"]
    assert (report.pid, report.wait_s, report.shards) == (77, 2.5, 4)
    assert report.waiting_since_monotonic == 20.0, "the wait in progress, on the monotonic clock"
    # ... and as epoch seconds for a daemon from before waiting_since_monotonic
    assert report.waiting_since == pytest.approx(20.0 + time.time() - time.monotonic(), abs=1)


def test_consumer_reports_of_other_versions_are_read(layout: Layout) -> None:
    old = json.dumps({"pid": 5, "wait_s": 1.0, "waiting_since": None, "shards": 2}).encode()
    lock_file(layout, "5xold", old.ljust(RECORD_SIZE))
    newer = {"version": 3, "pid": 6, "wait_s": 2.0, "queue_depth": 9}  # no waiting_since, shards
    lock_file(layout, "6xnew", json.dumps(newer).encode().ljust(RECORD_SIZE))
    lock_file(layout, "7xnew", b"")  # just created, nothing written yet
    reports = read_consumers(layout)
    assert reports["5xold"] == ConsumerReport(5, 1.0, None, 2, version=0)
    assert reports["6xnew"] == ConsumerReport(6, 2.0, None, 0, version=3)
    assert "7xnew" not in reports
