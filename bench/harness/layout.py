"""The daemon's layout in a benchmark run (``--layout``, ``--cache-dir``): where
``download.cache_dir`` goes and how many writers and connections the daemon gets.

- ``user`` (the default): what a user runs. The cache on the local disk, in a fresh private
  directory on the filesystem of prefetchd's own default (``prefetchd.paths.default_cache_dir``:
  ``~/.cache/prefetchd``, as root ``/var/cache/prefetchd``), removed after the run;
  ``output.writers`` and ``download.concurrency`` as ``prefetchd init`` sizes them for this host
  (``prefetchd.commands.init_config.plan``, the same function, not a copy of its arithmetic);
  ``output.mix`` the daemon's default.
- ``bench``: the layout of every table before issue 28: the cache on tmpfs (the bench's own
  ``/dev/shm`` directory, where the ceilings write too), 2 writers, 32 connections, ``mix`` 8.

``--cache-dir DIR`` puts the cache's private directory under ``DIR`` instead, with either layout
(``--cache-dir /dev/shm`` keeps the sizes of ``user`` with the cache on tmpfs). ``choose`` and
``filesystem`` are pure (unit-tested); ``resolve`` looks at the host and makes the directory.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefetchd.commands import init_config
from prefetchd.paths import default_cache_dir

LAYOUTS = ("user", "bench")
BENCH_WRITERS = 2
BENCH_CONCURRENCY = 32
BENCH_MIX = 8  # output.mix of the tables before issue 28 (the daemon's default was 8 then)


@dataclass(frozen=True)
class Layout:
    """The daemon's layout for every run of a benchmark: the parent of each run's
    ``download.cache_dir``, the filesystem it is on, the writers and connections, and why."""

    name: str
    cache_parent: Path
    writers: int
    concurrency: int
    sized_by: str  # where writers and concurrency came from
    cache_fs: str = "?"  # the filesystem type of cache_parent (/proc/mounts)
    mix: int | None = None  # output.mix; None = the daemon's default

    def describe(self) -> str:
        """One line for the tables' header and the results."""
        return (
            f"{self.name} (download.cache_dir under {self.cache_parent}, {self.cache_fs}; "
            f"output.writers {self.writers}, download.concurrency {self.concurrency}: "
            f"{self.sized_by}; output.mix {self.mix or 'default'})"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "cache_parent": str(self.cache_parent), "text": self.describe()}


BENCH = Layout(
    "bench", Path("/dev/shm"), BENCH_WRITERS, BENCH_CONCURRENCY, "the bench's", "tmpfs", BENCH_MIX
)


def choose(
    name: str, host: init_config.Host, *, cache_dir: Path | None, disk_parent: Path, ram: Path
) -> Layout:
    """The layout ``name`` on ``host`` (pure): ``user`` sizes writers and concurrency with
    ``prefetchd init``'s plan and puts the cache under ``disk_parent``; ``bench`` keeps 2 and
    32 and puts it under ``ram``; ``cache_dir``, if given, is the cache's parent either way."""
    if name == "bench":
        writers, concurrency = BENCH_WRITERS, BENCH_CONCURRENCY
        return Layout(name, cache_dir or ram, writers, concurrency, "the bench's", mix=BENCH_MIX)
    if name != "user":
        raise ValueError(f"unknown layout {name!r}; choose from {', '.join(LAYOUTS)}")
    plan = init_config.plan(host)
    sized_by = f"prefetchd init for {host.cores} cores"
    return Layout(name, cache_dir or disk_parent, plan.writers, plan.concurrency, sized_by)


def filesystem(path: Path, mounts: str) -> str:
    """The type of the filesystem ``path`` is on, from the text of ``/proc/mounts`` (pure): the
    longest mount point that is ``path`` or one of its parents; "?" if none is."""
    best, fs = -1, "?"
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (path == Path(point) or Path(point) in path.parents) and len(point) > best:
            best, fs = len(point), fields[2]
    return fs


def disk_parent() -> Path:
    """The nearest existing directory at or above where prefetchd's default cache_dir goes:
    the bench's private cache directory lands on the same filesystem a user's cache does, and
    nothing of the user's is created."""
    for candidate in (default_cache_dir().parent, *default_cache_dir().parents):
        if candidate.is_dir() and os.access(candidate, os.W_OK):
            return candidate
    return Path(tempfile.gettempdir())


def resolve(name: str, cache_dir: str | None, ram: Path) -> Layout:
    """The layout ``name`` for this host, with a fresh private directory made for the caches
    (the caller removes ``cache_parent`` after the run) and its filesystem named."""
    parent = Path(cache_dir) if cache_dir else None
    chosen = choose(
        name, init_config.probe_host(), cache_dir=parent, disk_parent=disk_parent(), ram=ram
    )
    private = Path(tempfile.mkdtemp(prefix="prefetchd-bench-cache-", dir=chosen.cache_parent))
    mounts = ""
    with contextlib.suppress(OSError):
        mounts = Path("/proc/mounts").read_text()
    return Layout(
        chosen.name,
        private,
        chosen.writers,
        chosen.concurrency,
        chosen.sized_by,
        filesystem(private.resolve(), mounts),
        chosen.mix,
    )
