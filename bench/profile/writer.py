"""The writer's own CPU per record and per GB, in-process, with no object store.

    python -m bench.profile.writer                          # every dataset, 3 repeats
    python -m bench.profile.writer lines --repeats 5
    python -m bench.profile.writer --mb 64 --repeats 3 --json out.json
    PREFETCHD_NATIVE=0 python -m bench.profile.writer       # the pure-Python kernel

Prepares seeded objects (``testkit.sample_data``) in a private ``cache/ready`` as the
downloader would publish them, runs one ``Writer`` over them in this process until every object
is consumed, and reports the CPU time (``time.process_time``: user + system of this process)
per record and per GB of input. Nothing else runs, so the numbers are the writer's share of
the daemon's CPU.

Datasets (about ``--mb`` MB of input each):

    lines      JSONL objects of 1 MiB, ~120-byte lines -> Example{key, line_number, data}
    tar        WebDataset tars of 1 MiB, samples of a small .json and a .cls member
    raw        objects of 64-200 KiB -> Example{key, data}
    tfrecord   TFRecord objects of 4 MiB holding 64 KiB records, passed through
    medium     TFRecord objects of 1-8 MiB holding 64 records each, passed through
    mixed      tar, raw and tfrecord (a third of the MB each) as three sources of one job
               (``sources:``), objects interleaved; against ``separate``, the same objects
               written by one single-source writer per source, CPU summed: what several
               sources cost the writer per record (docs/sources.md)

Run it against another checkout (e.g. ``git archive main | tar -x -C /tmp/base``) with
``PYTHONPATH=/tmp/base`` to get the baseline of a change: it only uses interfaces both sides
share (``Writer``, ``ChildContext``, ``Layout``, ``config_from_dict``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefetchd.child.context import ChildContext
from prefetchd.config import Config, OutputConfig, config_from_dict
from prefetchd.download.checksums import records_checked
from prefetchd.layout import Layout, key_hash, object_name
from prefetchd.write.writer import Writer
from testkit import sample_data

BUCKET = "bench"
KiB, MiB = 1024, 1024**2


@dataclass(frozen=True)
class WriterDataset:
    """One input the writer is profiled on: ``testkit.sample_data`` objects of a kind."""

    kind: sample_data.Kind
    min_size: int
    max_size: int
    record_size: int | None = None  # tfrecord: framed bytes per record
    tar_members: tuple[str, ...] = sample_data.TAR_MEMBERS  # tar: the files of a sample


DATASETS: dict[str, WriterDataset] = {
    "lines": WriterDataset("lines", MiB, MiB),
    # Small samples only (no image blob): the per-record cost is what this one measures.
    "tar": WriterDataset("tar", MiB, MiB, tar_members=("json", "cls")),
    "raw": WriterDataset("raw", 64 * KiB, 200 * KiB),
    "tfrecord": WriterDataset("tfrecord", 4 * MiB, 4 * MiB, record_size=64 * KiB),
    # the bench's medium: 1-8 MiB objects of 64 records each (16-128 KiB)
    "medium": WriterDataset("tfrecord", MiB, 8 * MiB),
}


# --- seeded objects (pure) ---------------------------------------------------------------------


def up_to(
    objects: Iterable[tuple[str, bytes, list[int]]], total: int
) -> Iterator[tuple[str, bytes]]:
    """``(key, body)`` of ``objects`` until at least ``total`` bytes were yielded."""
    made = 0
    for key, body, _ in objects:
        if made >= total:
            return
        yield key, body
        made += len(body)


def make_objects(dataset: str, total_mb: float, seed: int) -> list[tuple[str, bytes]]:
    """``(key, body)`` pairs of about ``total_mb`` MB in all (the last object crosses it);
    ``mixed``: a third of it from each of ``MIXED``, interleaved by bytes."""
    if dataset in ("mixed", "separate"):
        parts = [make_objects(d, total_mb / len(MIXED), seed) for d in MIXED]
        return interleave(parts)
    spec = DATASETS[dataset]
    total = int(total_mb * 1e6)
    count = total // spec.min_size + 1  # enough sizes: generation is lazy, ``up_to`` stops it
    sizes = sample_data.object_sizes(count, spec.min_size, spec.max_size, seed)
    objects = sample_data.generate(
        f"{dataset}/",
        kind=spec.kind,
        sizes=sizes,
        seed=seed,
        record_size=spec.record_size,
        tar_members=spec.tar_members,
    )
    return list(up_to(objects, total))


def interleave(parts: list[list[tuple[str, bytes]]]) -> list[tuple[str, bytes]]:
    """The objects of every part, each part's in order, merged by the middle of each object in
    its part's bytes (as ``download/mixture.py`` merges sources)."""
    keyed = []
    for part in parts:
        total, done = sum(len(b) for _, b in part) or 1, 0
        for key, body in part:
            keyed.append(((done + len(body) / 2) / total, key, body))
            done += len(body)
    return [(key, body) for _, key, body in sorted(keyed)]


# --- one run -----------------------------------------------------------------------------------


class ProfileContext(ChildContext):
    """A writer's context that asks it to stop once ``objects`` objects are consumed."""

    def __init__(self, config: Config, objects: int) -> None:
        super().__init__("writer-0", config)
        self.objects = objects

    def should_stop(self) -> bool:
        return counter(self, "objects_consumed") >= self.objects


def counter(ctx: ChildContext, name: str) -> int:
    """A counter the writer published (its counters are typed ``object``), 0 until it has."""
    value = ctx.counters.get(name, 0)
    return int(value) if isinstance(value, int | float) else 0


@dataclass
class Result:
    """One run of the writer over one dataset."""

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


MIXED = ("tar", "raw", "tfrecord")  # the sources of ``mixed``, by index


def writer_config(root: Path, ram: Path, fmt: str, mix: int) -> Config:
    """One writer, a shard size and RAM budget that never make it wait. ``fmt`` "mixed":
    the three sources of ``MIXED``, one weight each."""
    sources: dict[str, Any] = {"source": {"url": f"s3://{BUCKET}/", "format": fmt}}
    if fmt == "mixed":
        sources = {
            "sources": [
                {"url": f"s3://{BUCKET}/{d}/", "format": DATASETS[d].kind, "weight": 1}
                for d in MIXED
            ]
        }
    return config_from_dict(
        {
            **sources,
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


def publish_objects(layout: Layout, objects: list[tuple[str, bytes]], format: str) -> None:
    """Put the objects where the downloader publishes them, with the meta it writes (for
    uncompressed tfrecord input: every frame's CRCs checked, ``records_ok``; with several
    sources, the source's index), and mark the epoch downloaded."""
    for seq, (key, body) in enumerate(objects):
        name = object_name(0, seq, key_hash(BUCKET, key))
        meta: dict[str, object] = {"key": key, "size": len(body)}
        fmt = format
        if format == "mixed":
            source = MIXED.index(key.split("/", 1)[0])
            meta["source"], fmt = source, DATASETS[MIXED[source]].kind
        if records_checked(fmt, key):
            meta["records_ok"] = True  # the sample objects are valid: the check passes
        (layout.cache_meta / f"{name}.json").write_text(json.dumps(meta))
        (layout.cache_ready / name).write_bytes(body)
    layout.downloaded_marker(0).write_text("")


def run_once(dataset: str, objects: list[tuple[str, bytes]], mix: int) -> Result:
    """The writer over ``objects`` once, in private directories removed afterwards;
    ``separate``: one writer per source of ``MIXED`` over its objects, figures summed."""
    if dataset == "separate":
        runs = [run_once(d, [o for o in objects if o[0].startswith(f"{d}/")], mix) for d in MIXED]
        return Result(
            dataset,
            *(
                sum(getattr(r, f) for r in runs)
                for f in Result.__dataclass_fields__
                if f != "dataset"
            ),
        )
    root = Path(tempfile.mkdtemp(prefix="bench-writer-"))
    ram = Path(tempfile.mkdtemp(prefix="bench-writer-", dir="/dev/shm"))
    try:
        kind = "mixed" if dataset == "mixed" else DATASETS[dataset].kind
        config = writer_config(root, ram / "out", kind, mix)
        layout = Layout.of(config)
        layout.create()
        publish_objects(layout, objects, kind)
        ctx = ProfileContext(config, len(objects))
        writer = Writer(ctx, 0)
        wall, cpu = time.perf_counter(), time.process_time()
        writer.run()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return Result(
            dataset,
            len(objects),
            counter(ctx, "records_written"),
            sum(len(b) for _, b in objects),
            counter(ctx, "bytes_written"),
            cpu,
            wall,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)


# --- the report (pure) -------------------------------------------------------------------------


def summary(results: list[Result]) -> dict[str, Any]:
    """The median run (by CPU) of one dataset, with every run's CPU."""
    best = sorted(results, key=lambda r: r.cpu_s)[len(results) // 2]
    return {
        **asdict(best),
        "us_per_record": round(best.us_per_record, 3),
        "cpu_s_per_gb": round(best.cpu_s_per_gb, 3),
        "cpu_s_runs": [round(r.cpu_s, 4) for r in results],
    }


HEAD = "{:<9} {:>9} {:>8} {:>7} {:>10} {:>9}".format(
    "dataset", "records", "MB in", "cpu s", "us/record", "cpu-s/GB"
)


def row_line(row: dict[str, Any]) -> str:
    """One line of the table under ``HEAD``."""
    return (
        f"{row['dataset']:<9} {row['records']:>9} {row['input_bytes'] / 1e6:>8.1f} "
        f"{row['cpu_s']:>7.3f} {row['us_per_record']:>10.2f} {row['cpu_s_per_gb']:>9.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "datasets", nargs="*", metavar="DATASET", help=", ".join([*DATASETS, "mixed", "separate"])
    )
    parser.add_argument("--mb", type=float, default=32.0, help="MB of input per dataset")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--mix", type=int, default=OutputConfig().mix, help="output.mix (default: its default)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    unknown = set(args.datasets) - set(DATASETS) - {"mixed", "separate"}
    if unknown:
        choices = ", ".join([*DATASETS, "mixed", "separate"])
        parser.error(f"unknown dataset(s) {sorted(unknown)}; choose from {choices}")
    rows = []
    print(HEAD)
    for dataset in args.datasets or DATASETS:
        objects = make_objects(dataset, args.mb, args.seed)
        row = summary([run_once(dataset, objects, args.mix) for _ in range(args.repeats)])
        rows.append(row)
        print(row_line(row), flush=True)
    if args.json:
        argv_used = sys.argv[1:] if argv is None else argv
        args.json.write_text(json.dumps({"argv": argv_used, "results": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
