"""Which job a starting daemon runs, and the sentence that says so.

The state directory belongs to one job: ``state_dir/job.json`` holds its id (16 hex digits,
drawn when the job starts), the config's fingerprint (``Config.job_fingerprint``: source,
sharding, epochs, compression, writers) and whether it finished. A daemon starting with the
same fingerprint as an unfinished job resumes it; otherwise it starts a new job with a new id,
wiping what the old one left. The id changes even when the config does not (the state was
removed, the job finished), so a trainer can tell a new job's shards from an old one's by the
job fence in ram_dir (``fence.py``), whatever the config says.

``JobStart.note`` is the daemon's first log line, ``status``'s ``job`` and the fence's note::

    resuming job 3f0c9a1d2b4e5f60 at epoch 1 of 2
    starting a new job 9ab2... (epochs.seed changed 0 -> 1; the old job's state and 3 shards
    were removed)
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefetchd.atomic import write_atomic
from prefetchd.layout import Layout
from prefetchd.logs import redact

# the fingerprint's keys (the format job.json has always had) as the config names them
_KEYS = {
    "url": ("source.url",),
    "endpoint_url": ("source.endpoint_url",),
    "include": ("source.include",),
    "format": ("source.format",),
    "manifest": ("source.manifest",),
    "num_workers": ("sharding.num_workers",),
    "worker_index": ("sharding.worker_index",),
    "epochs": ("epochs.count", "epochs.shuffle", "epochs.seed"),
    "compression": ("output.compression",),
    "writers": ("output.writers",),
}


@dataclass(frozen=True)
class JobStart:
    """What a starting daemon decided: the job it runs, whether it resumes it, and why not."""

    job: str
    resume: bool
    fingerprint: dict[str, Any]
    why_new: str  # "" when resumed: "epochs.seed changed 0 -> 1", "the previous job ... finished"
    had_job: bool  # the state held a job (its state is removed when a new one starts)

    def note(self, *, epoch: int, count: int | None, removed: int) -> str:
        """The sentence (``epoch``: the first not complete; ``removed``: shards wiped)."""
        if self.resume and count is not None and epoch >= count:
            return f"resuming job {self.job}: all {count} epochs written, left for trainers to read"
        if self.resume:
            of = f"of {count}" if count is not None else "(endless)"
            return f"resuming job {self.job} at epoch {epoch} {of}"
        if self.had_job:
            gone = (
                f"the old job's state and {removed} shards were"
                if removed
                else ("the old job's state was")
            )
        else:
            gone = f"{removed} shards another job left in output.ram_dir were" if removed else ""
        tail = f"; {gone} removed" if gone else ""
        return redact(f"starting a new job {self.job} ({self.why_new}{tail})")


def read_job(layout: Layout) -> dict[str, Any] | None:
    """``job.json``, or None (none, unreadable, not an object: no earlier job)."""
    try:
        raw = json.loads(layout.job_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def decide(layout: Layout, fingerprint: dict[str, Any]) -> JobStart:
    """Resume the job in ``layout``'s state if it is unfinished and has ``fingerprint``;
    otherwise a new job, saying why."""
    previous = read_job(layout)
    if previous is None:
        why = f"no earlier job in status.state_dir {layout.state}"
        return JobStart(new_id(), False, fingerprint, why, False)
    found = previous.get("id")
    old_id = found if isinstance(found, str) and found else ""
    named = f" {old_id}" if old_id else ""
    if previous.get("finished"):
        return JobStart(new_id(), False, fingerprint, f"the previous job{named} finished", True)
    changed = changes(previous.get("fingerprint"), fingerprint)
    if changed:
        return JobStart(new_id(), False, fingerprint, "; ".join(changed), True)
    # an unfinished job of an earlier release has no id: it gets one now
    return JobStart(old_id or new_id(), True, fingerprint, "", True)


def changes(old: Any, new: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints, as ``epochs.seed changed 0 -> 1``."""
    old_map: Mapping[str, Any] = old if isinstance(old, Mapping) else {}
    found = []
    for key in sorted(set(old_map) | set(new), key=_order):
        before, after = old_map.get(key), new.get(key)
        if before == after:
            continue
        names = _KEYS.get(key, (key,))
        if len(names) > 1 and isinstance(before, list) and isinstance(after, list):
            for name, b, a in zip(names, before, after, strict=False):
                if b != a:
                    found.append(f"{name} changed {_show(b)} -> {_show(a)}")
            continue
        found.append(f"{names[0]} changed {_show(before)} -> {_show(after)}")
    return found


def save_job(layout: Layout, start: JobStart) -> None:
    """``job.json`` for the job now running, not finished."""
    job = {"id": start.job, "fingerprint": start.fingerprint, "finished": False}
    write_atomic(layout.job_file, json.dumps({**job, "started": time.time()}).encode(), fsync=True)


def new_id() -> str:
    return secrets.token_hex(8)


def _order(key: str) -> int:
    keys = list(_KEYS)
    return keys.index(key) if key in keys else len(keys)


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
