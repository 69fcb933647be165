"""One benchmark trainer: a TensorFlow process that reads a dataset with one reader and reports
what it got and what it cost. Started by the harness (``bench.harness.runner``), one process per
run.

Protocol: ``python -m bench.drivers.trainer SPEC_JSON``. The process imports TensorFlow and builds
the pipeline (``bench.drivers.readers``), prints ``READY``, waits for a line on stdin, then starts
its clocks, reads everything and prints one JSON line ``RESULT {...}``. Timing therefore excludes
TensorFlow's import for every loader alike, and includes everything else: listing the bucket,
and for prefetchd the daemon, which the harness starts at the same moment it says go.

``gil_work`` > 0 turns on the GIL-contention measure: after every batch the loop runs a fixed
pure-Python computation and times it; its median (and the step time) are reported. Background
Python threads of a loader (py_function, boto3, s3fs's event loop) contend for the GIL and
stretch that work; TensorFlow's C++ reading does not.

``thread_cpu`` true adds ``threads_cpu_s``: the CPU of each of the process's threads over the
read (``/proc``), Python threads by name, TensorFlow's native ones summed as ``native``.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from bench.drivers.readers import READERS

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def python_work(iterations: int) -> int:
    """Fixed pure-Python work standing in for a training step's Python side."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def build(spec: dict[str, Any], tf: Any) -> Any:
    """The reader's records, batched by ``batch``, with each batch's record and byte counts."""
    reader = READERS.get(spec["loader"])
    if reader is None:
        raise SystemExit(f"unknown loader {spec['loader']!r}")
    stats = (
        reader(spec, tf)
        .batch(int(spec["batch"]))
        .map(lambda b: (b, tf.size(b), tf.reduce_sum(tf.strings.length(b, unit="BYTE"))))
    )
    return stats.prefetch(tf.data.AUTOTUNE)


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads (``/proc``): Python threads by name, the
    rest (TensorFlow's) summed as ``native``."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")")[1].split()
            name = names.get(int(tid), "native")
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def thread_cpu_since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each thread group's CPU between two ``thread_cpu()`` readings (pure), groups that used
    none left out."""
    spent = {name: cpu - before.get(name, 0.0) for name, cpu in after.items()}
    return {name: round(cpu, 3) for name, cpu in spent.items() if cpu > 0}


def measure(spec: dict[str, Any], ds: Any) -> dict[str, Any]:
    import psutil

    me = psutil.Process()
    gil_work = int(spec.get("gil_work", 0))
    work_s: list[float] = []
    step_s: list[float] = []
    records = nbytes = batches = 0
    first_batch = None
    threads0 = thread_cpu() if spec.get("thread_cpu") else {}
    cpu0 = cpu_first = me.cpu_times()
    go_unix = time.time()
    t0 = time.perf_counter()
    last = t0
    reading = iter(ds)  # kept until its threads' CPU is read below
    for _, n, size in reading:
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
    if spec.get("thread_cpu"):
        result["threads_cpu_s"] = thread_cpu_since(threads0, thread_cpu())
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
        from prefetchd.consume.releaser import ShardReleaser

        for releaser in ShardReleaser._instances.values():
            result["shards_released_before_exit"] = releaser.released
            result["shards_pending_at_exit"] = releaser.pending()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
