"""The counters the children keep and the supervisor sums.

A role fills its counters in place, per record, in a ``DownloaderCounters`` or
``WriterCounters`` dict (TypedDicts: a plain dict update on the hot path); its child report
(``child_report.py``) carries them to the supervisor, which sums the ``Counts`` over children
and over restarts of one child. The quarantine counters are named once, in
``QuarantineCounter``: ``quarantined_by_reason`` (the status record's split by reason) is
derived from it.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Literal, TypedDict, get_args

from prefetchd.messages.activity import Activity
from prefetchd.messages.source_status import SourceStatus


class DownloaderCounters(TypedDict):
    """The downloader's counters, updated in place as it works."""

    objects_downloaded: int
    bytes_downloaded: int
    retries: int
    errors: int
    objects_skipped: int
    bytes_skipped: int  # their listed size
    integrity_failures: int
    objects_unverified: int
    verify_requests: int
    objects_refetched: int  # deleted from cache_dir before a writer read them: fetched again
    objects_listed: int  # while LISTING: objects the source gave so far (before include, shares)
    epoch: int  # the epoch being downloaded
    epoch_objects: int
    epoch_objects_done: int
    epoch_bytes: int
    epoch_bytes_done: int
    window_bytes: int
    window_fetching_bytes: int  # of window_bytes: objects not yet published (GETs, retries)
    window_limit: int
    keep_bytes: int  # download.keep: bytes kept on disk now
    keep_hits: int
    keep_hit_bytes: int
    keep_misses: int
    keep_miss_bytes: int
    keep_gets_saved: int
    keep_refetched: int
    keep_stopped: int
    activity: Activity
    activity_detail: str | None  # with PAUSED: the reason and the retry delay
    concurrency_limit: int  # requests allowed in flight now (adaptive, <= download.concurrency)
    throttled: int  # throttling answers (503 SlowDown, 429, 503) seen
    budget_wait_s: float  # seconds requests were held back by the request and byte budgets
    store_unreachable_since: float | None  # wall-clock start of an outage going on, or None
    store_errors: int  # failures in a row of that outage
    store_last_error: str | None  # the last of them, in a few words ("connection reset")
    store_outages: int  # outages seen since the downloader started
    sources: list[SourceStatus]  # with several sources: each one's figures (download/plan.py)


def new_downloader_counters(window_limit: int) -> DownloaderCounters:
    """The downloader's figures, all zero, as it starts listing."""
    return DownloaderCounters(
        objects_downloaded=0,
        bytes_downloaded=0,
        retries=0,
        errors=0,
        objects_skipped=0,
        bytes_skipped=0,
        integrity_failures=0,
        objects_unverified=0,
        verify_requests=0,
        objects_refetched=0,
        objects_listed=0,
        epoch=0,
        epoch_objects=0,
        epoch_objects_done=0,
        epoch_bytes=0,
        epoch_bytes_done=0,
        window_bytes=0,
        window_fetching_bytes=0,
        window_limit=window_limit,
        keep_bytes=0,
        keep_hits=0,
        keep_hit_bytes=0,
        keep_misses=0,
        keep_miss_bytes=0,
        keep_gets_saved=0,
        keep_refetched=0,
        keep_stopped=0,
        activity=Activity.LISTING,
        activity_detail=None,
        concurrency_limit=0,
        throttled=0,
        budget_wait_s=0.0,
        store_unreachable_since=None,
        store_errors=0,
        store_last_error=None,
        store_outages=0,
        sources=[],
    )


class WriterCounters(TypedDict):
    """A writer's counters, updated in place per record and per shard."""

    records_written: int
    shards_written: int
    bytes_written: int
    objects_consumed: int
    errors: int
    epoch: int | None  # of the shard being written
    ram_wait_s: float
    objects_open: int
    activity: Activity
    objects_quarantined: int  # objects set aside for good (docs/status.md), by reason:
    bytes_quarantined: int  # their size as downloaded
    quarantined_corrupt: int
    quarantined_too_large: int
    quarantined_timeout: int
    quarantined_plugin_error: int


# The counter of each quarantine reason: "quarantined_" and the reason's code
# (``write.quarantine.Reason``).
QuarantineCounter = Literal[
    "quarantined_corrupt",
    "quarantined_too_large",
    "quarantined_timeout",
    "quarantined_plugin_error",
]
QUARANTINE_COUNTERS: tuple[QuarantineCounter, ...] = get_args(QuarantineCounter)
_QUARANTINE_PREFIX = "quarantined_"


@dataclass(frozen=True)
class Counts:
    """The counters the supervisor sums over children (and over restarts of one child)."""

    objects_downloaded: int = 0
    bytes_downloaded: int = 0
    objects_skipped: int = 0
    integrity_failures: int = 0
    objects_unverified: int = 0
    verify_requests: int = 0
    keep_hits: int = 0
    keep_hit_bytes: int = 0
    keep_misses: int = 0
    keep_miss_bytes: int = 0
    keep_gets_saved: int = 0
    keep_refetched: int = 0
    keep_stopped: int = 0
    objects_refetched: int = 0
    records_written: int = 0
    shards_written: int = 0
    bytes_written: int = 0
    objects_consumed: int = 0
    retries: int = 0
    errors: int = 0
    throttled: int = 0
    store_outages: int = 0
    objects_quarantined: int = 0
    bytes_quarantined: int = 0
    bytes_skipped: int = 0
    quarantined_corrupt: int = 0
    quarantined_too_large: int = 0
    quarantined_timeout: int = 0
    quarantined_plugin_error: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


def quarantined_by_reason(counts: Counts) -> dict[str, int]:
    """``objects_quarantined`` split by reason (the codes of ``write.quarantine.Reason``)."""
    return {
        name.removeprefix(_QUARANTINE_PREFIX): getattr(counts, name) for name in QUARANTINE_COUNTERS
    }
