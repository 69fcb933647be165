"""Every message has the one codec shape (``VERSION``, ``encode``, ``decode``), and the counters
have one place in each message that carries them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import fields
from typing import Any, get_type_hints

import pytest

from prefetchd.messages.activity import Activity
from prefetchd.messages.child_report import ChildReport, ErrorEntry
from prefetchd.messages.consumer_report import ConsumerReport
from prefetchd.messages.counters import (
    QUARANTINE_COUNTERS,
    Counts,
    DownloaderCounters,
    WriterCounters,
    quarantined_by_reason,
)
from prefetchd.messages.epoch_keep import EpochKeep
from prefetchd.messages.source_status import SourceStatus
from prefetchd.messages.status_record import StatusRecord
from prefetchd.messages.wire import MessageError

MESSAGES: list[Any] = [
    StatusRecord("running", pid=4, keep_epochs=(EpochKeep(1, 2, 20, 1, 10),)),
    ChildReport(name="writer-0", pid=5, activity=Activity.WRITING, counts=Counts(errors=1)),
    ConsumerReport(pid=6, wait_s=1.5, shards=3),
    EpochKeep(3, hits=1, hit_bytes=100),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_decodes_what_it_encodes(message: Any) -> None:
    cls = type(message)
    assert isinstance(cls.VERSION, int) and cls.VERSION >= 1
    data = message.encode()
    assert isinstance(data, bytes)
    assert json.loads(data)["version"] == cls.VERSION
    again = cls.decode(data)
    assert again.encode() == data


@pytest.mark.parametrize("cls", [type(m) for m in MESSAGES], ids=lambda c: c.__name__)
@pytest.mark.parametrize("data", [b"", b"{torn", b"[1, 2]", b"\xff"])
def test_bytes_that_hold_no_message_raise_message_error(cls: Any, data: bytes) -> None:
    with pytest.raises(MessageError):
        cls.decode(data)
    assert issubclass(MessageError, ValueError)


def test_every_counter_of_a_role_has_its_place_in_the_child_report() -> None:
    report_fields = {f.name for f in fields(ChildReport)} | {f.name for f in fields(Counts)}
    for counters in (DownloaderCounters, WriterCounters):
        assert set(get_type_hints(counters)) <= report_fields, counters.__name__


def test_every_summed_count_is_kept_by_a_role_and_shown_in_status() -> None:
    kept = set(get_type_hints(DownloaderCounters)) | set(get_type_hints(WriterCounters))
    counts = {f.name for f in fields(Counts)}
    assert counts <= kept
    assert set(QUARANTINE_COUNTERS) <= counts & set(get_type_hints(WriterCounters))
    record = json.loads(StatusRecord("running", counts=Counts(quarantined_timeout=2)).encode())
    assert counts <= set(record)
    assert record["quarantined_by_reason"] == {
        "corrupt": 0,
        "too_large": 0,
        "timeout": 2,
        "plugin_error": 0,
    }
    assert quarantined_by_reason(Counts()) == dict.fromkeys(record["quarantined_by_reason"], 0)


def test_a_report_built_from_a_roles_counters_carries_each_of_them() -> None:
    counters = DownloaderCounters(
        objects_downloaded=7,
        bytes_downloaded=700,
        retries=1,
        errors=0,
        objects_skipped=0,
        bytes_skipped=0,
        integrity_failures=0,
        objects_unverified=0,
        verify_requests=0,
        objects_refetched=0,
        objects_listed=9,
        epoch=2,
        epoch_objects=10,
        epoch_objects_done=7,
        epoch_bytes=1000,
        epoch_bytes_done=700,
        window_bytes=300,
        window_fetching_bytes=100,
        window_limit=4096,
        keep_bytes=0,
        keep_hits=0,
        keep_hit_bytes=0,
        keep_misses=0,
        keep_miss_bytes=0,
        keep_gets_saved=0,
        keep_refetched=0,
        keep_stopped=0,
        activity=Activity.PAUSED,
        activity_detail="store errors (SlowDown), retrying in 4s",
        concurrency_limit=12,
        throttled=5,
        budget_wait_s=1.5,
        store_unreachable_since=1764849784.0,
        store_errors=3,
        store_last_error="connection reset",
        store_outages=1,
        sources=[SourceStatus("web", 0.6, 3, 300, window_bytes=100, share=0.61)],
    )
    errors = [ErrorEntry(1.0, "k", "e")]
    report = ChildReport.of(counters, name="downloader", pid=3, last_errors=errors)
    written = json.loads(report.encode())
    sources = [dataclasses.asdict(s) for s in counters["sources"]]
    assert {k: written[k] for k in counters} == {**counters, "sources": sources}
    read = ChildReport.decode(report.encode())
    assert read.sources == tuple(counters["sources"])
    status = StatusRecord("running", sources=read.sources)
    assert StatusRecord.decode(status.encode()).sources == read.sources
    assert read.activity_text == "paused: store errors (SlowDown), retrying in 4s"
    assert (read.counts.objects_downloaded, read.window_limit, read.epoch) == (7, 4096, 2)
    assert read.last_errors == tuple(errors) and read.version == ChildReport.VERSION


def test_a_consumer_report_with_the_longest_resume_note_still_fits_its_record() -> None:
    from prefetchd.consume.waits import ConsumerStats
    from prefetchd.messages.consumer_report import RECORD_SIZE

    stats = ConsumerStats(2**22)
    stats.wait_s, stats.shards, stats.waiting_since = 1e9 + 0.123, 10**9, 1e9 + 0.5
    stats.resumed = (
        "epoch 123456: 999999 shards done, e123456-w99-9999999.tfrecord.gz from record 99999999"
    )
    data = stats.encode()
    assert len(data) == RECORD_SIZE
    report = ConsumerReport.decode(data)
    assert report.resumed is not None and report.resumed.startswith("epoch 123456: ")
