"""The kernel's floor under the daemon's per-object file protocol (issue 28's 0.4 ms bar).

    python -m bench.profile.floor [--objects 3000] [--size 131072] [--repeats 5]
        [--modes files,creates,nometa,pack,zerocopy] [--cache-dir DIR]

Compiles ``floor.c`` (next to this file) with ``gcc -O2`` into a temporary directory and runs it
``--repeats`` times per mode, the modes interleaved, each run in a fresh private cache directory
on the filesystem a user's ``download.cache_dir`` is on (``bench.harness.layout.disk_parent``,
or under ``--cache-dir``) and a fresh one on ``/dev/shm`` for the shard. ``floor.c`` does, in
one C thread, each system call the downloader and a writer make for a small object, and
counts that thread's CPU per side: what the file protocol costs with nothing else around it
(no interpreter, no thread hand-overs, no other process). Its modes:

- ``files``: the protocol as it is (``.part`` and meta from spares, renames, the writer's
  reads, the shard write, both files emptied into spares);
- ``creates``: every ``.part`` and meta created new and deleted after (a run's first window,
  before any spare exists);
- ``nometa``: ``files`` without the meta file;
- ``pack``: the bodies appended to one cache file and read back from it (no inode work);
- ``zerocopy``: ``files``, but the writer moves each body into the shard with ``sendfile``
  instead of reading it into its own buffer and writing it out (one copy of the bytes, not two;
  the record's CRC would come with the meta, taken by the engine while receiving).

Prints the median and the minimum, in ms per object, of the downloader's side, the writer's and
their sum. Everything is removed after each run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness.layout import disk_parent

SOURCE = Path(__file__).with_name("floor.c")
MODES = ("files", "creates", "nometa", "pack", "zerocopy")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=3000)
    parser.add_argument("--size", type=int, default=128 * 1024, help="bytes per object")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--cache-dir", default=None, help="parent of the cache directories")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}")
    args.modes = modes
    return args


def build(into: Path) -> Path:
    """``floor.c`` compiled into ``into``."""
    binary = into / "floor"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(binary), str(SOURCE), "-lpthread"], check=True)
    return binary


def run_once(
    binary: Path, mode: str, args: argparse.Namespace, parent: Path
) -> tuple[float, float]:
    """One run of ``mode`` in fresh directories: (downloader, writer) ms per object."""
    cache = Path(tempfile.mkdtemp(prefix="prefetchd-floor-", dir=parent))
    ram = Path(tempfile.mkdtemp(prefix="prefetchd-floor-", dir="/dev/shm"))
    try:
        out = subprocess.run(
            [str(binary), str(cache), str(ram), mode, str(args.objects), str(args.size)],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout.split()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)
    return float(out[1]), float(out[2])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parent = Path(args.cache_dir) if args.cache_dir else disk_parent()
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory(prefix="prefetchd-floor-build-") as tmp:
        binary = build(Path(tmp))
        for _ in range(args.repeats):
            for mode in args.modes:
                runs[mode].append(run_once(binary, mode, args, parent))
    print(
        f"# {args.objects} objects of {args.size} B, cache under {parent}, shard on /dev/shm, "
        f"{args.repeats} repeats interleaved; ms per object, median (min)"
    )
    for mode, results in runs.items():
        down = [d for d, _ in results]
        write = [w for _, w in results]
        total = [d + w for d, w in results]
        print(
            f"{mode:8} downloader {statistics.median(down):.3f} ({min(down):.3f})"
            f"  writer {statistics.median(write):.3f} ({min(write):.3f})"
            f"  total {statistics.median(total):.3f} ({min(total):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
