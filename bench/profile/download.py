"""What the download side costs and how early it delivers, beside the awscrt ceiling.

    python -m bench.profile.download [--dataset small,medium,large] [--client classic,crt,native]
        [--mode downloader|daemon] [--layout bench|user] [--proxy] [--repeats N] [--port P]
        [--profile DIR] [--wrap CMD] [--json FILE]

One command: start SeaweedFS on 127.0.0.1 (``testkit.seaweedfs``: S3 on ``--port``, its other
listeners on ``--port``+1..+8), upload seeded datasets (``testkit.sample_data``), then for each
dataset, interleaved and ``--repeats`` times:

- **ceiling**: ``bench.drivers.crt ceiling`` (``awscrt.s3.S3Client`` writing every object to tmpfs
  on its native threads, 32 connections, 8 MiB parts), the CPU of that process from its first
  request to its last object;
- **prefetchd** per ``--client``: ``--mode downloader`` runs the downloader process alone (window
  larger than the dataset, no writers) and counts its CPU from the end of its listing to its last
  object; ``--mode daemon`` runs ``prefetchd run`` with a trainer that claims and releases every
  shard (``ready_files``) and counts every daemon process (per role, and the CPU spent before
  the first GET).

It prints medians of CPU ms per object and CPU s per GB with their ratio to the ceiling.
``--proxy`` puts ``bench.drivers.paced_proxy`` between the clients and the store (each connection
paced to ``--rate`` MiB/s, each response's first byte held ``--first-byte`` ms, like a real object
store over a real network; on ``--port``+9) and adds an in-trainer-like baseline (boto3, one GET at
a time, in order) and the times at which the first object, and 50 % / 100 % of the bytes *in
order*, were available to the writers. ``--profile DIR`` runs each prefetchd run under
``py-spy record`` (collapsed stacks); ``--wrap CMD`` under any command (``strace -f -c -o F``);
``--json FILE`` appends every run's result, with the daemon's pids by role, to attribute a
system-wide ``perf record`` to its processes. ``--layout user`` runs the daemon as
``bench --layout user`` does (the cache on the local disk, ``prefetchd init``'s writers and
connections, ``bench.harness.layout``); the default keeps the tables' tmpfs layout. In daemon
mode each role's CPU is also given as its kernel (system) part. Nothing is left running: the
store, the proxy and every child are stopped by PID, also on failure. Needs ``weed`` (and for
``--profile`` ``py-spy``) on PATH or next to this Python; datasets live on /dev/shm, and so
do caches but with ``--layout user``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.drivers.paced_proxy import paced_proxy
from bench.harness.datasets import DatasetSpec
from bench.harness.environment import ROOT, bench_env
from bench.harness.layout import BENCH, LAYOUTS, Layout, resolve
from bench.harness.sampler import children_cpu, has_entries, process_cpu, tree_pids
from prefetchd.config import CLIENTS
from testkit import sample_data
from testkit.seaweedfs import start_seaweedfs

BUCKET = "measure"
KiB, MiB = 1024, 1024**2
SHM = Path("/dev/shm")
RUN_TIMEOUT = 900.0
CEILING_CONNECTIONS = 32
SEED = 0

DATASETS = {
    "small": DatasetSpec("small", "raw", 3000, 64 * KiB, 200 * KiB),
    "medium": DatasetSpec("medium", "tfrecord", 160, 1 * MiB, 8 * MiB, 256 * KiB),
    "large": DatasetSpec("large", "tfrecord", 24, 16 * MiB, 64 * MiB, 1 * MiB),
}


def upload(endpoint: str, ds: DatasetSpec) -> int:
    """Upload ``ds`` under ``<name>/`` (seeded sizes and bytes); returns its bytes."""
    client = sample_data.make_client(endpoint)
    sample_data.ensure_bucket(client, BUCKET)
    sizes = sample_data.object_sizes(ds.objects, ds.min_size, ds.max_size, SEED)
    uploaded = sample_data.upload_dataset(
        client, BUCKET, f"{ds.name}/", kind=ds.kind, sizes=sizes, seed=SEED,
        record_size=ds.record_size,
    )  # fmt: skip
    return uploaded["bytes"]


# --- running one measured process ---------------------------------------------------------------


def run_child(*args: str, profile: Path | None = None, wrap: str = "") -> dict[str, Any]:
    """Run this module's hidden sub-command ``args`` in a fresh process; its last stdout line
    is a JSON result. With ``profile``, under ``py-spy record`` writing collapsed stacks there;
    with ``wrap``, under that command (``strace -c -f -o FILE``, ``perf record -g -o FILE``)."""
    cmd = [sys.executable, "-m", "bench.profile.download", *args]
    if wrap:
        cmd = [*shlex.split(wrap), *cmd]
    if profile is not None:
        spy = shutil.which("py-spy") or "py-spy"
        spy_args = ["record", "--subprocesses", "--nonblocking", "-r", "250", "-f", "raw"]
        cmd = [spy, *spy_args, "-o", str(profile), "--", *cmd]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False, cwd=ROOT
    )
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    results = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]  # py-spy talks too
    return dict(json.loads(results[-1]))


def run_ceiling(endpoint: str, prefix: str) -> dict[str, Any]:
    """``bench.drivers.crt ceiling`` over ``prefix`` into a tmpfs dir: its CPU and wall time from
    its first request to its last object."""
    target = Path(tempfile.mkdtemp(prefix="profile-ceiling-", dir=SHM))
    cmd = [
        sys.executable,
        "-m",
        "bench.drivers.crt",
        "ceiling",
        endpoint,
        BUCKET,
        prefix,
        str(target),
    ]
    cmd += ["--connections", str(CEILING_CONNECTIONS), "--part-size", "8"]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False, cwd=ROOT
        )
    finally:
        shutil.rmtree(target, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"ceiling failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return ceiling_result(done.stdout)


def ceiling_result(stdout: str) -> dict[str, Any]:
    """What ``bench.drivers.crt ceiling`` printed (``objects bytes seconds startup_cpu_s
    transfer_cpu_s transfer_s``) as this tool's result (pure)."""
    objects, _, _, _, cpu, wall = stdout.split()[:6]
    return {"cpu": float(cpu), "wall": float(wall), "objects": int(objects)}


def cpu_self() -> float:
    """CPU seconds (user + system) of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, where os.times has ticks
    return usage.ru_utime + usage.ru_stime


# --- the hidden sub-commands: each a measured process ---------------------------------------------


def baseline_main(endpoint: str, prefix: str) -> None:
    """The in-trainer reader: boto3, one GET at a time in key order, bodies read and dropped."""
    s3 = sample_data.make_client(endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    wall, cpu, got, first = time.monotonic(), cpu_self(), 0, 0.0
    for key in keys:
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"]
        while chunk := body.read(MiB):
            got += len(chunk)
        first = first or time.monotonic() - wall
    wall, cpu = time.monotonic() - wall, cpu_self() - cpu
    print(json.dumps({"cpu": cpu, "wall": wall, "objects": len(keys), "first": first}))


def downloader_main(config_path: str) -> None:
    """The downloader process alone, as the supervisor would run it, for one epoch. Prints its
    CPU from the end of its listing (``ctx.ready``) to its last object, and when each object
    was published (seconds after start, by order position)."""
    from prefetchd.child.context import ChildContext
    from prefetchd.config import load_config
    from prefetchd.download.downloader import Downloader
    from prefetchd.layout import Layout

    started, started_at, cpu0 = time.monotonic(), time.time(), cpu_self()
    config = load_config(config_path)
    layout = Layout.of(config)
    layout.create()
    ctx = ChildContext("downloader", config)
    marks: dict[str, float] = {}

    def watch() -> None:  # cheap: one stat per 20 ms, so it costs the measured process nothing
        while not ctx.stopping:
            if ctx.ready and "cpu_ready" not in marks:
                marks["cpu_ready"] = cpu_self()
            if layout.downloaded_marker(0).exists():
                marks["cpu_done"] = cpu_self()
                ctx.stopping = True
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    Downloader(ctx).run()
    watcher.join()
    ready_cpu = marks.get("cpu_ready", cpu0)
    result = {
        "cpu": marks["cpu_done"] - ready_cpu,
        "cpu_start": ready_cpu - cpu0,
        "wall": time.monotonic() - started,
        "published": published_times(layout, started_at),
    }
    print(json.dumps(result))


def published_times(layout: Any, started_at: float) -> list[tuple[int, float]]:
    """``(position in the order, seconds after start)`` of every published object: the rename
    into ``ready/`` sets the file's ctime, so nobody has to watch while it runs."""
    from prefetchd.layout import parse_object_name

    times = []
    for entry in os.scandir(layout.cache_ready):
        parsed = parse_object_name(entry.name)
        if parsed:
            times.append((parsed[1], entry.stat().st_ctime - started_at))
    return sorted(times)


def daemon_main(config_path: str) -> None:
    """``prefetchd run`` with a trainer here that claims every shard and releases it unread.
    Prints the CPU of every daemon process (by role), and their CPU at the first GET (the
    first ``.part`` file)."""
    from prefetchd import ready_files
    from prefetchd.config import load_config
    from prefetchd.layout import Layout

    config = load_config(config_path)
    layout = Layout.of(config)
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "prefetchd", "run", "--config", config_path])
    sampler = RoleCpu(proc.pid, layout)
    sampler.start()
    first_shard = 0.0
    try:
        for path in ready_files(config, timeout=300):
            first_shard = first_shard or time.monotonic() - started
            with open(path, "rb"):
                pass  # opened and closed: the daemon may free it
    finally:
        code = proc.wait(120)
        sampler.stop()
    result = {
        "cpu": children_cpu(),
        "roles": sampler.by_role(),
        "roles_sys": sampler.by_role(system=True),
        "pids": {str(pid): role for pid, role in sampler.roles().items()},
        "cpu_start": sampler.at_first_get,
        "start_roles": sampler.start_roles,
        "wall": time.monotonic() - started,
        "first": first_shard,
        "exit": code,
    }
    print(json.dumps(result))


class RoleCpu(threading.Thread):
    """CPU seconds of the daemon's process tree by role, read from /proc every 10 ms (the last
    value seen per pid is kept, so children that exit still count up to their last sample),
    and the same at its first GET (the first file in ``cache/.tmp``)."""

    def __init__(self, root: int, layout: Any) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.layout = layout
        self.seen: dict[int, float] = {}
        self.system: dict[int, float] = {}  # the kernel's share of ``seen``
        self.at_first_get: float | None = None
        self.start_roles: dict[str, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.01):
            for pid in tree_pids(self.root):
                cpu = process_cpu(pid)
                if cpu is not None:
                    self.seen[pid] = cpu
                    self.system[pid] = system_cpu(pid) or self.system.get(pid, 0.0)
            if self.at_first_get is None and has_entries(self.layout.cache_tmp):
                self.at_first_get = sum(self.seen.values())
                self.start_roles = self.by_role()

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def roles(self) -> dict[int, str]:
        """Each known pid's role: the supervisor's, and those the children's reports name."""
        roles = {self.root: "supervisor"}
        for report in self.layout.children.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                roles[int(json.loads(report.read_text())["pid"])] = report.stem.split("-")[0]
        return roles

    def by_role(self, *, system: bool = False) -> dict[str, float]:
        """CPU per role, ``other`` for unknown pids; with ``system``, the kernel's part only."""
        return cpu_by_role(self.system if system else self.seen, self.roles())


def system_cpu(pid: int) -> float | None:
    """CPU seconds ``pid`` spent in the kernel so far; None if it has gone."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[12]) / os.sysconf("SC_CLK_TCK")  # stime
    return None


def cpu_by_role(seen: dict[int, float], roles: dict[int, str]) -> dict[str, float]:
    """Each pid's CPU summed by its role, ``other`` for pids without one (pure)."""
    out: dict[str, float] = {}
    for pid, cpu in seen.items():
        role = roles.get(pid, "other")
        out[role] = out.get(role, 0.0) + cpu
    return out


# --- one prefetchd run ------------------------------------------------------------------------


def job_config(
    endpoint: str,
    ds: DatasetSpec,
    client_name: str,
    run: Path,
    window: str,
    layout: Layout = BENCH,
) -> Any:
    """The daemon's config for one run, everything under ``run`` but the cache, which goes
    under ``run`` on tmpfs (the bench layout) or into ``layout.cache_parent`` (``--layout
    user``: on the local disk, as a user's), with the layout's writers, connections and mix."""
    cache = run / "cache" if layout.name == "bench" else layout.cache_parent / run.name
    config: dict[str, Any] = {
        "source": {
            "url": f"s3://{BUCKET}/{ds.name}/",
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "format": ds.kind,
        },
        "epochs": {"count": 1, "shuffle": True, "seed": 0},
        "download": {
            "cache_dir": str(cache),
            "window": window,
            "concurrency": layout.concurrency,
            "client": client_name,
        },
        "output": {
            "ram_dir": str(run / "ram"),
            "ram_budget": "1GiB",
            "writers": layout.writers,
            "shard_size": "32MiB",
        },
        "status": {"state_dir": str(run / "state")},
        "log": {"level": "warning"},
    }
    if layout.mix is not None:
        config["output"]["mix"] = layout.mix
    return config


def order_sizes(config_path: str) -> list[int]:
    """The sizes of the objects in epoch 0's order, as the downloader fetches them."""
    from prefetchd.config import load_config
    from prefetchd.download.order import epoch_permutation
    from prefetchd.download.share import ShareTable
    from prefetchd.download.store import list_share, make_client

    config = load_config(config_path)
    share = ShareTable()
    for obj in list_share(make_client(config), config):
        share.append(obj)
    share.finish()
    order = epoch_permutation(len(share), seed=0, epoch=0, shuffle=True)
    return [share[row].size for row in order]


def run_prefetchd(
    args: argparse.Namespace, endpoint: str, ds: DatasetSpec, client_name: str
) -> dict[str, Any]:
    """One prefetchd run in ``--mode``, in a private tmpfs dir removed afterwards."""
    import yaml

    run = Path(tempfile.mkdtemp(prefix="profile-run-", dir=SHM))
    config = job_config(endpoint, ds, client_name, run, args.window, args.layout)
    try:
        if args.mode == "downloader":  # larger than the dataset: no writers
            config["download"]["window"] = "64GiB"
        path = run / "prefetchd.yaml"
        path.write_text(yaml.safe_dump(config))
        profile = None
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            profile = args.profile / f"{ds.name}-{client_name}-{args.mode}.txt"
        result = run_child(f"_{args.mode}", str(path), profile=profile, wrap=args.wrap)
        if "published" in result:
            result["order"] = in_order(result.pop("published"), order_sizes(str(path)))
        return result
    finally:
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(config["download"]["cache_dir"], ignore_errors=True)


# --- the report (pure) ------------------------------------------------------------------------


def in_order(published: list[tuple[int, float]], sizes: list[int]) -> tuple[float, float, float]:
    """When the first object was published, and when half and all of the bytes were available
    as an unbroken prefix of the epoch's order (what the writers can consume)."""
    times = dict(published)
    prefix_time, done, half_at = 0.0, 0, 0.0
    total = sum(sizes)
    for seq in range(len(sizes)):
        prefix_time = max(prefix_time, times.get(seq, float("inf")))
        done += sizes[seq]
        if not half_at and done >= total / 2:
            half_at = prefix_time
    return min(times.values(), default=0.0), half_at, prefix_time


def line(
    label: str, runs: list[dict[str, Any]], ds_bytes: int, ds: DatasetSpec, ceil: float
) -> str:
    """One loader's medians: CPU per object and per GB, ratio to the ceiling, wall, extras."""
    cpu = statistics.median(r["cpu"] for r in runs)
    wall = statistics.median(r["wall"] for r in runs)
    per_obj = 1000 * cpu / ds.objects
    per_gb = cpu / (ds_bytes / 1e9)
    text = (
        f"  {label:<22} {per_obj:7.2f} ms/object {per_gb:6.2f} CPU-s/GB "
        f"x{cpu / ceil:5.2f} of ceiling  wall {wall:6.2f}s {ds_bytes / MiB / wall:7.0f} MiB/s"
    )
    if runs[0].get("cpu_start") is not None:  # the bar: start-up excluded, as the ceiling's
        steady = statistics.median(r["cpu"] - (r["cpu_start"] or 0) for r in runs)
        text += f"  steady {1000 * steady / ds.objects:.2f} ms/object x{steady / ceil:.2f}"
    return text + "".join(extra(runs) for extra in EXTRAS)


def _start(runs: list[dict[str, Any]]) -> str:
    if runs[0].get("cpu_start") is None:
        return ""
    return f"  start {statistics.median(r['cpu_start'] or 0 for r in runs):.2f} CPU-s"


def _order(runs: list[dict[str, Any]]) -> str:
    if "order" not in runs[0]:
        return ""
    first, half, full = (statistics.median(r["order"][i] for r in runs) for i in range(3))
    return f"  in order: first {first:.2f}s, 50% {half:.2f}s, 100% {full:.2f}s"


def _first(runs: list[dict[str, Any]]) -> str:
    if "first" not in runs[0]:
        return ""
    return f"  first {statistics.median(r['first'] for r in runs):.2f}s"


def _roles(runs: list[dict[str, Any]]) -> str:
    if "roles" not in runs[0]:
        return ""
    roles = sorted({k for r in runs for k in r["roles"]})
    total = [f"{k} {statistics.median(r['roles'].get(k, 0) for r in runs):.2f}" for k in roles]
    start = [
        f"{k} {statistics.median(r['start_roles'].get(k, 0) for r in runs):.2f}" for k in roles
    ]
    text = "  [" + ", ".join(total) + " CPU-s]  start [" + ", ".join(start) + "]"
    if "roles_sys" in runs[0]:
        kernel = [
            f"{k} {statistics.median(r['roles_sys'].get(k, 0) for r in runs):.2f}" for k in roles
        ]
        text += "  of which system [" + ", ".join(kernel) + "]"
    return text


EXTRAS = (_start, _order, _first, _roles)  # what some runs carry, in the order printed


# --- the harness --------------------------------------------------------------------------------


def report(
    args: argparse.Namespace, endpoint: str, ds: DatasetSpec, size: int, clients: list[str]
) -> None:
    """Every loader on ``ds``, ``--repeats`` rounds, then its lines."""
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeats):  # interleaved, so a busy moment hits every loader alike
        # Through the proxy too: its CPU is the ceiling's alone, its wall the network's best.
        results.setdefault("awscrt ceiling", []).append(run_ceiling(endpoint, f"{ds.name}/"))
        if args.proxy:
            baseline = run_child("_baseline", endpoint, f"{ds.name}/")
            results.setdefault("boto3 baseline", []).append(baseline)
        for name in clients:
            run = run_prefetchd(args, endpoint, ds, name)
            results.setdefault(f"prefetchd {name}", []).append(run)
    if args.json:  # every run's result, pids and roles included (to attribute a perf profile)
        with args.json.open("a") as out:
            out.write(json.dumps({"dataset": ds.name, "runs": results}) + "\n")
    ceil = statistics.median(r["cpu"] for r in results["awscrt ceiling"])
    print(f"{ds.name}: {ds.objects} objects, {size / MiB:.0f} MiB ({ds.kind})", flush=True)
    for label, runs in results.items():
        print(line(label, runs, size, ds, ceil), flush=True)


@contextlib.contextmanager
def endpoint_for(args: argparse.Namespace, store: str) -> Iterator[str]:
    """The store's URL, or with ``--proxy`` the pacing proxy's in front of it."""
    if not args.proxy:
        yield store
        return
    upstream = int(store.rsplit(":", 1)[1])
    env = dict(os.environ)
    with paced_proxy(upstream, args.port + 9, args.rate, args.first_byte, env) as url:
        yield url


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dataset", default="small,medium,large")
    p.add_argument("--client", default="classic,crt")
    p.add_argument("--mode", choices=("downloader", "daemon"), default="downloader")
    p.add_argument("--window", default="2GiB", help="download.window in daemon mode")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--port", type=int, default=19400, help="S3 port; +1..+9 used too")
    p.add_argument("--profile", type=Path, help="py-spy each prefetchd run (collapsed stacks)")
    p.add_argument("--proxy", action="store_true")
    p.add_argument("--rate", type=float, default=75.0, help="MiB/s per connection (--proxy)")
    p.add_argument("--first-byte", type=float, default=30.0, help="ms (--proxy)")
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="bench",
        help="daemon mode: bench (default; the cache on tmpfs, 2 writers) or user (the cache "
        "on the local disk, writers and connections as prefetchd init sizes them: "
        "bench.harness.layout)",
    )
    p.add_argument(
        "--wrap", default="", help="run each prefetchd run under this command (strace, perf)"
    )
    p.add_argument("--json", type=Path, help="append every run's result to this file")
    args = p.parse_args(argv)
    unknown = sorted(set(args.dataset.split(",")) - set(DATASETS))
    if unknown:
        p.error(f"unknown dataset(s) {unknown}; choose from {', '.join(DATASETS)}")
    unknown = sorted(set(args.client.split(",")) - set(CLIENTS))
    if unknown:
        p.error(f"unknown client(s) {unknown}; choose from {', '.join(CLIENTS)}")
    return args


def harness(args: argparse.Namespace) -> int:
    datasets = [DATASETS[name] for name in args.dataset.split(",")]
    clients = args.client.split(",")
    env = bench_env(f"http://127.0.0.1:{args.port}")
    os.environ.clear()  # every process this starts runs with the bench's environment
    os.environ.update(env)
    args.layout = resolve(args.layout, None, SHM)
    print(f"# layout {args.layout.describe()}", flush=True)
    server = start_seaweedfs(args.port)
    try:
        sizes = {ds.name: upload(server.endpoint, ds) for ds in datasets}
        with endpoint_for(args, server.endpoint) as endpoint:
            print(f"# {os.cpu_count()} cores, {args.mode}, endpoint {endpoint}, medians of "
                  f"{args.repeats}", flush=True)  # fmt: skip
            for ds in datasets:
                report(args, endpoint, ds, sizes[ds.name], clients)
    finally:
        server.stop()
        shutil.rmtree(args.layout.cache_parent, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sub, rest = (argv[0], argv[1:]) if argv else ("", [])
    if sub == "_baseline":
        baseline_main(*rest)
    elif sub == "_downloader":
        downloader_main(*rest)
    elif sub == "_daemon":
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        daemon_main(*rest)
    else:
        return harness(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
