"""The verdict in an outage of the object store (issue 29, item 4): said first, whatever the
trainers, writers and RAM look like, with the time it began; gone when the store answers."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from prefetchd.messages.activity import Activity
from prefetchd.messages.status_record import StatusRecord
from prefetchd.supervise.diagnosis import diagnose
from prefetchd.supervise.metrics import StatusCollector
from prefetchd.supervise.status_table import render_table

SINCE = time.mktime((2026, 12, 4, 12, 3, 4, 0, 0, -1))  # 12:03:04 local time

# What the issue saw blamed on downloads, trainers and RAM: writers blocked on RAM, a window
# nearly empty, trainers starved, downloads paused.
OUTAGE = StatusRecord(
    state="running",
    consumers=1,
    consumer_wait_ratio=0.9,
    writer_ram_wait_ratio=0.8,
    window_limit=100,
    ram_budget=100,
    ram_bytes=95,
    download_activity="paused: store errors (...), retrying in 32s",
    concurrency=32,
    concurrency_limit=32,
    store_unreachable_since=SINCE,
    store_errors=41,
    store_last_error="connection reset",
)


@pytest.mark.parametrize(
    "record",
    [
        OUTAGE,
        replace(OUTAGE, consumer_wait_ratio=0.0, shards_ready=5),  # trainers fed from ready
        replace(OUTAGE, consumers=0),
    ],
    ids=["as-seen", "trainers-fed", "no-trainers"],
)
def test_an_outage_is_the_verdict_whatever_else_the_figures_say(record: StatusRecord) -> None:
    for activity in (Activity.PAUSED, Activity.DOWNLOADING, None):
        verdict = diagnose(record, activity)
        assert verdict.verdict == "store-bound"
        assert verdict.summary == (
            "the object store is unreachable since 12:03:04: 41 errors, last: connection reset"
        )


def test_the_verdict_is_back_to_normal_once_the_store_answers() -> None:
    well = replace(OUTAGE, store_unreachable_since=None, store_errors=0, store_last_error=None)
    verdict = diagnose(well, Activity.DOWNLOADING)
    assert "unreachable" not in verdict.summary
    assert verdict.verdict == "ram-bound"  # what the figures say once the store is back


def test_the_table_shows_the_outage_first_and_the_adaptive_limit() -> None:
    record = replace(OUTAGE, bottleneck=diagnose(OUTAGE, Activity.PAUSED), concurrency_limit=4)
    record = replace(record, max_requests_per_s=200.0, budget_wait_s=12.0)
    lines = render_table(record).splitlines()
    assert lines[2].startswith("  bottleneck    store-bound: the object store is unreachable since")
    requests = next(ln for ln in lines if ln.startswith("  requests"))
    assert "4 of 32 in flight allowed" in requests and "budget 200 requests/s" in requests


def test_the_metrics_show_the_outage_and_its_start() -> None:
    samples = {
        (m.name, tuple(sorted(s.labels.items()))): s.value
        for m in StatusCollector(lambda: OUTAGE).collect()
        for s in m.samples
    }
    assert samples[("prefetchd_store_unreachable", ())] == 1.0
    assert samples[("prefetchd_store_unreachable_since_seconds", ())] == SINCE
    assert samples[("prefetchd_store_errors", ())] == 41
    well = replace(OUTAGE, store_unreachable_since=None)
    after = {
        m.name: m.samples[0].value for m in StatusCollector(lambda: well).collect() if m.samples
    }
    assert after["prefetchd_store_unreachable"] == 0.0
    assert "prefetchd_store_unreachable_since_seconds" not in after
