"""Child reports: what a child tells the supervisor in ``state_dir/children/<child>.json``.

A child (``ChildContext.report``) rewrites its file atomically about twice a second from its
main loop with ``ChildReport.of(...).encode()``; the supervisor reads it with
``ChildReport.decode`` for heartbeats, readiness, counters and the last errors. One JSON
object::

    {"version": 1, "name": "writer-0", "pid": 123, "heartbeat": <epoch seconds>,
     "beat": <time.monotonic() seconds>,
     "ready": true, "activity": "waiting-for-ram", <the counters>,
     "last_errors": [{"time", "key", "error"}],
     "boot_error": "...", "fatal": "...", "stopped": true}        (the last three when set)

The counters are the role's ``DownloaderCounters`` or ``WriterCounters`` (``counters.py``),
each at the top level under its own name; ``activity`` is an ``Activity`` (``activity.py``)
and ``activity_detail`` the reason that goes with it (why downloads are paused).

Other versions (rule: ``prefetchd.messages.wire``): unknown fields are ignored, missing ones
read as 0, None or empty. A report without ``version`` (version 0, before activities were
codes) has the same fields but ``activity`` as display text; it is mapped back to its
``Activity`` here. An activity this reader does not know is shown as written and counts as no
activity in the verdict.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Self

from prefetchd.messages.activity import Activity, parse_activity
from prefetchd.messages.counters import Counts
from prefetchd.messages.source_status import SourceStatus, source_entries
from prefetchd.messages.wire import json_object, scalar_fields


@dataclass(frozen=True)
class ErrorEntry:
    """One error a child recorded for status: when, which object key (if any), what."""

    time: float = 0.0
    key: str | None = None
    error: str = ""


def _sources(raw: object) -> tuple[SourceStatus, ...]:
    """A role's ``sources`` counter (a list of ``SourceStatus``) as the report's tuple."""
    return tuple(s for s in raw if isinstance(s, SourceStatus)) if isinstance(raw, list) else ()


def error_entries(raw: Any) -> tuple[ErrorEntry, ...]:
    """The entries of a message's ``last_errors`` (a JSON list); other values left out."""
    entries = raw if isinstance(raw, list) else ()
    return tuple(ErrorEntry(**scalar_fields(ErrorEntry, e)) for e in entries if _object(e))


def _object(raw: Any) -> bool:
    return isinstance(raw, Mapping)


@dataclass(frozen=True)
class ChildReport:
    """A child's report: its heartbeat, readiness, activity, counters and last errors
    (``ChildReport()``: no report yet)."""

    VERSION: ClassVar[int] = 1

    name: str = ""
    pid: int = 0
    heartbeat: float = 0.0  # epoch seconds of the last report, for display; 0: never
    # time.monotonic() of the last report; 0: never (or a child from before it was written).
    # CLOCK_MONOTONIC is system-wide on Linux, so the supervisor compares it with its own
    # time.monotonic(): an NTP step of the wall clock cannot make a live child look silent.
    beat: float = 0.0
    ready: bool = False
    activity: Activity | None = None
    activity_detail: str | None = None  # with PAUSED: the reason and the retry delay
    activity_text: str | None = None  # as people read it; an unknown activity as written
    counts: Counts = field(default_factory=Counts)
    epoch: int | None = None
    epoch_objects: int = 0
    epoch_objects_done: int = 0
    epoch_bytes: int = 0
    epoch_bytes_done: int = 0
    window_bytes: int = 0
    window_fetching_bytes: int = 0
    window_limit: int = 0
    objects_listed: int = 0
    concurrency_limit: int = 0
    budget_wait_s: float = 0.0
    store_unreachable_since: float | None = None
    store_errors: int = 0
    store_last_error: str | None = None
    keep_bytes: int = 0
    ram_wait_s: float = 0.0
    objects_open: int = 0
    last_errors: tuple[ErrorEntry, ...] = ()
    sources: tuple[SourceStatus, ...] = ()  # the downloader's, with several sources
    boot_error: str | None = None
    fatal: str | None = None
    stopped: bool = False
    version: int = 0  # of the report read; ``encode`` writes VERSION

    @classmethod
    def of(
        cls,
        counters: Mapping[str, object],
        *,
        last_errors: Iterable[ErrorEntry] = (),
        **header: Any,
    ) -> Self:
        """The report of a child whose role keeps ``counters`` (its ``DownloaderCounters``
        or ``WriterCounters``); ``header``: the other fields (name, pid, heartbeat...)."""
        activity = counters.get("activity")
        return cls(
            **scalar_fields(cls, counters),
            **header,
            activity=activity if isinstance(activity, Activity) else None,
            counts=Counts(**scalar_fields(Counts, counters)),
            last_errors=tuple(last_errors),
            sources=_sources(counters.get("sources")),
        )

    def encode(self) -> bytes:
        """The one encoder: the report's JSON object (an ``Activity`` as its code)."""
        record: dict[str, Any] = {"version": self.VERSION}
        record.update(
            (f.name, getattr(self, f.name)) for f in fields(self) if f.name not in _STRUCTURED
        )
        record["activity"] = self.activity
        record.update(asdict(self.counts))
        record["last_errors"] = [asdict(e) for e in self.last_errors]
        if self.sources:
            record["sources"] = [asdict(s) for s in self.sources]
        if self.boot_error is not None:
            record["boot_error"] = self.boot_error
        if self.fatal is not None:
            record["fatal"] = self.fatal
        if self.stopped:
            record["stopped"] = True
        return json.dumps(record).encode()

    @classmethod
    def decode(cls, data: bytes) -> Self:
        """The one decoder (see the module docstring for other versions); ``MessageError``
        if ``data`` holds no JSON object, else never raises."""
        return cls.decode_object(json_object(data))

    @classmethod
    def decode_object(cls, raw: Mapping[str, Any]) -> Self:
        """``decode`` of the JSON object already parsed (``status.read_children``)."""
        activity, text = parse_activity(raw.get("activity"), raw.get("activity_detail"))
        decoded = {
            **scalar_fields(cls, raw),
            "activity": activity,
            "activity_text": text,  # derived, whatever the record holds under that name
            "counts": Counts(**scalar_fields(Counts, raw)),
            "last_errors": error_entries(raw.get("last_errors")),
            "sources": source_entries(raw.get("sources")),
        }
        return cls(**decoded)


_STRUCTURED = frozenset(
    {"version", "activity", "activity_text", "counts", "last_errors", "boot_error", "fatal"}
    | {"stopped", "sources"}
)
