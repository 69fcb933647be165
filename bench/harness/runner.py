"""One run of one contender on one dataset, measured; and the interleaved plan of runs.

A ceiling run times its copy command (``bench.harness.ceilings``) and what it left on tmpfs. A
trainer run starts a ``bench.drivers.trainer`` process, waits for its ``READY``, starts the
prefetchd daemon (or the lean downloader, ``bench.drivers.crt lean``) if the contender has one,
says go, and reads the trainer's ``RESULT``; a sampler records peak memory and RAM disk
meanwhile, and a start-up probe the daemon's CPU at its first GET (and, when asked, how long
``prefetchd status`` takes against it). The daemon's CPU is split into start-up (to its first
GET) and data path (the rest: per GB, per object, per record,
``bench.harness.report.cpu_split``). Every process runs from the repository root with the
bench's environment (``bench.harness.environment.bench_env``).
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

from bench.harness import ceilings
from bench.harness.contenders import BY_NAME, Contender
from bench.harness.datasets import Uploaded
from bench.harness.environment import ROOT, log
from bench.harness.layout import BENCH, Layout
from bench.harness.report import cpu_split
from bench.harness.sampler import Sampler, StartupProbe, children_cpu, dir_bytes

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
    cache_root: Path = Path("/dev/shm")  # where download.cache_dir goes (--layout, --cache-dir)
    layout: Layout = BENCH  # output.writers and download.concurrency (--layout)

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
                "concurrency": self.layout.concurrency,
                "part_size": "8MiB",
                "client": client,
            },
            "output": {
                "ram_dir": str(self.ram / run_dir.name),
                "ram_budget": "1GiB",
                "writers": self.layout.writers,
                "shard_size": "32MiB",
            },
            "status": {"state_dir": str(run_dir / "state")},
            "log": {"level": "info" if self.args.keep_logs else "warning"},
        }
        if self.layout.mix is not None:
            cfg["output"]["mix"] = self.layout.mix
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
        startup = ceiling_startup_cpu(done.stdout)
        return {
            "mb_s": ds.bytes / wall / 1e6,
            "records_s": None,
            "objects_s": ds.objects / wall,
            "wall_s": wall,
            "bytes": ds.bytes,
            "daemon_cpu_s_per_gb": cpu / (ds.bytes / GB),  # the downloader's own CPU
            "ram_peak_mib": sampler.disk_bytes / MiB,
            **daemon_split(ds, cpu, startup),
        }

    # --- trainers ------------------------------------------------------------------------------

    def run_trainer(
        self,
        ds: Uploaded,
        loader: str,
        *,
        gil_work: int = 0,
        trainer: dict[str, Any] | None = None,
        probe_status: bool = False,
        **overrides: Any,
    ) -> dict[str, Any]:
        """One trainer run; ``trainer`` adds to its spec, ``overrides`` (``section__key``)
        change the daemon's config, ``probe_status`` times ``prefetchd status`` against the
        daemon once its first shard is ready. Raises RuntimeError naming where the run's logs
        were kept."""
        run_dir = Path(tempfile.mkdtemp(prefix=f"{loader}-{ds.spec.name}-", dir=self.work))
        try:
            contender = BY_NAME[loader]
            run = Run(ds, contender, run_dir, gil_work, probe_status)
            result = self._run_trainer(run, trainer or {}, overrides)
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
        """The JSON spec ``bench.drivers.trainer`` reads (``config`` is added for a daemon run)."""
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
        self, run: Run, trainer_spec: dict[str, Any], overrides: dict[str, Any]
    ) -> dict[str, Any]:
        ds, contender, run_dir = run.ds, run.contender, run.run_dir
        spec = {**self.trainer_spec(ds, contender, run.gil_work), **trainer_spec}
        if contender.daemon_client is not None:
            run.config = self.daemon_config(ds, contender.daemon_client, run_dir, **overrides)
            spec["config"] = str(run.config)
        if contender.lean:
            spec["lean_fifo"] = str(run_dir / "lean.fifo")
            os.mkfifo(spec["lean_fifo"], 0o600)
        with self._processes(spec, run) as (trainer, daemon):
            ram_dir = self.ram / run_dir.name if daemon is not None else None
            sampler = Sampler(daemon.pid if daemon else None, trainer.pid, ram_dir)
            sampler.start()
            probe = self._probe(run, daemon)
            try:
                result = read_result(trainer, run_dir)
                (run_dir / "result.json").write_text(json.dumps(result))
                trainer.wait(TRAINER_EXIT_TIMEOUT)
                if probe is not None:
                    probe.stop()  # its status command must not count as the daemon's CPU
                daemon_cpu = None if daemon is None else wait_daemon(daemon, run_dir)
            finally:
                sampler.stop()
        if result["records"] != ds.records:
            raise RuntimeError(
                f"{contender.name} delivered {result['records']} of {ds.records} records"
            )
        startup = probe.startup_cpu_s if probe is not None else lean_startup_cpu(daemon)
        metrics = trainer_metrics(result, sampler, daemon_cpu, with_daemon=daemon is not None)
        metrics.update(daemon_split(ds, daemon_cpu, startup))
        if probe is not None and run.probe_status:
            metrics.update(status_s=probe.status_s, status_error=probe.status_error)
        return metrics

    def _probe(self, run: Run, daemon: subprocess.Popen[bytes] | None) -> StartupProbe | None:
        """A prefetchd daemon's start-up probe, started (None for anything else)."""
        if daemon is None or run.config is None:
            return None
        status = None
        if run.probe_status:
            status = [sys.executable, "-m", "prefetchd", "status", "--config", str(run.config)]
            status.append("--json")
        ram_dir = self.ram / run.run_dir.name
        tmp = self.cache_root / run.run_dir.name / ".tmp"
        shards = (ram_dir / "ready", ram_dir / "claimed")
        probe = StartupProbe(daemon.pid, tmp, status, shards, self.env)
        probe.start()
        return probe

    @contextmanager
    def _processes(
        self, spec: dict[str, Any], run: Run
    ) -> Iterator[tuple[subprocess.Popen[str], subprocess.Popen[bytes] | None]]:
        """The trainer, started and READY; then the daemon (prefetchd or lean, if the run has
        one), and go. Whatever still runs at the end is killed."""
        run_dir = run.run_dir
        trainer = subprocess.Popen(
            [sys.executable, "-m", "bench.drivers.trainer", json.dumps(spec)],
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
            if run.config is not None:
                daemon = self._start_daemon(run.config, run_dir)
            elif run.contender.lean:
                daemon = self._start_lean(run.ds, spec["lean_fifo"], run_dir)
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

    def _start_lean(self, ds: Uploaded, fifo: str, run_dir: Path) -> subprocess.Popen[bytes]:
        """``bench.drivers.crt lean`` downloading ``ds`` to the run's RAM disk dir, announcing files
        on ``fifo``; its stdout (one JSON line at the end) is read by ``lean_startup_cpu``."""
        cmd = [sys.executable, "-m", "bench.drivers.crt", "lean", self.endpoint, BUCKET, ds.prefix]
        return subprocess.Popen(
            [*cmd, str(self.ram / run_dir.name), fifo, "--seed", str(self.args.seed)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=open(run_dir / "lean.log", "wb"),
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
        )


@dataclass
class Run:
    """One trainer run: what is read by whom, where its files go, what else it measures."""

    ds: Uploaded
    contender: Contender
    run_dir: Path
    gil_work: int = 0
    probe_status: bool = False
    config: Path | None = None  # the prefetchd daemon's, when the contender has one


def ceiling_startup_cpu(stdout: str) -> float | None:
    """The start-up CPU a ceiling printed (``bench.drivers.crt ceiling``'s 4th field), or None."""
    fields = stdout.split()
    try:
        return float(fields[3]) if len(fields) >= 4 else None
    except ValueError:
        return None


def lean_startup_cpu(daemon: subprocess.Popen[bytes] | None) -> float | None:
    """The start-up CPU ``bench.drivers.crt lean`` reported on its last stdout line, or None."""
    if daemon is None or daemon.stdout is None:
        return None
    lines = daemon.stdout.read().decode(errors="replace").strip().splitlines()
    try:
        value = json.loads(lines[-1]).get("startup_cpu_s") if lines else None
    except ValueError:
        return None
    return None if value is None else float(value)


def daemon_split(ds: Uploaded, cpu: float | None, startup: float | None) -> dict[str, Any]:
    """The daemon's start-up CPU and its data path's (the rest) per GB, object, record, file."""
    data = None if cpu is None or startup is None else cpu - startup
    split = cpu_split(data, nbytes=ds.bytes, objects=ds.objects, records=ds.records, files=ds.files)
    return {"startup_cpu_s": startup, **split}


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
    bench: Bench,
    ds: Uploaded,
    loader: str,
    network: str,
    repeat: int,
    gil_work: int = 0,
    probe_status: bool = False,
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
            run.update(bench.run_trainer(ds, loader, gil_work=gil_work, probe_status=probe_status))
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
