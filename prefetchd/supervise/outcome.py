"""How a finished job ended: every record delivered, or all but those of some objects.

A job that quarantined an object (``write/quarantine.py``) or skipped one (a download that
could never succeed) delivered every other record; it must not end like a clean one. When the
last epoch is consumed, ``outcome`` says which (the status record's ``outcome`` and
``outcome_summary``, the daemon's last log line), and ``prefetchd run`` exits
``EXIT_INCOMPLETE`` (4) instead of 0. With ``output.on_bad_object: fail`` the first such object
fails the daemon at once (``bad_object_failure``), naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefetchd.logs import escape_key
from prefetchd.messages.child_report import ErrorEntry
from prefetchd.messages.counters import Counts
from prefetchd.sizes import format_size

COMPLETE = "complete"
INCOMPLETE = "incomplete"


def undelivered(counts: Counts) -> tuple[int, int]:
    """Objects (and their bytes) whose records were not delivered: quarantined or skipped."""
    objects = counts.objects_quarantined + counts.objects_skipped
    return objects, counts.bytes_quarantined + counts.bytes_skipped


def outcome(counts: Counts) -> tuple[str, str]:
    """``(outcome, summary)`` of a finished job."""
    objects, size = undelivered(counts)
    if not objects:
        return COMPLETE, "every record delivered"
    parts = []
    if counts.objects_quarantined:
        parts.append(f"{counts.objects_quarantined} quarantined")
    if counts.objects_skipped:
        parts.append(f"{counts.objects_skipped} skipped")
    return INCOMPLETE, (
        f"delivered except {objects} objects ({format_size(size)}): {', '.join(parts)}"
    )


def bad_object_failure(
    counts: Counts, errors: Sequence[ErrorEntry], bucket: str | None
) -> str | None:
    """With ``output.on_bad_object: fail``: the reason to fail, naming the object (by its key
    alone when ``bucket`` is None: sources in several buckets); None while every object was
    delivered."""
    objects, _ = undelivered(counts)
    if not objects:
        return None
    last = errors[-1] if errors else None
    if last is None or last.key is None:
        return "output.on_bad_object is fail and an object was not delivered (see the log)"
    where = f"s3://{bucket}/" if bucket is not None else "key "
    named = f"{where}{escape_key(last.key)}: {escape_key(last.error)}"
    return f"output.on_bad_object is fail and an object was not delivered: {named}"
