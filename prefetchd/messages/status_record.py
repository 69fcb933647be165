"""The status record: ``state_dir/status.json``, what ``prefetchd status --json`` prints.

The supervisor builds a ``StatusRecord`` about once a second and writes ``encode()``
atomically; ``prefetchd status``, the metrics endpoint and the trainers (``ready_files()``
watches ``state``, ``reason`` and ``updated``) read it back with ``StatusRecord.decode``.
The keys are interface, documented in ``docs/status.md``: they are never removed or renamed,
and each key of the JSON is the field of the same name here (``counts``' fields sit at the top
level of the JSON, ``extra`` holds keys this version does not know).

Other versions (rule: ``prefetchd.messages.wire``): ``version`` is ``StatusRecord.VERSION``; a
record without it is version 0 (the same keys). A reader of any version reads any record: a
missing key takes its default (0, null, empty), a key it does not know is kept in ``extra`` and
written back by ``encode``, so ``status --json`` of an older client shows a newer daemon's keys
as written. A JSON object without a string ``state`` is not a status record.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Self

from prefetchd.messages.child_report import ErrorEntry, error_entries
from prefetchd.messages.counters import Counts, quarantined_by_reason
from prefetchd.messages.epoch_keep import EpochKeep
from prefetchd.messages.source_status import SourceStatus, source_entries
from prefetchd.messages.wire import MessageError, field_names, json_object, scalar_fields

VERDICTS = ("consumer-bound", "store-bound", "writer-bound", "ram-bound", "idle", "unknown")


class DaemonState(enum.StrEnum):
    """The daemon's state, the record's ``state`` (its transitions: ``supervise/states.py``)."""

    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class Verdict:
    """The bottleneck verdict (``supervise/diagnosis.py``) and the figures behind it."""

    verdict: str  # one of VERDICTS (another version may know others)
    summary: str
    evidence: list[str] = field(default_factory=list)


def _verdict(raw: Any) -> Verdict | None:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("verdict"), str):
        return None
    evidence = raw.get("evidence")
    lines = [str(e) for e in evidence] if isinstance(evidence, list) else []
    return Verdict(raw["verdict"], str(raw.get("summary") or ""), lines)


@dataclass(frozen=True)
class ChildStatus:
    """One child process as status shows it."""

    pid: int | None = None
    alive: bool = False
    restarts: int = 0
    state: str = ""  # a ChildState
    activity: str | None = None  # the words, as the table shows them
    healthy: bool = False
    heartbeat_age_s: float | None = None


@dataclass(frozen=True)
class EpochStatus:
    """Download progress of one epoch not yet complete."""

    epoch: int = 0
    state: str = ""  # "downloading" | "downloaded"
    objects: int = 0
    objects_done: int = 0
    bytes: int = 0
    bytes_done: int = 0
    eta_s: float | None = None


def _nested(cls: type[Any], raw: Any) -> Any:
    return cls(**scalar_fields(cls, raw)) if isinstance(raw, Mapping) else None


@dataclass(frozen=True)
class StatusRecord:
    """The daemon's state and figures; see ``docs/status.md`` for each key."""

    VERSION: ClassVar[int] = 1

    state: str  # a DaemonState (another version may know others)
    reason: str | None = None
    # once done: "complete" (every record delivered) or "incomplete" (supervise/outcome.py)
    outcome: str | None = None
    outcome_summary: str | None = None
    pid: int = 0
    prefetchd_version: str | None = None  # the running daemon's release, not the reader's
    config: str | None = None
    # the job it runs (state_dir/job.json) and its first log line: resumed or new, and why
    job_id: str | None = None
    job: str | None = None
    started: float = 0.0
    updated: float = 0.0  # epoch seconds, for people
    # time.monotonic() of the same moment (CLOCK_MONOTONIC, system-wide): what staleness is
    # judged by, so a step of the wall clock never makes a live daemon look gone; 0: not written
    updated_monotonic: float = 0.0
    uptime_s: float | None = None
    epoch: int = 0
    epochs_total: int | None = None
    download_epoch: int | None = None
    epoch_objects: int = 0
    epoch_objects_done: int = 0
    epoch_bytes: int = 0
    epoch_bytes_done: int = 0
    epochs: tuple[EpochStatus, ...] = ()
    job_eta_s: float | None = None
    download_activity: str | None = None
    objects_listed: int = 0  # the downloader's listing so far (its activity says if it lists)
    counts: Counts = field(default_factory=Counts)
    shards_ready: int = 0
    shards_claimed: int = 0
    window_bytes: int = 0
    window_fetching_bytes: int = 0
    window_limit: int = 0
    concurrency_limit: int = 0  # requests allowed in flight now (adaptive)
    concurrency: int = 0  # download.concurrency, the most it grows back to
    max_requests_per_s: float | None = None  # download.max_requests_per_s
    max_bytes_per_s: int | None = None  # download.max_bytes_per_s
    budget_wait_s: float = 0.0  # seconds requests were held back by those budgets
    store_unreachable_since: float | None = None  # wall clock; null while the store answers
    store_errors: int = 0  # failures in a row of that outage
    store_last_error: str | None = None
    keep_bytes: int = 0
    keep_limit: int = 0
    keep_hit_ratio: float | None = None
    keep_epochs: tuple[EpochKeep, ...] = ()
    ram_bytes: int = 0
    ram_budget: int = 0
    download_bytes_per_s: float = 0.0
    write_records_per_s: float = 0.0
    download_bytes_per_s_avg: float = 0.0
    write_records_per_s_avg: float = 0.0
    writer_ram_wait_s: float = 0.0
    writer_ram_wait_ratio: float = 0.0
    consumers: int = 0
    consumers_waiting: int = 0
    consumer_wait_s: float = 0.0
    consumer_wait_ratio: float = 0.0
    # where the live trainer processes that resumed from a saved position did ("; "-joined)
    trainers_resumed: str | None = None
    # the job resumed the interrupted epoch of a job run on another number of hosts
    job_resumed: str | None = None
    children: dict[str, ChildStatus] = field(default_factory=dict)
    last_errors: tuple[ErrorEntry, ...] = ()
    sources: tuple[SourceStatus, ...] = ()  # with several sources (sources:), one each
    bottleneck: Verdict | None = None
    version: int = VERSION  # of the record read (``encode`` writes it back as read)
    extra: dict[str, Any] = field(default_factory=dict)

    def age(self, *, monotonic: float | None = None) -> float:
        """Seconds since the daemon wrote this record, by the system-wide monotonic clock (a
        wall-clock step changes nothing). A record without ``updated_monotonic`` (an older
        daemon), or one from before a reboot (its monotonic time lies ahead of ours), is aged
        by the wall clock instead."""
        now = time.monotonic() if monotonic is None else monotonic
        if 0 < self.updated_monotonic <= now:
            return now - self.updated_monotonic
        return time.time() - self.updated

    def encode(self) -> bytes:
        """The one encoder: the JSON object ``status.json`` holds."""
        record: dict[str, Any] = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in _STRUCTURED
        }
        record.update(asdict(self.counts))
        record["epochs"] = [asdict(e) for e in self.epochs]
        record["keep_epochs"] = [e.status_entry() for e in self.keep_epochs]
        record["children"] = {name: asdict(c) for name, c in self.children.items()}
        record["last_errors"] = [asdict(e) for e in self.last_errors]
        record["sources"] = [asdict(s) for s in self.sources]
        record["bottleneck"] = asdict(self.bottleneck) if self.bottleneck else None
        record["quarantined_by_reason"] = quarantined_by_reason(self.counts)
        return json.dumps({**self.extra, **record}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Self:
        """The one decoder; ``MessageError`` if ``data`` holds no status record, else never
        raises."""
        raw = json_object(data)
        if not isinstance(raw.get("state"), str):
            raise MessageError("a JSON object without a state")
        children = raw.get("children")
        epochs = raw.get("epochs")
        keep_epochs = (
            EpochKeep.decode_object(x) for x in _list(raw.get("keep_epochs")) if _object(x)
        )
        decoded = {
            "version": 0,  # records of daemons before VERSION 1 have no version key
            **scalar_fields(cls, raw),
            "epochs": tuple(
                e for e in (_nested(EpochStatus, x) for x in _list(epochs)) if e is not None
            ),
            "keep_epochs": tuple(keep_epochs),
            "counts": Counts(**scalar_fields(Counts, raw)),
            "children": {
                str(name): _nested(ChildStatus, child)
                for name, child in (children.items() if isinstance(children, Mapping) else ())
                if isinstance(child, Mapping)
            },
            "last_errors": error_entries(raw.get("last_errors")),
            "sources": source_entries(raw.get("sources")),
            "bottleneck": _verdict(raw.get("bottleneck")),
            "extra": {k: v for k, v in raw.items() if k not in _KNOWN},
        }
        return cls(**decoded)


def _list(raw: Any) -> list[Any]:
    return raw if isinstance(raw, list) else []


def _object(raw: Any) -> bool:
    return isinstance(raw, Mapping)


_STRUCTURED = frozenset(
    {"counts", "epochs", "keep_epochs", "children", "last_errors", "bottleneck", "extra"}
    | {"sources"}
)
_KNOWN = (field_names(StatusRecord) - {"counts", "extra"}) | field_names(Counts)
_KNOWN |= {"quarantined_by_reason"}  # derived from the counts, never kept as extra
