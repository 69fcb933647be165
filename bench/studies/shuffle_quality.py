"""How well prefetchd mixes records, against tf.data holding the same bytes in memory.

Builds a dataset whose source order is known: ``--objects`` TFRecord objects of ``--records``
records each; object ``i`` holds only class ``i * classes // objects`` (so classes are sorted
too) and every record carries its source position ``id``. Runs the daemon on it (moto on
127.0.0.1, one epoch) and reads the shards as a trainer does, both shard by shard through
``ready_files()`` and through ``prefetchd.tf.dataset()`` (which interleaves as many shards as
the RAM budget allows). Then runs the pipeline a tf.data user writes, on the same objects::

    list_files(shuffle=True) -> interleave(TFRecordDataset, --tf-cycle) -> shuffle(buffer)

with as many bytes in memory as prefetchd: its memory is ``output.ram_budget`` (the RAM disk,
which holds every shard, read or waiting) plus 8 bytes per record of each open object (the
in-object shuffle's offsets); tf.data's is its read buffers (``--tf-cycle`` x
``--tf-read-buffer``) plus the shuffle buffer, which gets the rest. ``download.window`` is
local disk, not memory. Prints, for each order (a perfect shuffle and no shuffle mark the ends
of the scale):

- ``|rho|``: absolute Spearman rank correlation of delivered with source order (0 is best);
- ``objects/1000``: distinct source objects in each window of 1,000 delivered records (mean
  and minimum; higher is better);
- ``class TV``: total variation distance of each shard's class histogram from uniform (mean
  and maximum; 0 is best). Shards are prefetchd's files; for an interleaved or tf.data order,
  runs of the same numbers of records;
- ``same-object pairs``: the second, independent measure, of how independent nearby records
  are: the share of pairs of records ``k`` apart (``k`` = 1..``LAGS``) that come from the same
  source object, as a multiple of what a perfect shuffle gives (``(records - 1) / (n - 1)``;
  1.0 is best). Where the other statistics count what a window holds, this one sees clumps:
  runs of one object's records, and an object whose records come back close together.

Exits 0 if prefetchd (``tf.dataset``) is at least as good as tf.data on every statistic
(differences within two standard errors, for ``|rho|`` and ``class TV``, are noise).
Unless told otherwise (``--mix``, ``--cycle-length``) prefetchd runs with its defaults: the
``output.mix`` a config gets without the key, and ``prefetchd.tf.dataset``'s own
``cycle_length`` (4).

    python -m bench.studies.shuffle_quality                       # defaults: see --help
    python -m bench.studies.shuffle_quality --mix 8 --writers 1   # see what a knob does
    python -m bench.studies.shuffle_quality --cycle-length 1000000  # as many shards as fit
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.harness.daemon_run import daemon
from prefetchd import ready_files
from prefetchd.config import OutputConfig
from prefetchd.kernel.example_encode import encode_example
from prefetchd.kernel.framing import frame, read_records
from prefetchd.sizes import format_size, parse_size
from prefetchd.write.objects import MIX_BATCH_BYTES, batch_bytes
from testkit import s3server, sample_data

BUCKET = "shuffle-quality"
WINDOW = 1000
LAGS = 100  # same-object pairs: records up to this far apart
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKESHUFFLEQUALITY",
    "AWS_SECRET_ACCESS_KEY": "fake-secret-for-shuffle-quality",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class Stats:
    name: str
    rho: float
    objects_mean: float
    objects_min: int
    tv_mean: float
    tv_max: float
    pairs: float
    tv_se: float  # standard error of tv_mean


# --- statistics (pure) ------------------------------------------------------------------------


def spearman(order: Sequence[int]) -> float:
    """Rank correlation of delivered position with source position (ids are 0..n-1, distinct)."""
    ranks = {v: r for r, v in enumerate(sorted(order))}
    n = len(order)
    d2 = sum((pos - ranks[v]) ** 2 for pos, v in enumerate(order))
    return 1 - 6 * d2 / (n * (n * n - 1))


def objects_per_window(order: Sequence[int], per_object: int) -> list[int]:
    return [
        len({v // per_object for v in order[i : i + WINDOW]})
        for i in range(0, len(order) - WINDOW + 1, WINDOW)
    ]


def same_object_pairs(order: Sequence[int], per_object: int, total: int) -> float:
    """The share of pairs of records 1..``LAGS`` apart that come from one source object, over
    the share a perfect shuffle gives: ``(per_object - 1) / (total - 1)``."""
    objects = [v // per_object for v in order]
    pairs = same = 0
    for lag in range(1, LAGS + 1):
        same += sum(a == b for a, b in zip(objects[:-lag], objects[lag:], strict=True))
        pairs += len(objects) - lag
    return (same / pairs) / ((per_object - 1) / (total - 1))


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of ``values``."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def class_tv(
    shards: Sequence[Sequence[int]], class_of: dict[int, int], classes: int
) -> list[float]:
    out = []
    for shard in shards:
        if not shard:
            continue
        counts = Counter(class_of[v] for v in shard)
        out.append(0.5 * sum(abs(counts[c] / len(shard) - 1 / classes) for c in range(classes)))
    return out


def stats(name: str, shards: Sequence[Sequence[int]], args: argparse.Namespace) -> Stats:
    order = [v for shard in shards for v in shard]
    class_of = {v: (v // args.records) * args.classes // args.objects for v in order}
    windows = objects_per_window(order, args.records)
    tv = class_tv(shards, class_of, args.classes)
    return Stats(
        name,
        abs(spearman(order)),
        sum(windows) / len(windows),
        min(windows),
        sum(tv) / len(tv),
        max(tv),
        same_object_pairs(order, args.records, args.objects * args.records),
        standard_error(tv),
    )


def chunks(order: list[int], sizes: Sequence[int]) -> list[list[int]]:
    out, i = [], 0
    for size in sizes:
        out.append(order[i : i + size])
        i += size
    if i < len(order):
        out.append(order[i:])
    return out


# --- the dataset --------------------------------------------------------------------------------


def make_objects(args: argparse.Namespace) -> dict[str, bytes]:
    rng = random.Random(args.seed)
    objects = {}
    for i in range(args.objects):
        cls = i * args.classes // args.objects
        body = b"".join(
            frame(
                encode_example(
                    {
                        "id": i * args.records + j,
                        "cls": cls,
                        "payload": rng.randbytes(args.record_size),
                    }
                )
            )
            for j in range(args.records)
        )
        objects[f"data/{i:06d}.tfrecord"] = body
    return objects


def read_shard_ids(path: str) -> list[int]:
    with open(path, "rb") as f:
        return [int(sample_data.decode_example(r)["id"]) for r in read_records(f)]


# --- prefetchd ------------------------------------------------------------------------------------


def mix_of(args: argparse.Namespace) -> int:
    """The ``output.mix`` the daemon runs with."""
    return int(args.mix) if args.mix is not None else OutputConfig().mix


def memory_bytes(args: argparse.Namespace) -> int:
    """What prefetchd holds in RAM: the RAM disk budget, plus the offsets of each open object's
    records (8 bytes each; TFRecord objects are shuffled by offset, not in a buffer)."""
    mix, writers, budget = mix_of(args), int(args.writers), int(args.ram_budget)
    return budget + writers * mix * int(args.records) * 8


def run_prefetchd(
    endpoint: str, work: Path, args: argparse.Namespace, reader: str
) -> list[list[int]]:
    """The delivered order, in shards (``tf.dataset``: one list, chunked by the caller)."""
    ram = Path(tempfile.mkdtemp(prefix=f"prefetchd-shuffle-{os.getpid()}-", dir="/dev/shm"))
    config = {
        "source": {"url": f"s3://{BUCKET}/data/", "endpoint_url": endpoint, "region": "us-east-1"},
        "epochs": {"count": 1, "shuffle": True, "seed": args.seed},
        "download": {"cache_dir": str(work / "cache"), "window": args.window, "concurrency": 8},
        "output": {
            "ram_dir": str(ram / "ram"),
            "ram_budget": args.ram_budget,
            "writers": args.writers,
            "shard_size": args.shard_size,
        },
        "status": {"state_dir": str(work / "state")},
        "log": {"level": "warning"},
    }
    if args.mix is not None:
        config["output"]["mix"] = args.mix
    work = work / reader
    work.mkdir()
    config["download"]["cache_dir"] = str(work / "cache")
    config["status"]["state_dir"] = str(work / "state")
    config_path = work / "prefetchd.yaml"
    config_path.write_text(yaml.safe_dump(config))
    try:
        with daemon(config_path, work / "daemon.log"):
            if reader == "ready_files":
                shards = [read_shard_ids(path) for path in ready_files(config_path, timeout=300)]
            else:
                shards = [read_dataset_ids(config_path, args.cycle_length)]
    finally:
        shutil.rmtree(ram, ignore_errors=True)
    return shards


def read_dataset_ids(config_path: Path, cycle_length: int | None) -> list[int]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    import prefetchd.tf

    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    if cycle_length is None:
        dataset = prefetchd.tf.dataset(config_path, timeout=300)
    else:
        dataset = prefetchd.tf.dataset(config_path, timeout=300, cycle_length=cycle_length)
    return [int(tf.io.parse_single_example(r, spec)["id"].numpy()) for r in dataset]


# --- tf.data --------------------------------------------------------------------------------------


def run_tf_data(
    objects: dict[str, bytes], work: Path, args: argparse.Namespace, buffer: int
) -> list[int]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    local = work / "local"
    local.mkdir()
    for key, body in objects.items():
        (local / Path(key).name).write_bytes(body)
    files = tf.data.Dataset.list_files(str(local / "*.tfrecord"), shuffle=True, seed=args.seed)
    records = files.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=args.tf_read_buffer),
        cycle_length=args.tf_cycle,
        block_length=1,
    ).shuffle(buffer, seed=args.seed)
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    return [int(tf.io.parse_single_example(r, spec)["id"].numpy()) for r in records]


# --- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=512)
    parser.add_argument("--records", type=int, default=32, help="records per object")
    parser.add_argument("--record-size", type=int, default=1024, help="payload bytes per record")
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--window", default="16MiB", help="download.window")
    parser.add_argument("--ram-budget", type=parse_size, default="1MiB", help="output.ram_budget")
    parser.add_argument("--shard-size", default="64KiB", help="output.shard_size")
    parser.add_argument("--writers", type=int, default=2, help="output.writers")
    parser.add_argument("--mix", type=int, help="output.mix (default: the config's default)")
    parser.add_argument(
        "--cycle-length",
        type=int,
        help="prefetchd.tf.dataset(cycle_length=...) (default: its default; the RAM budget "
        "lowers it to what it holds)",
    )
    parser.add_argument("--tf-cycle", type=int, default=16, help="tf.data interleave cycle")
    parser.add_argument(
        "--tf-read-buffer", type=parse_size, default="16KiB", help="TFRecordDataset buffer_size"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name, value in LOCAL_CREDENTIALS.items():  # moto accepts any; never real ones here
        os.environ.setdefault(name, value)

    objects = make_objects(args)
    object_size = len(next(iter(objects.values())))
    record_bytes = object_size // args.records
    memory = memory_bytes(args)
    buffer = max(1, (memory - args.tf_cycle * args.tf_read_buffer) // record_bytes)
    work = Path(tempfile.mkdtemp(prefix="prefetchd-shuffle-quality-"))
    try:
        with s3server.moto_server(log_path=work / "moto.log") as endpoint:
            client = sample_data.make_client(endpoint)
            sample_data.ensure_bucket(client, BUCKET)
            for key, body in objects.items():
                client.put_object(Bucket=BUCKET, Key=key, Body=body)
            started = time.monotonic()
            shards = run_prefetchd(endpoint, work, args, "ready_files")
            elapsed = time.monotonic() - started
            (interleaved,) = run_prefetchd(endpoint, work, args, "tf.dataset")
        tf_order = run_tf_data(objects, work, args, buffer)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    total = args.objects * args.records
    delivered = sorted(v for s in shards for v in s)
    assert delivered == list(range(total)), "prefetchd lost or doubled records"
    assert sorted(interleaved) == list(range(total)), "prefetchd.tf lost or doubled records"
    assert sorted(tf_order) == list(range(total))
    sizes = [len(s) for s in shards]
    perfect = list(range(total))
    random.Random(args.seed).shuffle(perfect)
    rows = [
        stats("prefetchd tf.dataset()", chunks(interleaved, sizes), args),
        stats("prefetchd ready_files()", shards, args),
        stats("tf.data interleave+shuffle", chunks(tf_order, sizes), args),
        stats("perfect shuffle", chunks(perfect, sizes), args),
        stats("no shuffle", chunks(list(range(total)), sizes), args),
    ]
    print(
        f"{args.objects} objects x {args.records} records of {record_bytes} B, {args.classes} "
        f"classes; prefetchd: window {args.window}, ram_budget {format_size(args.ram_budget)}, "
        f"writers {args.writers}, mix {mix_of(args)}, shard_size {args.shard_size}, "
        f"tf.dataset cycle_length {args.cycle_length or 'default'} "
        f"({len(shards)} shards, {elapsed:.1f} s)"
    )
    print(
        f"equal memory: {format_size(memory)} -> tf.data cycle_length {args.tf_cycle} x "
        f"{format_size(args.tf_read_buffer)} read buffers + shuffle buffer of {buffer} records"
    )
    held = args.writers * mix_of(args) * min(object_size, batch_bytes(mix_of(args)))
    print(
        f"not counted on either side: prefetchd's open objects' batches (here up to "
        f"{format_size(held)}: the objects are smaller than a batch; with large objects "
        f"{format_size(MIX_BATCH_BYTES)} per writer at mix >= 8)"
    )
    header = (
        f"{'|rho|':>7} {'objects/1000 mean':>18} {'min':>5} {'class TV mean':>14} {'max':>6} "
        f"{'same-object pairs':>17}"
    )
    print(f"{'':28} {header}")
    for r in rows:
        print(
            f"{r.name:28} {r.rho:7.4f} {r.objects_mean:18.1f} {r.objects_min:5d} "
            f"{r.tv_mean:14.3f} {r.tv_max:6.3f} {r.pairs:17.2f}"
        )
    ours, theirs = rows[0], rows[2]
    # Both |rho| are ~0: under independence rho's standard error is 1/sqrt(n), so differences
    # within two standard errors are noise, not better or worse mixing.
    noise = 2 / math.sqrt(total)
    # The class TV of a shard-sized run of records varies from run to run (a perfect shuffle's
    # own runs are 0.13 from uniform): means within two standard errors of the difference are
    # the same mixing.
    tv_noise = 2 * math.hypot(ours.tv_se, theirs.tv_se)
    verdicts = {
        "|rho|": ours.rho <= theirs.rho + noise,
        "objects/1000": ours.objects_mean >= theirs.objects_mean,
        "class TV": ours.tv_mean <= theirs.tv_mean + tv_noise,
        "same-object pairs": ours.pairs <= theirs.pairs,
    }
    print(
        f"(|rho| differences below {noise:.4f} and class TV differences below {tv_noise:.4f}, "
        "two standard errors, are noise)"
    )
    for name, ok in verdicts.items():
        print(
            f"prefetchd tf.dataset() vs tf.data on {name}: {'at least as good' if ok else 'WORSE'}"
        )
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
