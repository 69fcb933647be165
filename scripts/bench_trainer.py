"""One benchmark trainer: a TensorFlow process that reads a dataset with one loader and reports
what it got and what it cost. Started by ``scripts/bench.py``, one process per run.

Protocol: ``bench_trainer.py SPEC_JSON``. The process imports TensorFlow and builds the
pipeline, prints ``READY``, waits for a line on stdin, then starts its clocks, reads everything
and prints one JSON line ``RESULT {...}``. Timing therefore excludes TensorFlow's import for
every loader alike, and includes everything else: listing the bucket, and for prefetchd the
daemon, which the harness starts at the same moment it says go.

Loaders (all deliver serialized records — the objects' TFRecord records, or for ``raw`` data one
record per object — batched by ``batch``):

- ``baseline``: what seed users did, done as well as a competent user does it: the key list,
  shuffled, then ``map(tf.py_function(get_object), num_parallel_calls=AUTOTUNE,
  deterministic=False)`` with one boto3 client whose pool allows 64 connections; TFRecord
  objects are split into records with a memoryview walk over the frames (no copy but the
  records themselves), then ``unbatch``.
- ``s3fs``: the same pipeline with ``s3fs.S3FileSystem.cat_file`` instead of boto3.
- ``prefetchd``: ``prefetchd.tf.dataset(config)``.
- ``floor``: TFRecord files already on tmpfs, read the way ``prefetchd.tf.dataset`` reads
  shards (interleave of ``TFRecordDataset``, cycle 4, then prefetch).

``gil_work`` > 0 turns on the GIL-contention measure: after every batch the loop runs a fixed
pure-Python computation and times it; its median (and the step time) are reported. Background
Python threads of a loader (py_function, boto3, s3fs's event loop) contend for the GIL and
stretch that work; TensorFlow's C++ reading does not.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import struct
import sys
import time
import traceback
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_HEADER = struct.Struct("<QI")


def split_tfrecords(blob: bytes) -> list[bytes]:
    """The records of a TFRecord file held in memory (frames walked, CRCs not checked)."""
    view = memoryview(blob)
    out: list[bytes] = []
    pos, end = 0, len(blob)
    while pos < end:
        length, _ = _HEADER.unpack_from(view, pos)
        start = pos + 12
        out.append(bytes(view[start : start + length]))
        pos = start + length + 4
    return out


def python_work(iterations: int) -> int:
    """Fixed pure-Python work standing in for a training step's Python side."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def build(spec: dict[str, Any], tf: Any) -> Any:
    loader = spec["loader"]
    batch = int(spec["batch"])
    if loader == "floor":
        files = sorted(
            os.path.join(spec["floor_dir"], n)
            for n in os.listdir(spec["floor_dir"])
            if n.endswith(".tfrecord")
        )
        random.Random(0).shuffle(files)
        ds = tf.data.Dataset.from_tensor_slices(files).interleave(
            lambda p: tf.data.TFRecordDataset(p, buffer_size=8 * 1024 * 1024), cycle_length=4
        )
        ds = ds.prefetch(tf.data.AUTOTUNE)
    elif loader == "prefetchd":
        import prefetchd.tf

        ds = prefetchd.tf.dataset(spec["config"], cycle_length=int(spec.get("cycle_length", 4)))
    elif loader in ("baseline", "s3fs"):
        ds = _object_pipeline(spec, tf)
    else:
        raise SystemExit(f"unknown loader {loader!r}")
    stats = ds.batch(batch).map(
        lambda b: (b, tf.size(b), tf.reduce_sum(tf.strings.length(b, unit="BYTE")))
    )
    return stats.prefetch(tf.data.AUTOTUNE)


def _object_pipeline(spec: dict[str, Any], tf: Any) -> Any:
    """Keys listed (lazily, inside the timed part), shuffled, fetched in parallel in Python."""
    tfrecord = spec["kind"] == "tfrecord"
    fetch_bytes = _boto3_fetcher(spec) if spec["loader"] == "baseline" else _s3fs_fetcher(spec)

    def fetch(key: Any) -> Any:
        blob = fetch_bytes(key.numpy().decode())
        return tf.constant(split_tfrecords(blob) if tfrecord else [blob], dtype=tf.string)

    def keys() -> Any:
        listed = spec["list_keys"]()
        random.Random(0).shuffle(listed)
        yield from listed

    ds = tf.data.Dataset.from_generator(
        keys, output_signature=tf.TensorSpec(shape=(), dtype=tf.string)
    )
    ds = ds.map(
        lambda k: tf.ensure_shape(tf.py_function(fetch, [k], Tout=tf.string), [None]),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    return ds.unbatch()


def _boto3_fetcher(spec: dict[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=spec["endpoint"],
        config=Config(
            max_pool_connections=64,
            retries={"mode": "standard"},
            s3={"addressing_style": "path"},
        ),
    )
    bucket, prefix = spec["bucket"], spec["prefix"]

    def list_keys() -> list[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    spec["list_keys"] = list_keys

    def get(key: str) -> bytes:
        body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    return get


def _s3fs_fetcher(spec: dict[str, Any]) -> Any:
    import s3fs

    fs = s3fs.S3FileSystem(
        endpoint_url=spec["endpoint"],
        key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        config_kwargs={"max_pool_connections": 64},
    )
    root = f"{spec['bucket']}/{spec['prefix']}"

    def list_keys() -> list[str]:
        return sorted(fs.find(root))

    spec["list_keys"] = list_keys

    def get(path: str) -> bytes:
        body: bytes = fs.cat_file(path)
        return body

    return get


def measure(spec: dict[str, Any], ds: Any) -> dict[str, Any]:
    import psutil

    me = psutil.Process()
    gil_work = int(spec.get("gil_work", 0))
    work_s: list[float] = []
    step_s: list[float] = []
    records = nbytes = batches = 0
    first_batch = None
    cpu0 = cpu_first = me.cpu_times()
    go_unix = time.time()
    t0 = time.perf_counter()
    last = t0
    for _, n, size in ds:
        now = time.perf_counter()
        if first_batch is None:
            first_batch = now - t0
            cpu_first = me.cpu_times()
        records += int(n)
        nbytes += int(size)
        batches += 1
        if gil_work:
            w0 = time.perf_counter()
            python_work(gil_work)
            w1 = time.perf_counter()
            work_s.append(w1 - w0)
            step_s.append(w1 - last)
            last = w1
    wall = time.perf_counter() - t0
    cpu1 = me.cpu_times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    # After the first batch: what reading costs once data flows, without the time spent
    # waiting for the first one (TensorFlow's idle threads are not free while they wait).
    cpu_steady = (cpu1.user - cpu_first.user) + (cpu1.system - cpu_first.system)
    result: dict[str, Any] = {
        "records": records,
        "bytes": nbytes,
        "batches": batches,
        "wall_s": wall,
        "first_batch_s": first_batch,
        "go_unix": go_unix,  # to line up with the daemon's log (--keep-logs)
        "trainer_cpu_s": cpu,
        "trainer_cpu_steady_s": cpu_steady,
        "trainer_rss_bytes": me.memory_info().rss,
    }
    if gil_work and work_s:
        result["work_ms_median"] = 1000 * statistics.median(work_s)
        result["step_ms_median"] = 1000 * statistics.median(step_s[1:] or step_s)
    return result


def main() -> int:
    spec = json.loads(sys.argv[1])
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    ds = build(spec, tf)
    print("READY", flush=True)
    if not sys.stdin.readline():
        return 1
    try:
        result = measure(spec, ds)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # TensorFlow's threads can hang an orderly exit after a failed pipeline
    if spec["loader"] == "prefetchd":
        from prefetchd.consume.ready import ShardReleaser

        for releaser in ShardReleaser._instances.values():
            result["shards_released_before_exit"] = releaser.released
            result["shards_pending_at_exit"] = releaser.pending()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
