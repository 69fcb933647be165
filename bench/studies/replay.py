"""``epochs.order: replayable`` beside ``fast``: throughput, and whether two runs agree.

Uploads ``--objects`` TFRecord objects of ``--records`` records (``--record-size`` bytes each)
to moto on 127.0.0.1, then runs the daemon (``prefetchd run``, one epoch) and one reader
(``prefetchd.records()`` in this process) ``--repeats`` times per order, each run in fresh
directories. Reports per run the wall time from start to the last record, MB/s and records/s of
payload, and whether the runs of one order yielded the same records in the same order (they
must for ``replayable``; for ``fast`` they rarely do). Orders run alternately, so a slow stretch
of a shared machine hits both. With ``--sources N`` the objects are split round-robin over N
prefixes, read as N sources (``sources:``) of weights N, N-1, ..., 1 (``on_exhausted: repeat``,
so a lighter source is read more than once per epoch, or less than whole, as its weight asks).

    python -m bench.studies.replay                      # defaults: see --help
    python -m bench.studies.replay --objects 400 --repeats 3
    python -m bench.studies.replay --objects 600 --repeats 3 --sources 3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.daemon_run import run_and_read
from prefetchd.kernel.framing import frame
from testkit import s3server, sample_data

BUCKET = "replay-bench"
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKEREPLAYBENCH",
    "AWS_SECRET_ACCESS_KEY": "fake-secret-for-replay-bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def upload(endpoint: str, args: argparse.Namespace) -> int:
    """The objects into the bucket; the payload bytes."""
    client = sample_data.make_client(endpoint)
    sample_data.ensure_bucket(client, BUCKET)
    rng = random.Random(1)
    total = 0
    for i in range(args.objects):
        records = [rng.randbytes(args.record_size) for _ in range(args.records)]
        total += sum(map(len, records))
        body = b"".join(frame(r) for r in records)
        client.put_object(Bucket=BUCKET, Key=f"{prefix(i, args)}{i:06d}.tfrecord", Body=body)
    return total


def prefix(i: int, args: argparse.Namespace) -> str:
    """Where object ``i`` goes: ``data/``, or ``data/s<k>/`` of source k with ``--sources``."""
    return f"data/s{i % args.sources}/" if args.sources > 1 else "data/"


def sources(endpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    """The config's ``source`` (one) or ``sources`` (``--sources``, weights N..1)."""
    store = {"endpoint_url": endpoint, "region": "us-east-1"}
    if args.sources <= 1:
        return {"source": {"url": f"s3://{BUCKET}/data/", **store}}
    return {
        "sources": [
            {"url": f"s3://{BUCKET}/data/s{k}/", "weight": args.sources - k, **store}
            for k in range(args.sources)
        ]
    }


def run(endpoint: str, work: Path, order: str, args: argparse.Namespace) -> tuple[float, str, int]:
    """One daemon run and its reader: seconds, a digest of the record sequence, records."""
    epochs: dict[str, Any] = {"count": 1, "shuffle": True, "seed": 3, "order": order}

    def config(ram: Path) -> dict[str, Any]:
        return {
            **sources(endpoint, args),
            "epochs": epochs,
            "download": {"cache_dir": str(work / "cache"), "window": args.window},
            "output": {
                "ram_dir": str(ram),
                "ram_budget": args.ram_budget,
                "shard_size": args.shard_size,
            },
            "status": {"state_dir": str(work / "state")},
            "log": {"level": "warning"},
        }

    digest = hashlib.sha256()

    def each(record: bytes) -> None:
        digest.update(len(record).to_bytes(8, "little"))
        digest.update(record)

    done = run_and_read(work, config, each, label="replay")
    return done.seconds, digest.hexdigest()[:16], done.records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--records", type=int, default=64, help="records per object")
    parser.add_argument("--record-size", type=int, default=4096, help="bytes per record")
    parser.add_argument("--window", default="256MiB", help="download.window")
    parser.add_argument("--ram-budget", default="256MiB", help="output.ram_budget")
    parser.add_argument("--shard-size", default="8MiB", help="output.shard_size")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sources", type=int, default=1, help="objects split over N sources")
    args = parser.parse_args(argv)
    for name, value in LOCAL_CREDENTIALS.items():  # moto accepts any; never real ones here
        os.environ.setdefault(name, value)
    work = Path(tempfile.mkdtemp(prefix="prefetchd-replay-bench-"))
    results: dict[str, list[tuple[float, str, int]]] = {"fast": [], "replayable": []}
    try:
        with s3server.moto_server(log_path=work / "moto.log") as endpoint:
            payload = upload(endpoint, args)
            for i in range(args.repeats):
                for order in results:
                    results[order].append(run(endpoint, work / f"{order}-{i}", order, args))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    in_sources = f" in {args.sources} sources" if args.sources > 1 else ""
    print(
        f"{args.objects} TFRecord objects{in_sources} x {args.records} records of "
        f"{args.record_size} B "
        f"({payload / 1e6:.1f} MB), moto on 127.0.0.1; window {args.window}, ram_budget "
        f"{args.ram_budget}, shard_size {args.shard_size}; other keys at their defaults"
    )
    print(f"{'order':<11} {'run':>3} {'seconds':>8} {'MB/s':>7} {'records/s':>10} {'digest':>17}")
    ok = True
    for order, runs in results.items():
        for i, (seconds, digest, count) in enumerate(runs):
            rate = count * args.record_size / 1e6 / seconds  # the payload delivered
            print(
                f"{order:<11} {i:>3} {seconds:8.2f} {rate:7.1f} "
                f"{count / seconds:10.0f} {digest:>17}"
            )
        same = len({d for _, d, _ in runs}) == 1
        print(f"{order}: runs {'yield the same' if same else 'differ in'} record sequence")
        ok = ok and (same or order == "fast")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
