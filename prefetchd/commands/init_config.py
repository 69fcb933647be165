"""``prefetchd init``: a commented starting config sized for this host.

``plan()`` is pure arithmetic from what the host has (cores, RAM, the RAM disk's size, free
local disk); ``render()`` writes it as YAML with a comment on every value saying where it came
from; ``probe_host()`` is the only part that looks at the machine. The sizes obey the rules
``prefetchd check`` advises (prefetchd/commands/sizing.py), so a fresh config gets no size warnings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from prefetchd.paths import default_cache_dir, default_ram_dir

MiB, GiB = 1024**2, 1024**3
DEFAULT_RAM_BUDGET = 4 * GiB
DEFAULT_SHARD = 128 * MiB
MIN_SHARD = 8 * MiB
DEFAULT_WINDOW = 16 * GiB
MIN_WINDOW = 1 * GiB
CONCURRENCY = 32  # docs/tuning.md: 16-32 measured best
PART_SIZE = 8 * MiB


@dataclass(frozen=True)
class Host:
    cores: int
    ram: int  # bytes of physical memory
    shm: int | None  # bytes of the filesystem the default ram_dir is on (None: unknown)
    disk_free: int | None  # bytes free where the default cache_dir goes (None: unknown)


@dataclass(frozen=True)
class Plan:
    writers: int
    ram_budget: int
    shard_size: int
    window: int
    concurrency: int
    notes: dict[str, str]  # key -> why this value


def plan(host: Host) -> Plan:
    """Sizes for ``host``: writers take at most half the cores (the trainer needs the rest);
    the RAM budget fits 90 % of the RAM disk and an eighth of RAM, and holds
    ``(2 x writers + 1)`` shards (smaller shards, then fewer writers, when it is tight); the
    window takes at most half the free local disk."""
    writers = 1 if host.cores < 4 else min(8, max(2, host.cores // 8))
    cap = host.ram // 8
    if host.shm is not None:
        cap = min(cap, host.shm * 9 // 10)
    budget = max((2 * writers + 1) * DEFAULT_SHARD, DEFAULT_RAM_BUDGET)
    shard = DEFAULT_SHARD
    if budget > cap:
        budget = _floor_mib(cap)
        while writers > 1 and (2 * writers + 1) * MIN_SHARD > budget:
            writers -= 1
        shard = max(MiB, min(DEFAULT_SHARD, _floor_mib(budget // (2 * writers + 1))))
    window = DEFAULT_WINDOW
    if host.disk_free is not None:
        window = max(MIN_WINDOW, min(window, _floor_gib(host.disk_free // 2)))
    notes = {
        "writers": f"{host.cores} cores: at most half for writers, the rest for the trainer",
        "ram_budget": _budget_note(host, writers),
        "window": (
            f"16GiB, or half the free local disk ({_gib(host.disk_free)}) if less"
            if host.disk_free is not None
            else "local disk free space unknown"
        ),
    }
    return Plan(writers, budget, shard, window, CONCURRENCY, notes)


def _budget_note(host: Host, writers: int) -> str:
    shm = f"RAM disk {_gib(host.shm)}" if host.shm is not None else "RAM disk size unknown"
    return (
        f"(2 x {writers} writers + 1) shards; at most 90% of the {shm} and 1/8 of "
        f"RAM {_gib(host.ram)}"
    )


def render(p: Plan, *, url: str, endpoint_url: str | None) -> str:
    """The config file's text: what ``plan`` sized, each value with why; every other key keeps
    its default."""
    lines = [
        "# Written by `prefetchd init` for this host; try it: prefetchd check --config FILE",
        "# Keys left out keep their defaults (configs/example.yaml lists every key). The",
        "# directories are left out too: they default to this user's own (root: /var/...).",
        "source:",
        f"  url: {url}",
    ]
    if endpoint_url:
        lines.append(f"  endpoint_url: {endpoint_url}")
        lines.append(_commented("  addressing_style: auto", "path for MinIO, Ceph RGW"))
    lines += [
        "epochs:",
        _commented("  count: 1", "null = repeat until stopped"),
        "download:",
        _commented(f"  window: {_size(p.window)}", p.notes["window"]),
        _commented(f"  concurrency: {p.concurrency}", "requests in flight; 16-32 measured best"),
        "output:",
        _commented(f"  writers: {p.writers}", p.notes["writers"]),
        _commented(f"  ram_budget: {_size(p.ram_budget)}", p.notes["ram_budget"]),
        _commented(f"  shard_size: {_size(p.shard_size)}", "RAM is freed a shard at a time"),
    ]
    return "\n".join(lines) + "\n"


def _commented(line: str, comment: str) -> str:
    return f"{line:<28}# {comment}"


def probe_host() -> Host:
    """What this machine has, for ``plan``."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return Host(
        cores=os.cpu_count() or 1,
        ram=pages,
        shm=_fs_size(default_ram_dir(), total=True),
        disk_free=_fs_size(default_cache_dir(), total=False),
    )


def _fs_size(path: Path, *, total: bool) -> int | None:
    """Total or free bytes of the filesystem ``path`` (or its nearest existing ancestor) is on."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return (st.f_blocks if total else st.f_bavail) * st.f_frsize
    return None


def _size(n: int) -> str:
    return f"{n // GiB}GiB" if n % GiB == 0 else f"{n // MiB}MiB"


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f} GiB"


def _floor_mib(n: int) -> int:
    """``n`` rounded down to a size worth writing: 512 MiB steps above 2 GiB, else MiB."""
    step = 512 * MiB if n >= 2 * GiB else MiB
    return max(MiB, n // step * step)


def _floor_gib(n: int) -> int:
    return n // GiB * GiB
