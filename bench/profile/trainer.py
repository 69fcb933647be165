"""What the trainer pays to read prefetchd's shards, against trainers that read finished files.

    python -m bench.profile.trainer                     # SeaweedFS, 1 GiB, 3 rounds
    python -m bench.profile.trainer --store moto --gib 0.25 --repeats 1

One command, one run, three trainers measured interleaved (floor, lean, prefetchd; repeated
``--repeats`` times), each a fresh ``bench.drivers.trainer`` process that reports its own CPU
per GiB:

    floor      the TFRecord files already on tmpfs, one ``TFRecordDataset`` over all of them
    lean       the same files, ``interleave(TFRecordDataset, cycle_length=2)``
    prefetchd  the same records as objects in a local S3 server (``bench.harness.store``: SeaweedFS,
               or moto), the real daemon started next to the trainer (the bench's daemon
               config), read through ``prefetchd.tf.dataset(config)``

The data is ``--gib`` GiB rounded up to whole 32 MiB TFRecord files of 64 KiB records
(``bench.harness.datasets``: the same seeded records in the store and on tmpfs). Every trainer
batches 32 records, computes each batch's size in the graph, prefetches batches (AUTOTUNE) and
pulls them in a Python loop. A trainer's CPU is its own user+system time, clock started once
TensorFlow is imported and the pipeline built (the daemon runs in its own processes and is
started at the same moment the clock starts). Prints medians and the ratios prefetchd/lean
and prefetchd/floor; ``--json`` writes every run; ``--py-spy PREFIX`` profiles each trainer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.datasets import DatasetSpec, Uploaded, upload_and_stage
from bench.harness.environment import ROOT, bench_env
from bench.harness.runner import BUCKET, Bench, read_result
from bench.harness.store import STORES, start_store
from prefetchd.config import default_client
from testkit.s3server import HOST

KiB, MiB, GiB = 1024, 1024**2, 1024**3
RECORD_SIZE = 64 * KiB
FILE_SIZE = 32 * MiB  # floor files and S3 objects alike; prefetchd's shards are 32 MiB too
BATCH = 32
LOADERS = ("floor", "lean", "prefetchd")
READERS: dict[str, dict[str, Any]] = {  # loader -> its bench.drivers.readers reader and settings
    "floor": {"loader": "files"},
    "lean": {"loader": "files", "cycle_length": 2},
    "prefetchd": {"loader": "prefetchd"},
}
TRAINER_EXIT_TIMEOUT = 30.0
DAEMON_EXIT_TIMEOUT = 60.0


def dataset_spec(gib: float) -> DatasetSpec:
    """``gib`` GiB of 64 KiB records, in whole ``FILE_SIZE`` objects (at least one)."""
    objects = max(1, math.ceil(gib * GiB / FILE_SIZE))
    return DatasetSpec("data", "tfrecord", objects, FILE_SIZE, FILE_SIZE, RECORD_SIZE)


# --- one trainer run -------------------------------------------------------------------------


@dataclass
class Runner:
    """Starts trainer processes (and for ``prefetchd`` the daemon) and collects results."""

    data: Uploaded
    bench: Bench  # the store's endpoint, the temp dirs, the env, the daemon's config
    trainer_args: dict[str, Any]
    py_spy: str | None = None

    def run(self, loader: str) -> dict[str, Any]:
        run_dir = Path(tempfile.mkdtemp(prefix=f"{loader}-", dir=self.bench.work))
        spec: dict[str, Any] = {"batch": BATCH, "floor_dir": str(self.data.floor_dir)}
        spec.update(READERS[loader], thread_cpu=True, **self.trainer_args)
        if loader == "prefetchd":
            spec["config"] = str(self.bench.daemon_config(self.data, default_client(), run_dir))
        try:
            return self._run(loader, spec, run_dir)
        finally:
            shutil.rmtree(self.bench.ram / run_dir.name, ignore_errors=True)
            shutil.rmtree(self.bench.cache_root / run_dir.name, ignore_errors=True)

    def _run(self, loader: str, spec: dict[str, Any], run_dir: Path) -> dict[str, Any]:
        trainer = self._popen(
            ["-m", "bench.drivers.trainer", json.dumps(spec)], run_dir / "trainer.log"
        )
        daemon = spy = None
        try:
            assert trainer.stdin is not None and trainer.stdout is not None
            if trainer.stdout.readline().strip() != "READY":
                raise RuntimeError(f"trainer did not start:\n{_tail(run_dir / 'trainer.log')}")
            if "config" in spec:
                cmd = ["-m", "prefetchd", "run", "--config", spec["config"]]
                daemon = self._popen(cmd, run_dir / "daemon.log", pipe=False)
            spy = self._py_spy(trainer.pid, loader)
            trainer.stdin.write("go\n")
            trainer.stdin.flush()
            try:
                result = read_result(trainer, run_dir)
            except RuntimeError as exc:  # its run_dir goes with the workspace: show the log
                raise RuntimeError(f"{exc}:\n{_tail(run_dir / 'trainer.log')}") from None
            trainer.wait(TRAINER_EXIT_TIMEOUT)
            if spy is not None:
                spy.wait(30)
            if daemon is not None and daemon.wait(DAEMON_EXIT_TIMEOUT) != 0:
                raise RuntimeError(
                    f"daemon exited {daemon.returncode}:\n{_tail(run_dir / 'daemon.log')}"
                )
            return from_trainer(result)
        finally:
            for proc in (trainer, daemon, spy):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _py_spy(self, pid: int, loader: str) -> subprocess.Popen[str] | None:
        """``py-spy record`` on the trainer (on PATH), collapsed stacks per thread."""
        if not self.py_spy:
            return None
        out = f"{self.py_spy}-{loader}-{time.strftime('%H%M%S')}.txt"
        cmd = [shutil.which("py-spy") or "py-spy", "record", "-p", str(pid), "-t", "-f", "raw"]
        return subprocess.Popen(
            [*cmd, "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
        )

    def _popen(self, args: list[str], log: Path, *, pipe: bool = True) -> subprocess.Popen[str]:
        """``python args`` from the repository root, stderr to ``log``; stdin and stdout are
        pipes when ``pipe`` (the trainer's protocol)."""
        with open(log, "wb") as err:
            return subprocess.Popen(
                [sys.executable, *args],
                stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
                stdout=subprocess.PIPE if pipe else subprocess.DEVNULL,
                stderr=err,
                env=self.bench.env,
                cwd=ROOT,
                start_new_session=True,
                text=True,
            )


def from_trainer(result: dict[str, Any]) -> dict[str, Any]:
    """A ``bench.drivers.trainer`` result under this tool's names (those of ``--json``) (pure)."""
    wall = result["wall_s"]
    return {
        "records": result["records"],
        "bytes": result["bytes"],
        "wall_s": wall,
        "cpu_s": result["trainer_cpu_s"],
        "cpu_steady_s": result["trainer_cpu_steady_s"],
        "first_batch_s": first if (first := result["first_batch_s"]) is not None else wall,
        "threads_cpu_s": result.get("threads_cpu_s", {}),
    }


def _tail(log: Path) -> str:
    """The end of a log (the run's directory is removed when the command ends)."""
    return log.read_text(errors="replace")[-3000:]


# --- the report (pure) -----------------------------------------------------------------------


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


# --- the harness -----------------------------------------------------------------------------


@contextlib.contextmanager
def workspace() -> Iterator[tuple[Path, Path]]:
    """A temp dir on disk and one on tmpfs, removed with everything in them."""
    work = Path(tempfile.mkdtemp(prefix="profile-trainer-", dir="/tmp"))
    ram = Path(tempfile.mkdtemp(prefix="profile-trainer-", dir="/dev/shm"))
    try:
        yield work, ram
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)


def harness(args: argparse.Namespace) -> int:
    env = bench_env(f"http://{HOST}:{args.port}")
    os.environ.update(env)  # the store's probe and the uploads use the same credentials
    with workspace() as (work, ram):
        store = start_store(args.store, args.port)
        try:
            (ram / "cache").mkdir()
            data = upload_and_stage(store.endpoint, BUCKET, dataset_spec(args.gib), args.seed, ram)
            bench = Bench(
                argparse.Namespace(keep_logs=False),
                store.endpoint,
                work,
                ram,
                env,
                cache_root=ram / "cache",
            )
            runner = Runner(data, bench, json.loads(args.trainer_json), args.py_spy)
            runs = rounds(runner, args.loaders, args.repeats)
        finally:
            store.stop()
    print(summary(runs, data.records))
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--store", choices=STORES, default="seaweedfs")
    p.add_argument("--port", type=int, default=18300, help="S3 port; others follow (+1..+8)")
    p.add_argument("--gib", type=float, default=1.0, help="dataset size in GiB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loaders", nargs="+", choices=LOADERS, default=list(LOADERS))
    p.add_argument(
        "--trainer-json", default="{}", help='extra trainer spec, e.g. {"dataset_kwargs": {...}}'
    )
    p.add_argument("--json", help="write every run's result to this file")
    p.add_argument("--py-spy", help="profile each trainer: PREFIX-LOADER-TIME.txt (raw)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return harness(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
