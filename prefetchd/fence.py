"""The job fence: which job's shards ``output.ram_dir`` holds, and whether that job's daemon is
running. Trainers claim only under it, so they never read another job's shards.

``ram_dir/prefetchd.job`` is one JSON object::

    {"version": 1, "job": "3f0c9a1d2b4e5f60", "note": "resuming job 3f0c9a1d2b4e5f60 ..."}

The supervisor removes it first thing after it owns its directories (``remove_fence``), decides
whether it resumes the job its state holds or starts a new one (``supervise/job.py``: a new
one wipes what the old one left), and only then, before any child starts, writes the fence of
the job it runs (``write_fence``): by temp file and rename, the temp file flocked (exclusive)
before the rename, and the lock held by the supervisor for its whole life. So:

- the fence a trainer finds names the job every shard in ``ready/`` belongs to, from its
  writing until a daemon next starts;
- the fence is *live* (``Fence.live``: its flock is held) exactly while the daemon that wrote
  it runs; a daemon stopped, killed or crashed leaves it stale, and its next start never
  locks that inode again (it writes a new one).

A trainer (``consume/job_guard.py``) adopts the first live fence it sees and from then on
claims while the fence is that file (one ``stat`` per claim round; it keeps the file open, so
the inode number cannot pass to a new fence: ``open_fence``), or another naming the same job
(a restart that resumed it); a fence of another job raises ``JobChanged``. A stale fence is
never adopted: it may be the leftovers of a job that the daemon about to start replaces.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

from prefetchd.atomic import temp_name, write_all

FENCE_VERSION = 1
_MAX_BYTES = 4096


@dataclass(frozen=True)
class Fence:
    """One reading of the fence: the job it names, what its daemon said about it, whether
    that daemon holds it now, and the file's identity (``(st_dev, st_ino)``)."""

    job: str
    note: str
    live: bool
    inode: tuple[int, int]


def write_fence(path: Path, job: str, note: str) -> int:
    """Publish the fence of ``job`` at ``path``, locked before it is visible; returns the
    descriptor holding the lock (keep it open while the daemon runs; closing it, or the
    process ending, makes the fence stale)."""
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new inode: nobody else can hold it
        raw = {"version": FENCE_VERSION, "job": job, "note": note}
        write_all(fd, json.dumps(raw).encode())
        os.fsync(fd)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return fd


def remove_fence(path: Path) -> None:
    """Take the fence down: from now until the next ``write_fence`` no trainer claims."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def read_fence(path: Path) -> Fence | None:
    """The fence at ``path``, or None if there is none (or it names no job: treated as absent,
    so a trainer waits rather than guesses)."""
    opened = open_fence(path)
    if opened is None:
        return None
    os.close(opened[1])
    return opened[0]


def open_fence(path: Path) -> tuple[Fence, int] | None:
    """``read_fence``, and a descriptor left open on that file (the caller closes it). While
    it is open the file's inode cannot be freed, so its number is not reused: a later ``stat``
    of ``path`` showing the same ``(st_dev, st_ino)`` is this very fence, not a new one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fence = _read(fd)
    except BaseException:
        os.close(fd)
        raise
    if fence is None:
        os.close(fd)
        return None
    return fence, fd


def _read(fd: int) -> Fence | None:
    info = os.fstat(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        live = False  # nobody holds it
    except BlockingIOError:
        live = True
    data = os.read(fd, _MAX_BYTES)
    try:
        raw = json.loads(data)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    # the rule of messages/wire.py: fields not known are ignored, whatever the version
    job, note = raw.get("job"), raw.get("note")
    if not isinstance(job, str) or not job:
        return None
    return Fence(job, note if isinstance(note, str) else "", live, (info.st_dev, info.st_ino))
