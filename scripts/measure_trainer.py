"""What the trainer pays to read prefetchd's shards, against trainers that read finished files.

    PYTHONPATH=$PWD python scripts/measure_trainer.py               # SeaweedFS, 1 GiB, 3 rounds
    PYTHONPATH=$PWD python scripts/measure_trainer.py --store moto --gib 0.25 --repeats 1

One command, one run, three trainers measured interleaved (floor, lean, prefetchd; repeated
``--repeats`` times), each a fresh process that reports its own CPU per GiB:

    floor      the TFRecord files already on tmpfs, one ``TFRecordDataset`` over all of them
    lean       the same files, ``interleave(TFRecordDataset, cycle_length=2)``
    prefetchd  the same records as objects in a local S3 server (SeaweedFS from
               /work/bench-tools/bin/weed, or moto), the real daemon started next to the
               trainer, read through ``prefetchd.tf.dataset(config)``

Records are 64 KiB of random bytes; every trainer batches 32 records, computes each batch's
size in the graph, prefetches batches (AUTOTUNE) and pulls them in a Python loop. A
trainer's CPU is its own ``getrusage`` user+system time, clock started once TensorFlow is
imported and the pipeline built (the daemon's CPU is not the trainer's: the daemon runs in
its own processes and is started at the same moment the clock starts). Prints medians and the
ratios prefetchd/lean and prefetchd/floor; ``--json`` writes every run.

Protocol of a trainer process: ``measure_trainer.py --trainer SPEC_JSON`` imports TensorFlow,
builds the pipeline, prints ``READY``, waits for a line on stdin, reads everything and prints
``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
BUCKET = "measure"
PREFIX = "data/"
KiB, MiB, GiB = 1024, 1024**2, 1024**3
RECORD_SIZE = 64 * KiB
FILE_SIZE = 32 * MiB  # floor files and S3 objects alike; prefetchd's shards are 32 MiB too
BATCH = 32
LOADERS = ("floor", "lean", "prefetchd")
START_TIMEOUT = 60.0
RUN_TIMEOUT = 600.0
WEED = Path("/work/bench-tools/bin/weed")
PY_SPY = WEED.with_name("py-spy")
ROOT = Path(__file__).resolve().parent.parent


# --- data ------------------------------------------------------------------------------------


def write_files(directory: Path, total: int, seed: int) -> list[Path]:
    """TFRecord files of ``RECORD_SIZE`` random records, ``FILE_SIZE`` each, ``total`` bytes
    of payload in all (rounded up to whole records)."""
    from prefetchd.tfrecord import frame

    rng = _rng(seed)
    per_file = FILE_SIZE // RECORD_SIZE
    records = -(-total // RECORD_SIZE)
    paths = []
    for index in range(-(-records // per_file)):
        path = directory / f"part-{index:05d}.tfrecord"
        count = min(per_file, records - index * per_file)
        path.write_bytes(b"".join(frame(rng.randbytes(RECORD_SIZE)) for _ in range(count)))
        paths.append(path)
    return paths


def _rng(seed: int) -> Any:
    import random

    return random.Random(seed)


# --- the object store ------------------------------------------------------------------------


@dataclass
class Store:
    """An S3 server on 127.0.0.1 that we started; ``stop()`` ends it by its PID."""

    endpoint: str
    proc: subprocess.Popen[bytes]
    workdir: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def weed_command(weed: Path, data_dir: Path, base: int) -> list[str]:
    """``weed server`` with S3 on ``base`` and every other listener (gRPC included) explicit
    on ``base+1..base+8``, all on 127.0.0.1, telemetry off."""
    ports = {
        "master.port": base + 1,
        "master.port.grpc": base + 2,
        "volume.port": base + 3,
        "volume.port.grpc": base + 4,
        "filer.port": base + 5,
        "filer.port.grpc": base + 6,
        "s3.port.grpc": base + 7,
        "metricsPort": base + 8,
    }
    return [
        str(weed),
        "server",
        f"-dir={data_dir}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=1024",
        "-volume.max=0",
        "-volume.preStopSeconds=0",
        "-s3",
        f"-s3.port={base}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]


def start_store(kind: str, base: int) -> Store:
    workdir = Path(tempfile.mkdtemp(prefix=f"measure-{kind}-", dir="/tmp"))
    if kind == "seaweedfs":
        (workdir / "data").mkdir()
        cmd = weed_command(WEED, workdir / "data", base)
    else:
        cmd = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(base)]
    with open(workdir / "server.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    store = Store(f"http://{HOST}:{base}", proc, workdir)
    try:
        _wait_for_bucket(store)
    except BaseException:
        store.stop()
        raise
    return store


def _client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(retries={"mode": "standard", "max_attempts": 1}),
    )


def _wait_for_bucket(store: Store) -> None:
    """SeaweedFS answers HTTP before its filer and volume work: retry creating the bucket."""
    client = _client(store.endpoint)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if store.proc.poll() is not None:
            raise RuntimeError(f"S3 server exited; see {store.workdir / 'server.log'}")
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=BUCKET)
            client.put_object(Bucket=BUCKET, Key="probe", Body=b"x")
            client.delete_object(Bucket=BUCKET, Key="probe")
            return
        except Exception as exc:  # refused connections, 5xx while the filer starts: all retried
            _give_up_after(deadline, exc)


def _give_up_after(deadline: float, exc: BaseException) -> None:
    if time.monotonic() > deadline:
        raise RuntimeError(f"S3 server not ready after {START_TIMEOUT:.0f} s: {exc}") from exc
    time.sleep(0.5)


def upload(endpoint: str, files: list[Path]) -> None:
    client = _client(endpoint)
    for path in files:
        client.put_object(Bucket=BUCKET, Key=PREFIX + path.name, Body=path.read_bytes())


# --- one trainer run -------------------------------------------------------------------------


def daemon_config(endpoint: str, run_dir: Path, ram_dir: Path) -> Path:
    """The bench's daemon settings: 32 MiB shards, 2 writers, 1 GiB RAM budget."""
    import yaml

    cfg = {
        "source": {
            "url": f"s3://{BUCKET}/{PREFIX}",
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "format": "tfrecord",
        },
        "epochs": {"count": 1, "shuffle": True, "seed": 0},
        "download": {"cache_dir": str(ram_dir / "cache"), "window": "2GiB", "concurrency": 32},
        "output": {
            "ram_dir": str(ram_dir / "out"),
            "ram_budget": "1GiB",
            "writers": 2,
            "shard_size": "32MiB",
            "mix": 8,
        },
        "status": {"state_dir": str(run_dir / "state")},
        "log": {"level": "warning"},
    }
    path = run_dir / "prefetchd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class Runner:
    """Starts trainer processes (and for ``prefetchd`` the daemon) and collects results."""

    floor_dir: Path
    endpoint: str
    work: Path
    ram: Path
    env: dict[str, str]
    trainer_args: dict[str, Any]
    py_spy: str | None = None

    def run(self, loader: str) -> dict[str, Any]:
        run_dir = Path(tempfile.mkdtemp(prefix=f"{loader}-", dir=self.work))
        ram_dir = Path(tempfile.mkdtemp(prefix=f"{loader}-", dir=self.ram))
        spec: dict[str, Any] = {"loader": loader, "floor_dir": str(self.floor_dir)}
        spec.update(self.trainer_args)
        if loader == "prefetchd":
            spec["config"] = str(daemon_config(self.endpoint, run_dir, ram_dir))
        try:
            return self._run(spec, run_dir)
        finally:
            shutil.rmtree(ram_dir, ignore_errors=True)

    def _run(self, spec: dict[str, Any], run_dir: Path) -> dict[str, Any]:
        with open(run_dir / "trainer.log", "wb") as err:
            trainer = self._popen([__file__, "--trainer", json.dumps(spec)], err, pipe=True)
        daemon = spy = None
        try:
            assert trainer.stdin is not None and trainer.stdout is not None
            if trainer.stdout.readline().strip() != b"READY":
                raise RuntimeError(f"trainer did not start:\n{_tail(run_dir / 'trainer.log')}")
            if "config" in spec:
                with open(run_dir / "daemon.log", "wb") as err:
                    daemon = self._popen(
                        ["-m", "prefetchd", "run", "--config", spec["config"]], err
                    )
            spy = self._py_spy(trainer.pid, spec["loader"])
            trainer.stdin.write(b"go\n")
            trainer.stdin.flush()
            result = _read_result(trainer, run_dir)
            if spy is not None:
                spy.wait(30)
            if daemon is not None and daemon.wait(60) != 0:
                raise RuntimeError(
                    f"daemon exited {daemon.returncode}:\n{_tail(run_dir / 'daemon.log')}"
                )
            return result
        finally:
            for proc in (trainer, daemon, spy):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _py_spy(self, pid: int, loader: str) -> subprocess.Popen[bytes] | None:
        """``py-spy record --native`` on the trainer, collapsed stacks per thread."""
        if not self.py_spy:
            return None
        out = f"{self.py_spy}-{loader}-{time.strftime('%H%M%S')}.txt"
        cmd = [str(PY_SPY), "record", "-p", str(pid), "-t", "-f", "raw", "-o", out]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _popen(self, args: list[str], err: Any, *, pipe: bool = False) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe else subprocess.DEVNULL,
            stderr=err,
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
        )


def _read_result(trainer: subprocess.Popen[bytes], run_dir: Path) -> dict[str, Any]:
    assert trainer.stdout is not None
    deadline = time.monotonic() + RUN_TIMEOUT
    for line in trainer.stdout:
        if line.startswith(b"RESULT "):
            result: dict[str, Any] = json.loads(line[len(b"RESULT ") :])
            trainer.wait(30)
            return result
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"trainer ended without a result:\n{_tail(run_dir / 'trainer.log')}")


def _tail(log: Path) -> str:
    """The end of a log (the run's directory is removed when the command ends)."""
    return log.read_text(errors="replace")[-3000:]


# --- the trainer process ---------------------------------------------------------------------


def build(spec: dict[str, Any], tf: Any) -> Any:
    """The loader's dataset of serialized records, batched by ``BATCH``, prefetched."""
    loader = spec["loader"]
    if loader == "prefetchd":
        import prefetchd.tf

        ds = prefetchd.tf.dataset(spec["config"], **spec.get("dataset_kwargs", {}))
    else:
        folder = spec["floor_dir"]
        files = sorted(os.path.join(folder, n) for n in os.listdir(folder))
        if loader == "floor":
            ds = tf.data.TFRecordDataset(files)
        else:
            ds = tf.data.Dataset.from_tensor_slices(files).interleave(
                tf.data.TFRecordDataset, cycle_length=2
            )
    # As in the bench: the loop gets each batch and its sizes, computed in the graph.
    sized = ds.batch(BATCH).map(
        lambda b: (b, tf.size(b), tf.reduce_sum(tf.strings.length(b, unit="BYTE")))
    )
    return sized.prefetch(tf.data.AUTOTUNE)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's live threads (``/proc``): Python threads by name, the
    rest (TensorFlow's) summed as ``native``."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")")[1].split()
            name = names.get(int(tid), "native")
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def measure(ds: Any) -> dict[str, Any]:
    """Read everything; the trainer's CPU and wall time, total and after the first batch."""
    records = nbytes = 0
    threads0 = thread_cpu()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    cpu_first = t_first = None
    batches = iter(ds)  # kept until its threads' CPU is read below
    for _, n, size in batches:
        if cpu_first is None:
            cpu_first, t_first = cpu_seconds(), time.perf_counter()
        records += int(n)
        nbytes += int(size)
    cpu1, t1 = cpu_seconds(), time.perf_counter()
    threads = {k: v - threads0.get(k, 0.0) for k, v in thread_cpu().items()}
    del batches
    return {
        "records": records,
        "bytes": nbytes,
        "wall_s": t1 - t0,
        "cpu_s": cpu1 - cpu0,
        "cpu_steady_s": cpu1 - (cpu_first if cpu_first is not None else cpu0),
        "first_batch_s": (t_first if t_first is not None else t1) - t0,
        "threads_cpu_s": {k: round(v, 3) for k, v in threads.items() if v > 0},
    }


def trainer_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    ds = build(spec, tf)
    print("READY", flush=True)
    if not sys.stdin.readline():
        return 1
    result = measure(ds)
    print("RESULT " + json.dumps(result), flush=True)
    # An orderly exit: prefetchd's releaser frees the last shard at exit, and the daemon
    # finishes only once every shard is consumed.
    return 0


# --- the harness -----------------------------------------------------------------------------


def per_gib(run: dict[str, Any], key: str) -> float:
    return float(run[key]) / (float(run["bytes"]) / GiB)


def summary(runs: dict[str, list[dict[str, Any]]], expected: int) -> str:
    """The table: medians per loader and the ratios against lean and floor."""
    lines = [f"{'loader':<10} {'CPU-s/GiB':>10} {'steady':>8} {'MB/s':>8}   runs (CPU-s/GiB)"]
    med: dict[str, float] = {}
    for loader, got in runs.items():
        cpu = [per_gib(r, "cpu_s") for r in got]
        med[loader] = statistics.median(cpu)
        steady = statistics.median(per_gib(r, "cpu_steady_s") for r in got)
        mbs = statistics.median(r["bytes"] / r["wall_s"] / 1e6 for r in got)
        runs_text = " ".join(f"{c:.2f}" for c in cpu)
        lines.append(f"{loader:<10} {med[loader]:>10.2f} {steady:>8.2f} {mbs:>8.0f}   {runs_text}")
        short = [r["records"] for r in got if r["records"] != expected]
        if short:
            lines.append(f"  !! {loader} delivered {short} of {expected} records")
    if "prefetchd" in med:
        for base in ("lean", "floor"):
            if base in med:
                ratio = med["prefetchd"] / med[base]
                lines.append(f"prefetchd/{base}: {ratio:.2f}x (bar: <= 1.25x)")
    return "\n".join(lines)


@contextlib.contextmanager
def workspace() -> Iterator[tuple[Path, Path]]:
    work = Path(tempfile.mkdtemp(prefix="measure-trainer-", dir="/tmp"))
    ram = Path(tempfile.mkdtemp(prefix="measure-trainer-", dir="/dev/shm"))
    try:
        yield work, ram
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)


def harness(args: argparse.Namespace) -> int:
    env = dict(os.environ, AWS_ACCESS_KEY_ID="measure", AWS_SECRET_ACCESS_KEY="measure")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.update(AWS_ACCESS_KEY_ID="measure", AWS_SECRET_ACCESS_KEY="measure")
    with workspace() as (work, ram):
        floor = ram / "floor"
        floor.mkdir()
        files = write_files(floor, int(args.gib * GiB), args.seed)
        expected = sum(f.stat().st_size for f in files) // (RECORD_SIZE + 16)
        store = start_store(args.store, args.port)
        try:
            upload(store.endpoint, files)
            extra = json.loads(args.trainer_json)
            runner = Runner(floor, store.endpoint, work, ram, env, extra, args.py_spy)
            runs = rounds(runner, args.loaders, args.repeats)
        finally:
            store.stop()
    print(summary(runs, expected))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))
    return 0


def rounds(runner: Runner, loaders: list[str], repeats: int) -> dict[str, list[dict[str, Any]]]:
    """Every loader once per round, ``repeats`` rounds (interleaved: drift hits all alike)."""
    runs: dict[str, list[dict[str, Any]]] = {loader: [] for loader in loaders}
    for round_ in range(repeats):
        for loader in loaders:
            result = runner.run(loader)
            runs[loader].append(result)
            print(
                f"round {round_ + 1}/{repeats} {loader:<10} "
                f"{per_gib(result, 'cpu_s'):.2f} CPU-s/GiB, {result['wall_s']:.1f} s",
                flush=True,
            )
    return runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trainer", help=argparse.SUPPRESS)
    p.add_argument("--store", choices=("seaweedfs", "moto"), default="seaweedfs")
    p.add_argument("--port", type=int, default=18300, help="S3 port; others follow (+1..+8)")
    p.add_argument("--gib", type=float, default=1.0, help="dataset size in GiB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loaders", nargs="+", choices=LOADERS, default=list(LOADERS))
    p.add_argument(
        "--trainer-json", default="{}", help='extra trainer spec, e.g. {"dataset_kwargs": {...}}'
    )
    p.add_argument("--json", help="write every run's result to this file")
    p.add_argument("--py-spy", help="profile each trainer: PREFIX-LOADER-TIME.txt (raw, --native)")
    args = p.parse_args()
    if args.trainer:
        return trainer_main(args.trainer)
    return harness(args)


if __name__ == "__main__":
    sys.exit(main())
