"""The verdict while the downloader lists the source: a starving trainer reads that the daemon
is listing, and how far it got, never a download rate of 0 MB/s that blames nothing."""

from __future__ import annotations

import json
from dataclasses import replace

from prefetchd.messages.activity import Activity
from prefetchd.messages.child_report import ChildReport
from prefetchd.messages.status_record import StatusRecord
from prefetchd.supervise.diagnosis import diagnose

LISTING = StatusRecord(
    state="running",
    consumers=1,
    consumer_wait_ratio=1.0,
    window_limit=100,
    ram_budget=100,
    download_activity="listing",
    objects_listed=412_000,
)


def test_a_starving_trainer_reads_that_the_source_is_being_listed() -> None:
    result = diagnose(LISTING, Activity.LISTING)
    assert result.verdict == "store-bound"  # the store's listing is the limit
    assert "listing the source, 412000 objects so far" in result.summary
    assert "412000 objects listed so far" in result.evidence
    assert "trainers waited for shards 100% of the last 10 s" in result.evidence
    assert not [e for e in [result.summary, *result.evidence] if "MB/s" in e]


def test_while_starting_the_summary_says_the_source_is_being_listed() -> None:
    result = diagnose(replace(LISTING, state="starting"), Activity.LISTING)
    assert result.verdict == "unknown"
    assert result.summary == (
        "the daemon is starting: the downloader is listing the source, 412000 objects so far"
    )


def test_a_starting_daemon_not_listing_is_only_starting() -> None:
    assert diagnose(replace(LISTING, state="starting"), None).summary == "the daemon is starting"


def test_trainers_not_waiting_are_still_the_slow_part_while_listing() -> None:
    busy = replace(LISTING, consumer_wait_ratio=0.01, shards_ready=4)
    assert diagnose(busy, Activity.LISTING).verdict == "consumer-bound"


def test_writers_blocked_on_ram_outrank_a_listing() -> None:
    """Trainers hold the RAM budget in claimed shards: no download would help them."""
    blocked = replace(LISTING, writer_ram_wait_ratio=0.9, ram_bytes=100)
    assert diagnose(blocked, Activity.LISTING).verdict == "ram-bound"


def test_the_listing_count_travels_from_the_downloader_report_to_the_status_record() -> None:
    report = ChildReport.decode_object({"activity": "listing", "objects_listed": 5000})
    assert report.activity is Activity.LISTING and report.objects_listed == 5000
    raw = {**json.loads(LISTING.encode()), "objects_listed": 5000}
    record = StatusRecord.decode(json.dumps(raw).encode())
    assert record.objects_listed == 5000
    older = StatusRecord.decode(b'{"state": "running"}')  # a daemon from before the count
    assert older.objects_listed == 0
