"""What the daemon costs while it waits: CPU per second of each process with the RAM budget full.

    python -m bench.profile.idle [--seconds 20] [--writers 1] [--repeats 3]

With the trainer the slow part — the case prefetchd is built for — the RAM budget stays full,
the writers wait for room and the downloader waits for the window; every CPU-second the
daemon spends then is taken from the trainer's host for nothing. This starts a moto server on
127.0.0.1 (``testkit.s3server``), uploads 200 raw objects of 128 KiB, runs ``prefetchd run``
with a 2 MiB RAM budget and no trainer, waits until the budget is full (status
``writer_ram_wait_s`` grows), then reads each process's CPU (user + system, ``/proc/<pid>/stat``)
over ``--seconds`` and prints ms of CPU per second by process name (``prefetchd-dl``,
``prefetchd-w<i>``; the supervisor is ``python`` under ``python -m prefetchd``), median of the
repeats. Everything it starts is stopped by PID and every directory removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import yaml

from testkit import sample_data
from testkit.s3server import moto_server, stop_process

BUCKET = "idle-profile"
OBJECTS, SIZE = 200, 128 * 1024
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    pids = [pid]
    for task in os.listdir(f"/proc/{pid}/task"):
        children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        for child in children:
            pids += process_tree(int(child))
    return pids


def per_second(
    names: Mapping[int, str], before: Mapping[int, float], after: Mapping[int, float], span: float
) -> dict[str, float]:
    """ms of CPU per second by process name, between two readings ``span`` seconds apart
    (pure; processes of one name are added up, one gone meanwhile is left out)."""
    out: dict[str, float] = {}
    for pid, name in names.items():
        if pid in before and pid in after:
            out[name] = out.get(name, 0.0) + 1000 * (after[pid] - before[pid]) / span
    return out


def config(directory: Path, ram: Path, endpoint: str, writers: int) -> dict[str, object]:
    return {
        "source": {
            "url": f"s3://{BUCKET}/idle/",
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "format": "raw",
        },
        "epochs": {"count": 1},
        "download": {"cache_dir": str(directory / "cache"), "window": "8MiB"},
        "output": {
            "ram_dir": str(ram),
            "ram_budget": f"{2 * (writers + 1)}MiB",
            "shard_size": "512KiB",
            "writers": writers,
        },
        "status": {"state_dir": str(directory / "state")},
    }


def waiting(state: Path) -> bool:
    """Whether the daemon's writers have started waiting for room (status)."""
    try:
        status = json.loads((state / "status.json").read_text())
    except (OSError, ValueError):
        return False
    return float(status.get("writer_ram_wait_s") or 0) > 0


def one_run(endpoint: str, args: argparse.Namespace) -> dict[str, float]:
    directory = Path(tempfile.mkdtemp(prefix="prefetchd-idle-"))
    ram = Path(tempfile.mkdtemp(prefix="prefetchd-idle-", dir="/dev/shm"))
    path = directory / "prefetchd.yaml"
    path.write_text(yaml.safe_dump(config(directory, ram / "ram", endpoint, args.writers)))
    path.chmod(0o600)
    command = [sys.executable, "-m", "prefetchd", "run", "--config", str(path)]
    with open(directory / "daemon.log", "wb") as log:
        daemon = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not waiting(directory / "state"):
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"the daemon never filled its RAM budget: see {directory}")
            time.sleep(0.2)
        time.sleep(2)  # the first shards' hand-overs done: only the wait is left
        pids = process_tree(daemon.pid)
        names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids}
        before = {pid: process_cpu(pid) for pid in pids}
        started = time.monotonic()
        time.sleep(args.seconds)
        after = {pid: process_cpu(pid) for pid in pids if Path(f"/proc/{pid}").exists()}
        return per_second(names, before, after, time.monotonic() - started)
    finally:
        stop_process(daemon)
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "idle-profile")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "idle-profile")
    runs: list[dict[str, float]] = []
    with moto_server() as endpoint:
        client = sample_data.make_client(endpoint)
        sample_data.ensure_bucket(client, BUCKET)
        for i in range(OBJECTS):
            client.put_object(Bucket=BUCKET, Key=f"idle/{i:04d}.bin", Body=os.urandom(SIZE))
        for _ in range(args.repeats):
            runs.append(one_run(endpoint, args))
    print(f"# RAM budget full, no trainer; ms of CPU per second, median of {args.repeats}")
    for name in sorted({n for run in runs for n in run}):
        values = [run[name] for run in runs if name in run]
        print(
            f"{name:16} {statistics.median(values):6.1f} (runs {min(values):.1f}-{max(values):.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
