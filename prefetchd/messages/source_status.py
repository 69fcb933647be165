"""One source's figures in a job of several sources (``sources:``, docs/sources.md): the
downloader keeps them (``DownloaderCounters.sources``), its report carries them
(``ChildReport.sources``) and ``status.json`` shows them (``StatusRecord.sources``), each entry
a JSON object with the fields of ``SourceStatus`` (the rule for other versions:
``messages/wire.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefetchd.messages.wire import scalar_fields


@dataclass(frozen=True)
class SourceStatus:
    """One source of a job of several (``sources:``), as the downloader reports it and status
    shows it: its weight in the epoch being downloaded (normalized), what it downloaded (this
    run of the downloader; ``bytes_per_s`` is the supervisor's rate over the last 10 s), its
    bytes in the window, and its part of that epoch: planned, done, and ``share``, its share of
    the epoch's bytes downloaded so far (the weight, to within an object, once it is done)."""

    name: str = ""
    weight: float = 0.0
    objects_downloaded: int = 0
    bytes_downloaded: int = 0
    bytes_per_s: float = 0.0
    window_bytes: int = 0
    epoch_bytes: int = 0
    epoch_bytes_done: int = 0
    share: float | None = None


def source_entries(raw: Any) -> tuple[SourceStatus, ...]:
    """The entries of a message's ``sources`` (a JSON list); other values left out."""
    entries = raw if isinstance(raw, list) else ()
    return tuple(
        SourceStatus(**scalar_fields(SourceStatus, e)) for e in entries if isinstance(e, Mapping)
    )
