"""What the download side costs and how early it delivers, beside the awscrt ceiling.

    PYTHONPATH=$PWD python scripts/measure_download.py [--dataset small,medium,large]
        [--client classic,crt] [--mode downloader|daemon] [--proxy] [--repeats N] [--port P]

One command: start SeaweedFS on 127.0.0.1 (every port explicit: ``--port`` .. ``--port``+8,
each gRPC port +10000), upload seeded datasets, then for each dataset, interleaved and
``--repeats`` times:

- **ceiling**: ``awscrt.s3.S3Client`` writing every object to tmpfs on its native threads
  (``recv_filepath``), the CPU of that process while it transfers;
- **prefetchd** per ``--client``: ``--mode downloader`` runs the downloader process alone (window
  larger than the dataset, no writers) and counts its CPU from the end of its listing to its last
  object; ``--mode daemon`` runs ``prefetchd run`` with a trainer that claims and releases every
  shard (``ready_files``) and counts every daemon process (per role, and the CPU spent before
  the first GET).

It prints medians of CPU ms per object and CPU s per GB with their ratio to the ceiling.
``--proxy`` puts a pacing proxy between the clients and the store (each connection paced to
``--rate`` MiB/s, each response's first byte held ``--first-byte`` ms, like a real object store
over a real network) and adds an in-trainer-like baseline (boto3, one GET at a time, in order)
and the times at which the first object, and 50 % / 100 % of the bytes *in order*, were
available to the writers. Nothing is left running: the store, the proxy and every child are
stopped by PID, also on failure. Needs ``weed`` on PATH or next to this Python
(``/work/bench-tools/bin``); datasets and caches live on /dev/shm.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
BUCKET = "measure"
KiB, MiB = 1024, 1024**2
ROOT = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")
RUN_TIMEOUT = 900.0


@dataclass(frozen=True)
class Dataset:
    name: str
    format: str  # source.format
    count: int
    low: int  # object sizes, bytes, uniform in [low, high]
    high: int
    record: int  # TFRecord record size (tfrecord only)


DATASETS = {
    "small": Dataset("small", "raw", 3000, 64 * KiB, 200 * KiB, 0),
    "medium": Dataset("medium", "tfrecord", 160, 1 * MiB, 8 * MiB, 256 * KiB),
    "large": Dataset("large", "tfrecord", 24, 16 * MiB, 64 * MiB, 1 * MiB),
}


# --- the store ----------------------------------------------------------------------------------


@contextlib.contextmanager
def seaweedfs(base: int) -> Iterator[str]:
    """``weed server -s3`` on 127.0.0.1:``base``, stopped by PID on exit."""
    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    work = Path(tempfile.mkdtemp(prefix="measure-weed-", dir="/tmp"))
    ports = {"master.port": 1, "volume.port": 3, "filer.port": 5, "metricsPort": 8}
    cmd = [
        weed, "server", f"-dir={work}", f"-ip={HOST}", f"-ip.bind={HOST}",
        "-master.telemetry=false", "-master.volumeSizeLimitMB=1024", "-volume.max=0",
        "-volume.preStopSeconds=0", "-s3", f"-s3.port={base}", "-s3.port.iceberg=0",
        "-s3.port.lance=0", f"-s3.port.grpc={base + 7}",
        *(f"-{name}={base + off}" for name, off in ports.items()),
        *(f"-{name}.grpc={base + off + 1}" for name, off in ports.items() if name != "metricsPort"),
    ]  # fmt: skip
    try:
        with open(work / "weed.log", "wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        raise
    try:
        endpoint = f"http://{HOST}:{base}"
        _wait_for_store(proc, endpoint, work / "weed.log")
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def _wait_for_store(proc: subprocess.Popen[bytes], endpoint: str, log: Path) -> None:
    deadline = time.monotonic() + 90
    s3 = client(endpoint)
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"weed exited: {log.read_text(errors='replace')[-1500:]}")
        try:
            with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
                s3.create_bucket(Bucket=BUCKET)
            s3.put_object(Bucket=BUCKET, Key="probe/x", Body=b"x")
            s3.delete_object(Bucket=BUCKET, Key="probe/x")
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"SeaweedFS not ready: {exc}") from None
            time.sleep(0.5)


def client(endpoint: str, pool: int = 16) -> Any:
    import boto3
    import botocore.config

    cfg = botocore.config.Config(max_pool_connections=pool, retries={"mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=cfg)


def upload(endpoint: str, ds: Dataset) -> int:
    """Upload ``ds`` (seeded sizes, random bytes) as single-part objects; returns its bytes."""
    from prefetchd.tfrecord import frame

    rng = random.Random(ds.name)
    sizes = [rng.randint(ds.low, ds.high) for _ in range(ds.count)]
    s3 = client(endpoint)

    def body(size: int) -> bytes:
        if ds.format == "raw":
            return os.urandom(size)
        records, left = [], size
        while left > 16:
            n = min(ds.record, left - 16)
            records.append(frame(os.urandom(n)))
            left -= n + 16
        return b"".join(records)

    def put(i: int) -> int:
        data = body(sizes[i])
        s3.put_object(Bucket=BUCKET, Key=f"{ds.name}/{i:06d}", Body=data)
        return len(data)

    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(put, range(ds.count)))


# --- the pacing proxy ---------------------------------------------------------------------------


def proxy_main(upstream_port: int, port: int, rate: float, first_byte: float) -> None:
    """Forward 127.0.0.1:``port`` to the store: each connection paced to ``rate`` bytes/s, the
    first byte of each response held until ``first_byte`` s after its request arrived. Stops
    when its parent exits (checked every second) or after ``RUN_TIMEOUT`` x 4."""
    parent = os.getppid()

    async def pump_up(reader: Any, writer: Any, asked: list[float]) -> None:
        while data := await reader.read(256 * KiB):
            asked.append(time.monotonic())  # a request (or more of one) arrived
            writer.write(data)
            await writer.drain()
        writer.close()

    async def pump_down(reader: Any, writer: Any, asked: list[float]) -> None:
        due = 0.0
        while data := await reader.read(64 * KiB):
            now = time.monotonic()
            if asked:  # the first bytes of a response: hold them
                wait = asked[-1] + first_byte - now
                asked.clear()
                if wait > 0:
                    await asyncio.sleep(wait)
                due = time.monotonic()
            due = max(due, now) + len(data) / rate
            writer.write(data)
            await writer.drain()
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
        writer.close()

    async def handle(c_reader: Any, c_writer: Any) -> None:
        try:
            u_reader, u_writer = await asyncio.open_connection(HOST, upstream_port)
        except OSError:
            c_writer.close()
            return
        asked: list[float] = []
        with contextlib.suppress(Exception):
            await asyncio.gather(
                pump_up(c_reader, u_writer, asked), pump_down(u_reader, c_writer, asked)
            )
        c_writer.close()
        u_writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, HOST, port, backlog=256)
        deadline = time.monotonic() + 4 * RUN_TIMEOUT
        async with server:
            while os.getppid() == parent and time.monotonic() < deadline:
                await asyncio.sleep(1.0)

    asyncio.run(main())


@contextlib.contextmanager
def pacing_proxy(upstream: str, port: int, rate: float, first_byte: float) -> Iterator[str]:
    up = int(upstream.rsplit(":", 1)[1])
    args = [sys.executable, __file__, "_proxy", str(up), str(port), str(rate), str(first_byte)]
    proc = subprocess.Popen(args, env=measure_env(), start_new_session=True)
    try:
        url = f"http://{HOST}:{port}"
        for _ in range(100):
            if _answers(url):
                break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except urllib.error.HTTPError:
        return True  # an S3 error: the store answered through the proxy
    except (urllib.error.URLError, OSError):
        return False
    return True


# --- what each run measures ---------------------------------------------------------------------


def measure_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env.pop(name, None)
    env.update(
        AWS_ACCESS_KEY_ID="measure",
        AWS_SECRET_ACCESS_KEY="measure-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        NO_PROXY="127.0.0.1,localhost",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    return env


def run_child(*args: str, profile: Path | None = None) -> dict[str, Any]:
    """Run this script's hidden sub-command ``args`` in a fresh process; its last stdout line
    is a JSON result. With ``profile``, under ``py-spy record`` writing collapsed stacks there."""
    cmd = [sys.executable, __file__, *args]
    if profile is not None:
        spy = ["py-spy", "record", "--subprocesses", "--nonblocking", "-r", "250", "-f", "raw"]
        cmd = [*spy, "-o", str(profile), "--", *cmd]
    done = subprocess.run(
        cmd,
        env=measure_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    results = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]  # py-spy talks too
    return dict(json.loads(results[-1]))


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def ceiling_main(endpoint: str, prefix: str) -> None:
    """Every object of ``prefix`` to tmpfs through awscrt on its own threads; prints the CPU
    spent from the first request to the last object (the listing is not counted)."""
    import awscrt.auth
    import awscrt.http
    import awscrt.s3

    s3 = client(endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    objects = [(o["Key"], o["Size"]) for page in pages for o in page.get("Contents", [])]
    target = Path(tempfile.mkdtemp(prefix="measure-ceiling-", dir=SHM))
    provider = awscrt.auth.AwsCredentialsProvider.new_static("measure", "measure-secret")
    crt = awscrt.s3.S3Client(
        region="us-east-1",
        signing_config=awscrt.s3.create_default_s3_signing_config(
            region="us-east-1", credential_provider=provider
        ),
        tls_mode=awscrt.s3.S3RequestTlsMode.DISABLED,
        part_size=8 * MiB,
        max_active_connections_override=32,
        memory_limit=512 * MiB,
    )
    host = endpoint.split("//", 1)[1]
    left = threading.Semaphore(0)
    errors: list[str] = []

    def on_done(*, error: BaseException | None = None, **_: Any) -> None:
        if error is not None:
            errors.append(str(error))
        left.release()

    cpu, wall = cpu_self(), time.monotonic()
    requests = [
        crt.make_request(
            type=awscrt.s3.S3RequestType.GET_OBJECT,
            request=awscrt.http.HttpRequest(
                "GET", f"/{BUCKET}/{key}", awscrt.http.HttpHeaders([("Host", host)])
            ),
            recv_filepath=str(target / f"{i:07d}"),
            on_done=on_done,
        )
        for i, (key, _) in enumerate(objects)
    ]
    for _ in requests:
        left.acquire()
    cpu, wall = cpu_self() - cpu, time.monotonic() - wall
    shutil.rmtree(target, ignore_errors=True)
    if errors:
        raise SystemExit(f"ceiling: {len(errors)} errors, e.g. {errors[0]}")
    print(json.dumps({"cpu": cpu, "wall": wall, "objects": len(objects)}))


def baseline_main(endpoint: str, prefix: str) -> None:
    """The in-trainer reader: boto3, one GET at a time in key order, bodies read and dropped."""
    s3 = client(endpoint, pool=2)
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


def job_config(endpoint: str, ds: Dataset, client_name: str, run: Path, window: str) -> Any:
    return {
        "source": {
            "url": f"s3://{BUCKET}/{ds.name}/",
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "format": ds.format,
        },
        "epochs": {"count": 1, "shuffle": True, "seed": 0},
        "download": {
            "cache_dir": str(run / "cache"),
            "window": window,
            "concurrency": 32,
            "client": client_name,
        },
        "output": {
            "ram_dir": str(run / "ram"),
            "ram_budget": "1GiB",
            "writers": 2,
            "shard_size": "32MiB",
        },
        "status": {"state_dir": str(run / "state")},
        "log": {"level": "warning"},
    }


def downloader_main(config_path: str) -> None:
    """The downloader process alone, as the supervisor would run it, for one epoch. Prints its
    CPU from the end of its listing (``ctx.ready``) to its last object, and when each object
    was published (seconds after start, by order position)."""
    from prefetchd.config import load_config
    from prefetchd.download.downloader import Downloader
    from prefetchd.layout import Layout
    from prefetchd.supervise.child import ChildContext

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
    print(
        json.dumps(
            {
                "cpu": marks["cpu_done"] - ready_cpu,
                "cpu_start": ready_cpu - cpu0,
                "wall": time.monotonic() - started,
                "published": published_times(layout, started_at),
            }
        )
    )


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
    cmd = [sys.executable, "-m", "prefetchd", "run", "--config", config_path]
    proc = subprocess.Popen(cmd)
    sampler = CpuSampler(proc.pid, layout)
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
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = usage.ru_utime + usage.ru_stime
    result = {
        "cpu": total,
        "roles": sampler.by_role(),
        "cpu_start": sampler.at_first_get,
        "start_roles": sampler.start_roles,
        "wall": time.monotonic() - started,
        "first": first_shard,
        "exit": code,
    }
    print(json.dumps(result))


class CpuSampler(threading.Thread):
    """CPU seconds of a process tree, read from /proc every 10 ms (the last value seen per pid
    is kept, so children that exit still count up to their last sample)."""

    def __init__(self, root: int, layout: Any) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.layout = layout
        self.seen: dict[int, float] = {}
        self.at_first_get: float | None = None
        self.start_roles: dict[str, float] = {}
        self._halt = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        while not self._halt.wait(0.01):
            for pid in self._tree():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    self.seen[pid] = (int(fields[11]) + int(fields[12])) / self._tick
            if self.at_first_get is None and _any_file(self.layout.cache_tmp):
                self.at_first_get = sum(self.seen.values())
                self.start_roles = self.by_role()

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def by_role(self) -> dict[str, float]:
        roles = {self.root: "supervisor"}
        for report in self.layout.children.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                roles[int(json.loads(report.read_text())["pid"])] = report.stem.split("-")[0]
        out: dict[str, float] = {}
        for pid, cpu in self.seen.items():
            role = roles.get(pid, "other")
            out[role] = out.get(role, 0.0) + cpu
        return out

    def _tree(self) -> list[int]:
        pids, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            with contextlib.suppress(OSError):
                for task in os.listdir(f"/proc/{pid}/task"):
                    kids = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                    todo.extend(int(k) for k in kids)
        return pids


def _any_file(directory: Path) -> bool:
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        return any(True for _ in entries)
    return False


# --- the report ---------------------------------------------------------------------------------


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


def run_prefetchd(args: argparse.Namespace, endpoint: str, ds: Dataset, client_name: str) -> Any:
    import yaml

    run = Path(tempfile.mkdtemp(prefix="measure-run-", dir=SHM))
    try:
        window = "64GiB" if args.mode == "downloader" else args.window
        cfg = job_config(endpoint, ds, client_name, run, window)
        path = run / "prefetchd.yaml"
        path.write_text(yaml.safe_dump(cfg))
        profile = None
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            profile = args.profile / f"{ds.name}-{client_name}-{args.mode}.txt"
        result = run_child(f"_{args.mode}", str(path), profile=profile)
        if "published" in result:
            result["order"] = in_order(result.pop("published"), order_sizes(str(path)))
        return result
    finally:
        shutil.rmtree(run, ignore_errors=True)


def line(label: str, runs: list[dict[str, Any]], ds_bytes: int, ds: Dataset, ceil: float) -> str:
    cpu = statistics.median(r["cpu"] for r in runs)
    wall = statistics.median(r["wall"] for r in runs)
    per_obj = 1000 * cpu / ds.count
    per_gb = cpu / (ds_bytes / 1e9)
    text = (
        f"  {label:<22} {per_obj:7.2f} ms/object {per_gb:6.2f} CPU-s/GB "
        f"x{cpu / ceil:5.2f} of ceiling  wall {wall:6.2f}s {ds_bytes / MiB / wall:7.0f} MiB/s"
    )
    if "cpu_start" in runs[0] and runs[0]["cpu_start"] is not None:
        text += f"  start {statistics.median(r['cpu_start'] or 0 for r in runs):.2f} CPU-s"
    if "order" in runs[0]:
        first, half, full = (statistics.median(r["order"][i] for r in runs) for i in range(3))
        text += f"  in order: first {first:.2f}s, 50% {half:.2f}s, 100% {full:.2f}s"
    if "first" in runs[0]:
        text += f"  first {statistics.median(r['first'] for r in runs):.2f}s"
    if "roles" in runs[0]:
        roles = sorted({k for r in runs for k in r["roles"]})
        parts = [f"{k} {statistics.median(r['roles'].get(k, 0) for r in runs):.2f}" for k in roles]
        text += "  [" + ", ".join(parts) + " CPU-s]"
        parts = [
            f"{k} {statistics.median(r['start_roles'].get(k, 0) for r in runs):.2f}" for k in roles
        ]
        text += "  start [" + ", ".join(parts) + "]"
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dataset", default="small,medium,large")
    p.add_argument("--client", default="classic,crt")
    p.add_argument("--mode", choices=("downloader", "daemon"), default="downloader")
    p.add_argument("--window", default="2GiB", help="download.window in daemon mode")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--port", type=int, default=19400, help="S3 port; +1..+8 and +10000 used too")
    p.add_argument("--profile", type=Path, help="py-spy each prefetchd run (collapsed stacks)")
    p.add_argument("--proxy", action="store_true")
    p.add_argument("--rate", type=float, default=75.0, help="MiB/s per connection (--proxy)")
    p.add_argument("--first-byte", type=float, default=30.0, help="ms (--proxy)")
    args = p.parse_args()
    env = measure_env()
    os.environ.clear()
    os.environ.update(env)
    datasets = [DATASETS[name] for name in args.dataset.split(",")]
    clients = args.client.split(",")
    with seaweedfs(args.port) as store:
        sizes = {ds.name: upload(store, ds) for ds in datasets}
        with contextlib.ExitStack() as stack:
            endpoint = store
            if args.proxy:
                rate, delay = args.rate * MiB, args.first_byte / 1000
                endpoint = stack.enter_context(pacing_proxy(store, args.port + 9, rate, delay))
            print(f"# {os.cpu_count()} cores, {args.mode}, endpoint {endpoint}, medians of "
                  f"{args.repeats}", flush=True)  # fmt: skip
            for ds in datasets:
                report(args, store, endpoint, ds, sizes[ds.name], clients)
    return 0


def report(
    args: argparse.Namespace, store: str, endpoint: str, ds: Dataset, size: int, clients: list[str]
) -> None:
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeats):  # interleaved, so a busy moment hits every loader alike
        # Through the proxy too: its CPU is the ceiling's alone, its wall the network's best.
        results.setdefault("awscrt ceiling", []).append(run_child("_ceiling", endpoint, ds.name))
        if args.proxy:
            results.setdefault("boto3 baseline", []).append(
                run_child("_baseline", endpoint, ds.name)
            )
        for name in clients:
            run = run_prefetchd(args, endpoint, ds, name)
            results.setdefault(f"prefetchd {name}", []).append(run)
    ceil = statistics.median(r["cpu"] for r in results["awscrt ceiling"])
    print(f"{ds.name}: {ds.count} objects, {size / MiB:.0f} MiB ({ds.format})", flush=True)
    for label, runs in results.items():
        print(line(label, runs, size, ds, ceil), flush=True)


if __name__ == "__main__":
    sub = sys.argv[1] if len(sys.argv) > 1 else ""
    if sub == "_proxy":
        proxy_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    elif sub == "_ceiling":
        ceiling_main(sys.argv[2], sys.argv[3])
    elif sub == "_baseline":
        baseline_main(sys.argv[2], sys.argv[3])
    elif sub == "_downloader":
        downloader_main(sys.argv[2])
    elif sub == "_daemon":
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        daemon_main(sys.argv[2])
    else:
        sys.exit(main())
