"""Daemon CPU per record with one source against three (``sources:``) over the same objects.

Uploads ``--objects`` TFRecord objects of ``--records`` records (``--record-size`` bytes each)
to moto on 127.0.0.1 under three prefixes (60 %, 30 % and 10 % of the objects), then runs the
daemon (``prefetchd run``, one epoch) and one reader (``prefetchd.records()`` in this process):
once with one ``source`` over the whole bucket prefix, once with three ``sources``, one per
prefix, weighted by their bytes (so the epoch is every object once: the same records). The
daemon's CPU is that of its whole process tree (``RUSAGE_CHILDREN`` once it exited: the
supervisor, the downloader and the writers). The two runs alternate ``--repeats`` times, so a
slow stretch of a shared machine hits both.

    python -m bench.studies.sources_cpu                     # defaults: see --help
    python -m bench.studies.sources_cpu --objects 300 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.daemon_run import run_and_read
from prefetchd.kernel.framing import frame
from testkit import s3server, sample_data

BUCKET = "sources-bench"
PARTS = (("web", 0.6), ("code", 0.3), ("books", 0.1))  # prefix, share of the objects
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKESOURCESBENCH",
    "AWS_SECRET_ACCESS_KEY": "fake-secret-for-sources-bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def upload(endpoint: str, args: argparse.Namespace) -> dict[str, int]:
    """The objects into the bucket, split between the prefixes; each prefix's bytes."""
    client = sample_data.make_client(endpoint)
    sample_data.ensure_bucket(client, BUCKET)
    rng = random.Random(1)
    sizes = dict.fromkeys((name for name, _ in PARTS), 0)
    bounds, at = [], 0.0
    for name, share in PARTS:
        at += share
        bounds.append((at * args.objects, name))
    for i in range(args.objects):
        name = next(n for bound, n in bounds if i < bound)
        body = b"".join(frame(rng.randbytes(args.record_size)) for _ in range(args.records))
        client.put_object(Bucket=BUCKET, Key=f"data/{name}/{i:06d}.tfrecord", Body=body)
        sizes[name] += len(body)
    return sizes


def run(endpoint: str, work: Path, sizes: dict[str, int] | None) -> tuple[float, int]:
    """One daemon run and its reader (three sources if ``sizes``): daemon CPU-s, records."""
    store = {"endpoint_url": endpoint, "region": "us-east-1"}
    sources: dict[str, Any] = {"source": {"url": f"s3://{BUCKET}/data/", **store}}
    if sizes is not None:
        sources = {
            "sources": [
                {
                    "url": f"s3://{BUCKET}/data/{name}/",
                    "weight": size / sum(sizes.values()),
                    "name": name,
                    **store,
                }
                for name, size in sizes.items()
            ]
        }

    def config(ram: Path) -> dict[str, Any]:
        return {
            **sources,
            "epochs": {"count": 1, "shuffle": True, "seed": 3},
            "download": {"cache_dir": str(work / "cache"), "window": "256MiB"},
            "output": {"ram_dir": str(ram), "ram_budget": "256MiB", "shard_size": "8MiB"},
            "status": {"state_dir": str(work / "state")},
            "log": {"level": "warning"},
        }

    done = run_and_read(work, config, label="sources")
    return done.cpu, done.records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--records", type=int, default=256, help="records per object")
    parser.add_argument("--record-size", type=int, default=1024, help="bytes per record")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for name, value in LOCAL_CREDENTIALS.items():  # moto accepts any; never real ones here
        os.environ.setdefault(name, value)
    work = Path(tempfile.mkdtemp(prefix="prefetchd-sources-bench-"))
    results: dict[str, list[tuple[float, int]]] = {"1 source": [], "3 sources": []}
    try:
        with s3server.moto_server(log_path=work / "moto.log") as endpoint:
            sizes = upload(endpoint, args)
            for i in range(args.repeats):
                results["1 source"].append(run(endpoint, work / f"one-{i}", None))
                results["3 sources"].append(run(endpoint, work / f"three-{i}", sizes))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{args.objects} TFRecord objects x {args.records} records of {args.record_size} B, "
        "moto on 127.0.0.1, one epoch; daemon CPU of the whole process tree"
    )
    print(f"{'job':<10} {'records':>8} {'median us/record':>17}  runs (us/record)")
    medians = {}
    for job, runs in results.items():
        per_record = [cpu / max(1, count) * 1e6 for cpu, count in runs]
        medians[job] = statistics.median(per_record)
        shown = ", ".join(f"{v:.1f}" for v in per_record)
        print(f"{job:<10} {runs[0][1]:>8} {medians[job]:>17.2f}  {shown}")
    change = medians["3 sources"] / medians["1 source"] - 1
    print(f"3 sources against 1: {change * 100:+.1f} % daemon CPU per record")
    return 0


if __name__ == "__main__":
    sys.exit(main())
