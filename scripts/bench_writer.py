"""The writer's own CPU per record and per GB, in-process, with no object store.

Prepares seeded objects in a private ``cache/ready`` (as the downloader would publish them),
runs one ``Writer`` over them in this process until every object is consumed, and reports the
CPU time (``time.process_time``: user + system of this process) per record and per GB of
input. Nothing else runs, so the numbers are the writer's share of the daemon's CPU::

    PYTHONPATH=$PWD python scripts/bench_writer.py                  # every dataset, 3 repeats
    PYTHONPATH=$PWD python scripts/bench_writer.py lines --repeats 5
    PYTHONPATH=$PWD python scripts/bench_writer.py --json out.json

Datasets (about ``--mb`` MB of input each):

    lines      JSONL objects of 1 MiB, ~120-byte lines -> Example{key, line_number, data}
    tar        WebDataset tars of 1 MiB, samples of a ~120-byte .json and a .cls member
    raw        objects of 64-200 KiB -> Example{key, data}
    tfrecord   TFRecord objects of 4 MiB holding 64 KiB records, passed through

Run it against another checkout (e.g. ``git archive main | tar -x -C /tmp/base``) with
``PYTHONPATH=/tmp/base`` to get the baseline of a change: the script only uses interfaces
both sides share (``Writer``, ``ChildContext``, ``Layout``, ``config_from_dict``).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefetchd.config import Config, config_from_dict
from prefetchd.layout import Layout, key_hash, object_name
from prefetchd.supervise.child import ChildContext
from prefetchd.tfrecord import frame
from prefetchd.write.writer import Writer

BUCKET = "bench"
MiB = 1024 * 1024
DATASETS = ("lines", "tar", "raw", "tfrecord")


# --- seeded objects ----------------------------------------------------------------------------


def jsonl_object(rng: random.Random, size: int) -> bytes:
    """JSONL lines of about 120 bytes up to ``size`` bytes."""
    lines, total, n = [], 0, 0
    while total < size:
        text = "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(rng.randint(70, 95))
        )
        line = json.dumps({"id": n, "label": rng.randrange(1000), "text": text}).encode() + b"\n"
        lines.append(line)
        total += len(line)
        n += 1
    return b"".join(lines)


def tar_object(rng: random.Random, size: int) -> bytes:
    """A WebDataset tar of samples ``<n>.json`` (~120 bytes) + ``<n>.cls`` up to ``size``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        n = 0
        while buf.tell() < size:
            for ext, data in (("json", jsonl_object(rng, 100)), ("cls", b"%d" % (n % 1000))):
                info = tarfile.TarInfo(f"s/{n:07d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            n += 1
    return buf.getvalue()


def raw_object(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(rng.randint(64 * 1024, 200 * 1024))


def tfrecord_object(rng: random.Random, size: int) -> bytes:
    return b"".join(frame(rng.randbytes(64 * 1024)) for _ in range(size // (64 * 1024 + 16)))


MAKERS: dict[str, tuple[Callable[[random.Random, int], bytes], int, str]] = {
    # name: (maker, object size, key suffix)
    "lines": (jsonl_object, MiB, ".jsonl"),
    "tar": (tar_object, MiB, ".tar"),
    "raw": (raw_object, 0, ".bin"),
    "tfrecord": (tfrecord_object, 4 * MiB, ".tfrecord"),
}


def make_objects(dataset: str, total_mb: float, seed: int) -> Iterator[tuple[str, bytes]]:
    """``(key, body)`` pairs of about ``total_mb`` MB in all."""
    maker, size, suffix = MAKERS[dataset]
    rng = random.Random(seed)
    made, index = 0, 0
    while made < total_mb * 1e6:
        body = maker(rng, size)
        yield f"{dataset}/{index:06d}{suffix}", body
        made += len(body)
        index += 1


# --- one run -----------------------------------------------------------------------------------


class BenchContext(ChildContext):
    """A writer's context that asks it to stop once ``objects`` objects are consumed."""

    def __init__(self, config: Config, objects: int) -> None:
        super().__init__("writer-0", config)
        self.objects = objects

    def should_stop(self) -> bool:
        return bool(self.counters.get("objects_consumed", 0) >= self.objects)


@dataclass
class Result:
    dataset: str
    objects: int
    records: int
    input_bytes: int
    output_bytes: int
    cpu_s: float
    wall_s: float

    @property
    def us_per_record(self) -> float:
        return self.cpu_s / max(1, self.records) * 1e6

    @property
    def cpu_s_per_gb(self) -> float:
        return self.cpu_s / max(1, self.input_bytes) * 1e9


def bench_config(root: Path, ram: Path, fmt: str, mix: int) -> Config:
    return config_from_dict(
        {
            "source": {"url": f"s3://{BUCKET}/", "format": fmt},
            "epochs": {"count": 1, "seed": 0},
            "download": {"cache_dir": str(root / "cache")},
            "output": {
                "ram_dir": str(ram),
                "ram_budget": "2GiB",
                "shard_size": "128MiB",
                "writers": 1,
                "mix": mix,
            },
            "status": {"state_dir": str(root / "state")},
        }
    )


def publish_objects(layout: Layout, objects: list[tuple[str, bytes]]) -> None:
    """Put the objects where the downloader publishes them, and mark the epoch downloaded."""
    for seq, (key, body) in enumerate(objects):
        name = object_name(0, seq, key_hash(BUCKET, key))
        (layout.cache_meta / f"{name}.json").write_text(json.dumps({"key": key}))
        (layout.cache_ready / name).write_bytes(body)
    layout.downloaded_marker(0).write_text("")


def run_once(dataset: str, objects: list[tuple[str, bytes]], mix: int) -> Result:
    root = Path(tempfile.mkdtemp(prefix="bench-writer-"))
    ram = Path(tempfile.mkdtemp(prefix="bench-writer-", dir="/dev/shm"))
    try:
        config = bench_config(root, ram / "out", dataset, mix)
        layout = Layout.of(config)
        layout.create()
        publish_objects(layout, objects)
        ctx = BenchContext(config, len(objects))
        writer = Writer(ctx, 0)
        wall, cpu = time.perf_counter(), time.process_time()
        writer.run()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return Result(
            dataset,
            len(objects),
            int(ctx.counters["records_written"]),
            sum(len(b) for _, b in objects),
            int(ctx.counters["bytes_written"]),
            cpu,
            wall,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)


def summary(results: list[Result]) -> dict[str, Any]:
    """The median run (by CPU) of one dataset, with every run's CPU."""
    best = sorted(results, key=lambda r: r.cpu_s)[len(results) // 2]
    return {
        **asdict(best),
        "us_per_record": round(best.us_per_record, 3),
        "cpu_s_per_gb": round(best.cpu_s_per_gb, 3),
        "cpu_s_runs": [round(r.cpu_s, 4) for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("datasets", nargs="*", metavar="DATASET", help=", ".join(DATASETS))
    parser.add_argument("--mb", type=float, default=32.0, help="MB of input per dataset")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mix", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    unknown = set(args.datasets) - set(DATASETS)
    if unknown:
        parser.error(f"unknown dataset(s) {sorted(unknown)}; choose from {', '.join(DATASETS)}")
    rows = []
    head = ("dataset", "records", "MB in", "cpu s", "us/record", "cpu-s/GB")
    print("{:<9} {:>9} {:>8} {:>7} {:>10} {:>9}".format(*head))
    for dataset in args.datasets or DATASETS:
        objects = list(make_objects(dataset, args.mb, args.seed))
        row = summary([run_once(dataset, objects, args.mix) for _ in range(args.repeats)])
        rows.append(row)
        print(
            f"{dataset:<9} {row['records']:>9} {row['input_bytes'] / 1e6:>8.1f} "
            f"{row['cpu_s']:>7.3f} {row['us_per_record']:>10.2f} {row['cpu_s_per_gb']:>9.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
