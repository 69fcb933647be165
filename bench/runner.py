"""One run of one contender on one dataset, measured; and the interleaved plan of runs.

A ceiling run times its copy command (``bench.ceilings``) and what it left on tmpfs. A trainer
run starts a ``bench.trainer`` process, waits for its ``READY``, starts the prefetchd daemon if
the contender has one, says go, and reads the trainer's ``RESULT``; a sampler records peak
memory and RAM disk meanwhile. Every process runs from the repository root with the bench's
environment (``bench.environment.bench_env``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import ceilings
from bench.contenders import BY_NAME, Contender
from bench.datasets import Uploaded
from bench.environment import ROOT, log
from bench.sampler import Sampler, children_cpu, dir_bytes

BUCKET = "bench"
MiB = 1024**2
GB = 1e9
TRAINER_TIMEOUT = 900.0
TRAINER_EXIT_TIMEOUT = 30.0
DAEMON_EXIT_TIMEOUT = 30.0


@dataclass
class Bench:
    """Where runs happen and with what: the store, the temp dirs, the processes' environment."""

    args: argparse.Namespace
    endpoint: str
    work: Path  # temp dir on disk (cache, state, configs, logs)
    ram: Path  # temp dir on tmpfs
    env: dict[str, str] = field(default_factory=dict)
    logs: Path = Path("bench-logs")  # logs of failed runs are kept here
    cache_root: Path = Path("/dev/shm")  # where download.cache_dir goes (--cache-dir)

    def daemon_config(self, ds: Uploaded, client: str, run_dir: Path, **overrides: Any) -> Path:
        """The bench's daemon config for ``ds``; ``overrides`` are ``section__key=value``."""
        import yaml

        cfg: dict[str, Any] = {
            "source": {
                "url": f"s3://{BUCKET}/{ds.prefix}",
                "endpoint_url": self.endpoint,
                "region": "us-east-1",
                "format": ds.spec.kind,
            },
            "epochs": {"count": 1, "shuffle": True, "seed": 0},
            "download": {
                "cache_dir": str(self.cache_root / run_dir.name),
                "window": "2GiB",
                "concurrency": 32,
                "part_size": "8MiB",
                "client": client,
            },
            "output": {
                "ram_dir": str(self.ram / run_dir.name),
                "ram_budget": "1GiB",
                "writers": 2,
                "shard_size": "32MiB",
                "mix": 8,
            },
            "status": {"state_dir": str(run_dir / "state")},
            "log": {"level": "info" if self.args.keep_logs else "warning"},
        }
        for dotted, value in overrides.items():
            section, key = dotted.split("__")
            cfg[section][key] = value
        path = run_dir / "prefetchd.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    # --- ceilings ------------------------------------------------------------------------------

    def run_ceiling(self, ds: Uploaded, loader: str) -> dict[str, Any]:
        """The contender's copy command moving the objects to tmpfs, timed and sampled."""
        command = BY_NAME[loader].command
        assert command is not None, f"{loader} is not a ceiling"
        target = Path(tempfile.mkdtemp(prefix="ceiling-", dir=self.ram))
        cmd = command(ceilings.CopyJob(self.endpoint, BUCKET, ds.prefix, target))
        sampler = Sampler(None, None, target)
        sampler.start()
        cpu0 = children_cpu()
        t0 = time.perf_counter()
        done = subprocess.run(
            cmd, env=self.env, cwd=ROOT, capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - t0
        cpu = children_cpu() - cpu0
        sampler.stop()
        got = dir_bytes(target)
        shutil.rmtree(target, ignore_errors=True)
        if done.returncode != 0 or got < ds.bytes:
            raise RuntimeError(f"{loader} failed ({done.returncode}): {done.stderr[-500:]}")
        return {
            "mb_s": ds.bytes / wall / 1e6,
            "records_s": None,
            "objects_s": ds.objects / wall,
            "wall_s": wall,
            "bytes": ds.bytes,
            "daemon_cpu_s_per_gb": cpu / (ds.bytes / GB),  # the downloader's own CPU
            "ram_peak_mib": sampler.disk_bytes / MiB,
        }

    # --- trainers ------------------------------------------------------------------------------

    def run_trainer(
        self,
        ds: Uploaded,
        loader: str,
        *,
        gil_work: int = 0,
        trainer: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """One trainer run; ``trainer`` adds to its spec, ``overrides`` (``section__key``)
        change the daemon's config. Raises RuntimeError naming where the run's logs were kept."""
        run_dir = Path(tempfile.mkdtemp(prefix=f"{loader}-{ds.spec.name}-", dir=self.work))
        try:
            contender = BY_NAME[loader]
            result = self._run_trainer(ds, contender, run_dir, gil_work, trainer or {}, overrides)
            if self.args.keep_logs:
                self._keep(run_dir, self.logs.parent / "logs")
            return result
        except Exception as exc:
            kept = self._keep(run_dir, self.logs)
            raise RuntimeError(f"{type(exc).__name__}: {exc} (logs in {kept})") from None
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(self.ram / run_dir.name, ignore_errors=True)
            shutil.rmtree(self.cache_root / run_dir.name, ignore_errors=True)

    @staticmethod
    def _keep(run_dir: Path, parent: Path) -> Path:
        kept = parent / run_dir.name
        shutil.copytree(run_dir, kept, ignore=shutil.ignore_patterns("cache", "state"))
        return kept

    def trainer_spec(self, ds: Uploaded, contender: Contender, gil_work: int) -> dict[str, Any]:
        """The JSON spec ``bench.trainer`` reads (``config`` is added for a daemon run)."""
        return {
            "loader": contender.reader,
            "endpoint": self.endpoint,
            "bucket": BUCKET,
            "prefix": ds.prefix,
            "kind": ds.spec.kind,
            "batch": self.args.batch,
            "floor_dir": str(ds.floor_dir),
            "gil_work": gil_work,
        }

    def _run_trainer(
        self,
        ds: Uploaded,
        contender: Contender,
        run_dir: Path,
        gil_work: int,
        trainer_spec: dict[str, Any],
        overrides: dict[str, Any],
    ) -> dict[str, Any]:
        spec = {**self.trainer_spec(ds, contender, gil_work), **trainer_spec}
        config = None
        if contender.daemon_client is not None:
            config = self.daemon_config(ds, contender.daemon_client, run_dir, **overrides)
            spec["config"] = str(config)
        with self._processes(spec, config, run_dir) as (trainer, daemon):
            ram_dir = self.ram / run_dir.name if daemon is not None else None
            sampler = Sampler(daemon.pid if daemon else None, trainer.pid, ram_dir)
            sampler.start()
            try:
                result = read_result(trainer, run_dir)
                (run_dir / "result.json").write_text(json.dumps(result))
                trainer.wait(TRAINER_EXIT_TIMEOUT)
                daemon_cpu = None if daemon is None else wait_daemon(daemon, run_dir)
            finally:
                sampler.stop()
        if result["records"] != ds.records:
            raise RuntimeError(
                f"{contender.name} delivered {result['records']} of {ds.records} records"
            )
        return trainer_metrics(result, sampler, daemon_cpu, with_daemon=daemon is not None)

    @contextmanager
    def _processes(
        self, spec: dict[str, Any], config: Path | None, run_dir: Path
    ) -> Iterator[tuple[subprocess.Popen[str], subprocess.Popen[bytes] | None]]:
        """The trainer, started and READY; then the daemon (if ``config``), and go. Whatever
        still runs at the end is killed."""
        trainer = subprocess.Popen(
            [sys.executable, "-m", "bench.trainer", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(run_dir / "trainer.log", "wb"),  # noqa: SIM115
            env=self.env,
            cwd=ROOT,
            text=True,
        )
        daemon: subprocess.Popen[bytes] | None = None
        try:
            assert trainer.stdin is not None and trainer.stdout is not None
            line = trainer.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"trainer did not start: {line!r}; see {run_dir}/trainer.log")
            if config is not None:
                daemon = self._start_daemon(config, run_dir)
            trainer.stdin.write("go\n")
            trainer.stdin.flush()
            yield trainer, daemon
        finally:
            for proc in (trainer, daemon):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def _start_daemon(self, config: Path, run_dir: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "prefetchd", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(run_dir / "daemon.log", "wb"),
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
        )


def wait_daemon(daemon: subprocess.Popen[bytes], run_dir: Path) -> float:
    """The daemon's CPU seconds from the trainer's end to its own exit, which must be 0."""
    cpu_trainer_done = children_cpu()
    daemon.wait(DAEMON_EXIT_TIMEOUT)
    daemon_cpu = children_cpu() - cpu_trainer_done
    if daemon.returncode != 0:
        raise RuntimeError(f"daemon exited {daemon.returncode}; see {run_dir}")
    return daemon_cpu


def read_result(trainer: subprocess.Popen[str], run_dir: Path) -> dict[str, Any]:
    """The trainer's ``RESULT`` line; it is killed after ``TRAINER_TIMEOUT`` seconds."""
    assert trainer.stdout is not None
    deadline = time.monotonic() + TRAINER_TIMEOUT
    timer = threading.Timer(TRAINER_TIMEOUT, trainer.kill)
    timer.start()
    try:
        for line in trainer.stdout:
            if line.startswith("RESULT "):
                result: dict[str, Any] = json.loads(line[len("RESULT ") :])
                return result
    finally:
        timer.cancel()
    late = " (timed out)" if time.monotonic() > deadline else ""
    raise RuntimeError(f"trainer ended without a result{late}; see {run_dir}/trainer.log")


def trainer_metrics(
    result: dict[str, Any], sampler: Sampler, daemon_cpu: float | None, *, with_daemon: bool
) -> dict[str, Any]:
    """A trainer run's row: rates, CPU per GB, peaks (the daemon's only if it ran)."""
    gb = result["bytes"] / GB
    return {
        "mb_s": result["bytes"] / result["wall_s"] / 1e6,
        "records_s": result["records"] / result["wall_s"],
        "wall_s": result["wall_s"],
        "bytes": result["bytes"],
        "records": result["records"],
        "first_batch_s": result["first_batch_s"],
        "trainer_cpu_s_per_gb": result["trainer_cpu_s"] / gb,
        "trainer_cpu_steady_s_per_gb": result["trainer_cpu_steady_s"] / gb,
        "trainer_rss_peak_mib": max(sampler.trainer_rss, result["trainer_rss_bytes"]) / MiB,
        "daemon_cpu_s_per_gb": None if daemon_cpu is None else daemon_cpu / gb,
        "daemon_rss_peak_mib": sampler.daemon_rss / MiB if with_daemon else None,
        "ram_peak_mib": sampler.disk_bytes / MiB if with_daemon else None,
        "work_ms_median": result.get("work_ms_median"),
        "step_ms_median": result.get("step_ms_median"),
        "shards_pending_at_exit": result.get("shards_pending_at_exit"),
    }


# --- the plan ----------------------------------------------------------------------------------


def plan_runs(
    datasets: list[str], loaders: list[str], repeats: int, seed: int
) -> list[tuple[int, str, str]]:
    """Interleaved order: every repeat visits every dataset and loader once, loaders rotated
    per repeat so none always runs first (pure)."""
    order: list[tuple[int, str, str]] = []
    for r in range(repeats):
        for d in datasets:
            rotated = loaders[r % len(loaders) :] + loaders[: r % len(loaders)]
            order.extend((r, d, name) for name in rotated)
    return order


def one_run(
    bench: Bench, ds: Uploaded, loader: str, network: str, repeat: int, gil_work: int = 0
) -> dict[str, Any]:
    """One run's row; a failure is recorded in it (``error``), not raised."""
    run: dict[str, Any] = {
        "network": network,
        "dataset": ds.spec.name + ("/gil" if gil_work else ""),
        "loader": loader,
        "repeat": repeat,
        "load_before": os.getloadavg(),
    }
    try:
        if BY_NAME[loader].role == "ceiling":
            run.update(bench.run_ceiling(ds, loader))
        else:
            run.update(bench.run_trainer(ds, loader, gil_work=gil_work))
    except Exception as exc:
        run["error"] = str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"
    run["load_after"] = os.getloadavg()
    log_run(run, network, loader, repeat)
    return run


def log_run(run: dict[str, Any], network: str, loader: str, repeat: int) -> None:
    if run.get("error"):
        log(f"{network} {run['dataset']} {loader} #{repeat}: FAILED {run['error']}")
        return
    extra = (
        f", py work {run['work_ms_median']:.2f} ms, step {run['step_ms_median']:.2f} ms"
        if run.get("work_ms_median") is not None
        else ""
    )
    cpu = run.get("trainer_cpu_s_per_gb")
    log(
        f"{network} {run['dataset']} {loader} #{repeat}: {run['mb_s']:.0f} MB/s"
        + (f", trainer CPU {cpu:.2f} s/GB" if cpu is not None else "")
        + extra
    )
