"""Start-up time and memory of the daemon with a very large ``source.manifest``.

Starts moto on 127.0.0.1, uploads a few real objects, writes a manifest of ``--keys`` lines
(``key<TAB>size``; all but the real ones are keys the bucket does not hold, which the daemon
skips as 404s, so the store needs no million objects), runs ``prefetchd run`` and samples the
memory of the whole process tree (supervisor, downloader, writers) every 0.1 s. Prints:

- start-up: seconds from ``prefetchd run`` until the downloader has read the manifest and the
  daemon reports ``running``;
- peak memory of the whole daemon, as the sum of each process's RSS (pages shared between
  processes counted once per process: an upper bound) and of PSS (shared pages split);
- peak RSS of the downloader alone, which holds the listing;
- a baseline run with ``--baseline-keys`` keys, so the listing's own cost is the difference.

    python -m bench.studies.manifest_scale --keys 1000000 --run-seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from testkit import s3server, sample_data

BUCKET = "manifest-scale"
REAL_OBJECTS = 50
MIB = 1024**2
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKEMANIFESTSCALE",
    "AWS_SECRET_ACCESS_KEY": "fake-secret-for-manifest-scale",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class Measurement:
    keys: int
    startup_s: float
    peak_rss: int
    peak_pss: int
    peak_downloader_rss: int
    samples: int
    skipped: int


def write_manifest(path: Path, real: dict[str, int], keys: int) -> None:
    """``keys`` lines: the real objects spread among keys that do not exist, unsorted."""
    step = max(1, keys // max(1, len(real)))
    real_items = list(real.items())
    with path.open("w", encoding="utf-8") as f:
        for i in range(keys):
            if i % step == 0 and real_items:
                key, size = real_items.pop()
                f.write(f"{key}\t{size}\n")
            else:  # a reversed counter: the file is not sorted, so the daemon sorts it
                f.write(f"train/images/shard-{keys - i:09d}/sample.tfrecord\t{4096 + i % 1000}\n")


def tree_memory(root: psutil.Process) -> tuple[int, int]:
    """(sum of RSS, sum of PSS) over the daemon's process tree."""
    rss = pss = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return rss, pss


def downloader_pid(state_dir: Path) -> int | None:
    try:
        report = json.loads((state_dir / "children" / "downloader.json").read_text())
    except (OSError, ValueError):
        return None
    pid = report.get("pid")
    return int(pid) if pid else None


def measure(
    endpoint: str, work: Path, real: dict[str, int], keys: int, run_s: float, where: str
) -> Measurement:
    work.mkdir(parents=True, exist_ok=True)
    manifest = work / "keys.txt"
    write_manifest(manifest, real, keys)
    source = str(manifest)
    if where == "s3":
        client = sample_data.make_client(endpoint)
        client.upload_file(str(manifest), BUCKET, f"manifests/{keys}.txt")
        source = f"s3://{BUCKET}/manifests/{keys}.txt"
    ram = Path(tempfile.mkdtemp(prefix=f"prefetchd-scale-{os.getpid()}-", dir="/dev/shm"))
    state = work / "state"
    config = {
        "source": {
            "url": f"s3://{BUCKET}/",
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "manifest": source,
        },
        "epochs": {"count": 1},
        "download": {"cache_dir": str(work / "cache"), "window": "64MiB", "concurrency": 8},
        "output": {"ram_dir": str(ram / "ram"), "ram_budget": "64MiB", "shard_size": "4MiB"},
        "status": {"state_dir": str(state)},
        "log": {"level": "warning"},
    }
    config_path = work / "prefetchd.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = (work / "daemon.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefetchd", "run", "--config", str(config_path)],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    root = psutil.Process(proc.pid)
    startup = None
    peak = [0, 0, 0]
    samples = 0
    try:
        while proc.poll() is None:
            now = time.monotonic()
            rss, pss = tree_memory(root)
            pid = downloader_pid(state)
            down = psutil.Process(pid).memory_info().rss if pid and psutil.pid_exists(pid) else 0
            peak = [max(peak[0], rss), max(peak[1], pss), max(peak[2], down)]
            samples += 1
            if startup is None and _running(state):
                startup = now - started
            if startup is not None and now - started > startup + run_s:
                break
            if now - started > 600:
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        skipped = _skipped(state)
        shutil.rmtree(ram, ignore_errors=True)
    if startup is None:
        tail = (work / "daemon.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"the daemon never reported running:\n{tail}")
    return Measurement(keys, startup, peak[0], peak[1], peak[2], samples, skipped)


def _running(state: Path) -> bool:
    try:
        status = json.loads((state / "status.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(status.get("state") == "running")


def _skipped(state: Path) -> int:
    try:
        return int(json.loads((state / "status.json").read_text()).get("errors", 0))
    except (OSError, ValueError):
        return 0


def listing_only(keys: int) -> int:
    """Time the listing steps in this process, without a daemon or a store: read the manifest
    into the share table, sort it, and draw one epoch's order."""
    import resource

    from prefetchd.config import config_from_dict
    from prefetchd.download.order import epoch_permutation
    from prefetchd.download.share import ShareTable
    from prefetchd.download.store import list_share

    work = Path(tempfile.mkdtemp(prefix="prefetchd-manifest-listing-"))
    try:
        manifest = work / "keys.txt"
        write_manifest(manifest, {}, keys)
        config = config_from_dict({"source": {"url": f"s3://{BUCKET}/", "manifest": str(manifest)}})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        table = ShareTable()
        for obj in list_share(None, config):
            table.append(obj)
        t1 = time.perf_counter()
        table.finish()
        t2 = time.perf_counter()
        epoch_permutation(len(table), seed=0, epoch=0, shuffle=True)
        t3 = time.perf_counter()
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{keys} keys: read {t1 - t0:.1f} s, sort {t2 - t1:.1f} s, epoch order {t3 - t2:.1f} s; "
        f"table {table.nbytes() / MIB:.0f} MiB, peak RSS grew {grown:.0f} MiB"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--baseline-keys", type=int, default=1_000)
    parser.add_argument("--run-seconds", type=float, default=20.0, help="after start-up")
    parser.add_argument(
        "--manifest-in", choices=("local", "s3"), default="local", help="a local file or s3://"
    )
    parser.add_argument(
        "--listing-only", action="store_true", help="time the listing steps in this process"
    )
    args = parser.parse_args(argv)
    if args.listing_only:
        return listing_only(args.keys)
    for name, value in LOCAL_CREDENTIALS.items():  # moto accepts any; never real ones here
        os.environ.setdefault(name, value)
    work = Path(tempfile.mkdtemp(prefix="prefetchd-manifest-scale-"))
    try:
        with s3server.moto_server(log_path=work / "moto.log") as endpoint:
            client = sample_data.make_client(endpoint)
            sample_data.ensure_bucket(client, BUCKET)
            dataset = sample_data.upload_dataset(
                client, BUCKET, "real/", kind="tfrecord", sizes=[64 * 1024] * REAL_OBJECTS, seed=0
            )
            real = dataset["sizes"]
            rows = [
                measure(endpoint, work / f"run-{n}", real, n, args.run_seconds, args.manifest_in)
                for n in (args.baseline_keys, args.keys)
            ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{'keys':>10} {'start-up s':>10} {'peak RSS MiB':>13} {'peak PSS MiB':>13} "
        f"{'downloader RSS MiB':>19} {'skipped 404s':>13}"
    )
    for m in rows:
        print(
            f"{m.keys:>10} {m.startup_s:>10.1f} {m.peak_rss / MIB:>13.0f} "
            f"{m.peak_pss / MIB:>13.0f} {m.peak_downloader_rss / MIB:>19.0f} {m.skipped:>13}"
        )
    print(f"load average during the runs: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    base, big = rows
    grown = (big.peak_downloader_rss - base.peak_downloader_rss) / MIB
    print(
        f"{args.manifest_in} manifest of {big.keys} keys: +{grown:.0f} MiB in the downloader, "
        f"start-up {big.startup_s:.1f} s (bar: seconds, < 300 MiB for the whole daemon)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
