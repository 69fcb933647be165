"""What a child is doing (``Activity``), as its report carries it and as people read it.

The value of an ``Activity`` is the code in a child report (``child_report.py``); version 0
reports wrote the display text instead, which ``parse_activity`` maps back.
"""

from __future__ import annotations

import enum
from typing import Any


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
