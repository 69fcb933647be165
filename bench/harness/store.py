"""The benchmark's object store (``--store``): SeaweedFS by default, or moto, on 127.0.0.1.

Both launchers live in ``testkit`` (the tests and the demo use the same moto server); this
module only picks one. SeaweedFS is the default because moto is server-bound (~170 requests/s)
and would measure moto, not the clients.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from testkit import s3server, seaweedfs
from testkit.s3server import Server

STORES = ("seaweedfs", "moto")


def start_store(kind: str, port: int) -> Server:
    """Start ``kind`` with S3 on ``port`` and wait until it serves buckets; ``stop()`` it."""
    if kind == "seaweedfs":
        return seaweedfs.start_seaweedfs(port)
    workdir = Path(tempfile.mkdtemp(prefix="prefetchd-bench-moto-"))
    try:
        proc, url = s3server.start_moto(port, log_path=workdir / "moto.log")
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return Server("moto", url, proc, workdir)
