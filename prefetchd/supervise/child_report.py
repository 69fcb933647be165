"""Child reports: what a child tells the supervisor in ``state_dir/children/<child>.json``.

A child (``ChildContext.report``) rewrites its file atomically about twice a second from its
main loop; the supervisor reads it for heartbeats, readiness, counters and the last errors.
One JSON object, written by ``report_json`` and read by ``ChildReport.from_json``::

    {"version": 1, "name": "writer-0", "pid": 123, "heartbeat": <epoch seconds>,
     "beat": <time.monotonic() seconds>,
     "ready": true, "activity": "waiting-for-ram", <the role's counters>,
     "last_errors": [{"time", "key", "error"}],
     "boot_error": "...", "fatal": "...", "stopped": true}        (the last three when set)

The roles fill their counters in place, per record, in a ``DownloaderCounters`` or
``WriterCounters`` dict (TypedDicts: a plain dict update on the hot path); ``activity`` is an
``Activity`` and ``activity_detail`` the reason that goes with it (why downloads are paused).

Other versions (rule: ``prefetchd.wire``): unknown fields are ignored, missing ones read as 0,
None or empty. A report without ``version`` (version 0, before activities were codes) has the
same fields but ``activity`` as display text; it is mapped back to its ``Activity`` here. An
activity this reader does not know is shown as written and counts as no activity in the
verdict.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import astuple, dataclass, field
from typing import Any, Literal, TypedDict

from prefetchd.wire import scalar_fields

REPORT_VERSION = 1


class Activity(enum.StrEnum):
    """What a child is doing. The value is the code in the report; ``activity_text`` gives
    the words ``prefetchd status`` shows."""

    STARTING = "starting"  # writer: before its first object
    LISTING = "listing"  # downloader: listing the bucket
    DOWNLOADING = "downloading"
    WAITING_FOR_WINDOW = "waiting-for-window"  # downloader: download.window is full
    PAUSED = "paused"  # downloader: store errors; activity_detail says which, and for how long
    FINISHED = "finished"  # downloader: nothing left to fetch
    WAITING_FOR_DOWNLOADS = "waiting-for-downloads"  # writer: no object to read
    WAITING_TO_MIX = "waiting-to-mix"  # writer: fewer than output.mix objects open, for now
    WAITING_FOR_RAM = "waiting-for-ram"  # writer: output.ram_budget is full
    WRITING = "writing"
    STOPPED = "stopped"


_TEXT = {
    Activity.WAITING_FOR_WINDOW: "waiting for the window (writers are behind)",
    Activity.WAITING_FOR_DOWNLOADS: "waiting for downloads",
    Activity.WAITING_TO_MIX: "waiting for objects to mix",
    Activity.WAITING_FOR_RAM: "waiting for RAM budget (trainers are behind)",
}
_BY_TEXT = {text: activity for activity, text in _TEXT.items()}  # version 0 wrote the text
_PAUSED_PREFIX = "paused: "
_CODES = frozenset(a.value for a in Activity)


def activity_text(activity: Activity, detail: str | None = None) -> str:
    """The words people read for ``activity`` (status table, ``download_activity``)."""
    if activity is Activity.PAUSED and detail:
        return _PAUSED_PREFIX + detail
    return _TEXT.get(activity, activity.value)


def parse_activity(raw: Any, detail: Any = None) -> tuple[Activity | None, str | None]:
    """``(activity, display text)`` from a report's ``activity`` and ``activity_detail``:
    a code, or a version 0 report's text; unknown (a newer child's code): ``(None, raw)``."""
    if not isinstance(raw, str):
        return None, None
    detail = detail if isinstance(detail, str) else None
    if raw in _CODES:
        activity = Activity(raw)
        return activity, activity_text(activity, detail)
    if raw in _BY_TEXT:
        return _BY_TEXT[raw], raw
    if raw.startswith(_PAUSED_PREFIX):
        return Activity.PAUSED, raw
    return None, raw


class DownloaderCounters(TypedDict):
    """The downloader's counters, updated in place as it works."""

    objects_downloaded: int
    bytes_downloaded: int
    retries: int
    errors: int
    objects_skipped: int
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
    quarantined_corrupt: int
    quarantined_too_large: int
    quarantined_timeout: int
    quarantined_plugin_error: int


QuarantineCounter = Literal[
    "quarantined_corrupt",
    "quarantined_too_large",
    "quarantined_timeout",
    "quarantined_plugin_error",
]


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
    objects_quarantined: int = 0
    quarantined_corrupt: int = 0
    quarantined_too_large: int = 0
    quarantined_timeout: int = 0
    quarantined_plugin_error: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass(frozen=True)
class ErrorEntry:
    """One error a child recorded for status: when, which object key (if any), what."""

    time: float = 0.0
    key: str | None = None
    error: str = ""

    @classmethod
    def from_json(cls, raw: Any) -> ErrorEntry | None:
        return cls(**scalar_fields(cls, raw)) if isinstance(raw, Mapping) else None

    @classmethod
    def list_from_json(cls, raw: Any) -> tuple[ErrorEntry, ...]:
        entries = (cls.from_json(e) for e in raw) if isinstance(raw, list) else ()
        return tuple(e for e in entries if e is not None)


@dataclass(frozen=True)
class ChildReport:
    """A child's report as the supervisor reads it (``ChildReport()``: no report yet)."""

    name: str = ""
    pid: int = 0
    heartbeat: float = 0.0  # epoch seconds of the last report, for display; 0: never
    # time.monotonic() of the last report; 0: never (or a child from before it was written).
    # CLOCK_MONOTONIC is system-wide on Linux, so the supervisor compares it with its own
    # time.monotonic(): an NTP step of the wall clock cannot make a live child look silent.
    beat: float = 0.0
    ready: bool = False
    activity: Activity | None = None
    activity_text: str | None = None  # as people read it; an unknown activity as written
    counts: Counts = field(default_factory=Counts)
    epoch: int | None = None
    epoch_objects: int = 0
    epoch_objects_done: int = 0
    epoch_bytes: int = 0
    epoch_bytes_done: int = 0
    window_bytes: int = 0
    window_fetching_bytes: int = 0
    objects_listed: int = 0
    keep_bytes: int = 0
    ram_wait_s: float = 0.0
    objects_open: int = 0
    last_errors: tuple[ErrorEntry, ...] = ()
    boot_error: str | None = None
    fatal: str | None = None
    stopped: bool = False
    version: int = 0

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ChildReport:
        """The one decoder (see the module docstring for other versions); never raises."""
        activity, text = parse_activity(raw.get("activity"), raw.get("activity_detail"))
        decoded = {
            **scalar_fields(cls, raw),
            "activity": activity,
            "activity_text": text,  # derived, whatever the record holds under that name
            "counts": Counts(**scalar_fields(Counts, raw)),
            "last_errors": ErrorEntry.list_from_json(raw.get("last_errors")),
        }
        return cls(**decoded)


def report_json(
    *,
    name: str,
    pid: int,
    heartbeat: float,
    beat: float,
    ready: bool,
    counters: Mapping[str, object],
    last_errors: Iterable[ErrorEntry],
    boot_error: str | None = None,
    fatal: str | None = None,
    stopped: bool = False,
) -> dict[str, Any]:
    """The one encoder: the JSON object of a report, ``counters`` being the role's
    ``DownloaderCounters`` or ``WriterCounters`` (an ``Activity`` encodes as its code)."""
    record: dict[str, Any] = {
        "version": REPORT_VERSION,
        "name": name,
        "pid": pid,
        "heartbeat": heartbeat,
        "beat": beat,
        "ready": ready,
        **counters,
        "last_errors": [{"time": e.time, "key": e.key, "error": e.error} for e in last_errors],
    }
    if boot_error is not None:
        record["boot_error"] = boot_error
    if fatal is not None:
        record["fatal"] = fatal
    if stopped:
        record["stopped"] = True
    return record
