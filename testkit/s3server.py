"""Start and stop a local S3 endpoint (moto server) on 127.0.0.1 for the demo, the tests and the
benchmark (which also runs SeaweedFS: ``testkit.seaweedfs``).

moto is slow (~170 requests/s on a 2-core machine) but speaks S3 faithfully, which is what
functional tests need. The server always binds 127.0.0.1, runs in its own session (a Ctrl-C in the
terminal does not reach it; whoever started it stops it) and is stopped by PID:
SIGTERM, a grace period, then SIGKILL.

Python::

    with moto_server() as endpoint_url:
        boto3.client("s3", endpoint_url=endpoint_url)

Shell::

    python -m testkit.s3server moto --port-file F --pid-file P [--log-file L] [--foreground]
    python -m testkit.s3server stop --pid-file P
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

HOST = "127.0.0.1"
START_TIMEOUT = 30.0
STOP_GRACE = 10.0


class ServerError(RuntimeError):
    """The server did not start (the message carries the tail of its log)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (callers must cope with a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def moto_command(port: int, tls: Sequence[str] = ()) -> list[str]:
    """``moto.server`` on 127.0.0.1:``port``; ``tls`` is ``("-c", cert, "-k", key)`` for HTTPS."""
    return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port), *tls]


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether an HTTP server answers at ``url`` (any status code counts)."""
    try:
        # A local test server's certificate is self-signed: any answer counts, verified or not.
        context = ssl._create_unverified_context() if url.startswith("https:") else None
        with urllib.request.urlopen(url, timeout=timeout, context=context):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def _log_tail(path: Path | None, limit: int = 2000) -> str:
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n--- server log (tail) ---\n" + text[-limit:]


def start_moto(
    port: int | None = None,
    *,
    log_path: Path | None = None,
    timeout: float = START_TIMEOUT,
    tls: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """Start a moto server and wait until it answers; return the process and its endpoint URL.

    With ``port=None`` a free port is picked, and picked again if another process grabbed it
    before moto bound it. ``tls`` (``("-c", cert, "-k", key)``) serves HTTPS instead of HTTP.
    Raises ``ServerError`` if the server exits or stays silent.
    """
    attempts = 3 if port is None else 1
    last_error: ServerError | None = None
    for _ in range(attempts):
        chosen = port if port is not None else free_port()
        try:
            return _start_once(chosen, log_path, timeout, tls)
        except ServerError as exc:
            last_error = exc
    assert last_error is not None
    raise last_error


def _start_once(
    port: int, log_path: Path | None, timeout: float, tls: Sequence[str]
) -> tuple[subprocess.Popen[bytes], str]:
    url = f"{'https' if tls else 'http'}://{HOST}:{port}"
    if answers(url):
        raise ServerError(f"something already answers at {url}")
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log_path, "ab")) if log_path else subprocess.DEVNULL
        proc = subprocess.Popen(
            moto_command(port, tls),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_answering(proc, url, "moto server", log_path, timeout)
    return proc, url


def wait_answering(
    proc: subprocess.Popen[bytes], url: str, what: str, log_path: Path | None, timeout: float
) -> None:
    """Wait until an HTTP server answers at ``url``. Raises ``ServerError`` (with the tail of
    ``log_path``) if ``proc`` exits first, or stops it and raises after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(
                f"{what} exited with code {proc.returncode} before answering at {url}"
                + _log_tail(log_path)
            )
        if answers(url, timeout=0.5):
            return
        time.sleep(0.1)
    stop_process(proc)
    raise ServerError(
        f"{what} did not answer at {url} within {timeout:.0f} s" + _log_tail(log_path)
    )


def stop_process(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; always reaps the child."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


@dataclass
class Server:
    """A local S3 endpoint this process started; ``stop()`` ends it by PID, then removes
    ``workdir`` (its data and log), if any."""

    kind: str
    endpoint: str
    proc: subprocess.Popen[bytes]
    workdir: Path | None = None

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def stop(self) -> None:
        stop_process(self.proc)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def moto_server(
    port: int | None = None, *, log_path: Path | None = None, tls: Sequence[str] = ()
) -> Iterator[str]:
    """Run a moto server for the ``with`` block; yields its endpoint URL (``http://127.0.0.1:N``,
    or ``https://`` with ``tls``)."""
    proc, url = start_moto(port, log_path=log_path, tls=tls)
    try:
        yield url
    finally:
        stop_process(proc)


# --- stopping a server this process did not start (shell use) ------------------------------


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _is_moto(pid: int) -> bool:
    """Guard against a recycled PID: only signal a process whose command line is moto's."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"moto.server" in cmdline or b"moto_server" in cmdline


def stop_pid(pid: int, grace: float = STOP_GRACE) -> bool:
    """Stop the moto server ``pid``: SIGTERM, then SIGKILL after ``grace`` s. False if not ours."""
    if not _alive(pid) or not _is_moto(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


# --- command line --------------------------------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _cmd_moto(args: argparse.Namespace) -> int:
    log_path = Path(args.log_file) if args.log_file else None
    try:
        proc, url = start_moto(args.port, log_path=log_path)
    except ServerError as exc:
        print(f"s3server: {exc}", file=sys.stderr)
        return 1
    port = url.rsplit(":", 1)[1]
    if args.pid_file:
        _write_private(Path(args.pid_file), f"{proc.pid}\n")
    if args.port_file:
        _write_private(Path(args.port_file), f"{port}\n")
    print(url, flush=True)
    if not args.foreground:
        return 0  # the server lives on in its own session; stop it with `stop --pid-file`

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_process(proc)


def _cmd_stop(args: argparse.Namespace) -> int:
    path = Path(args.pid_file)
    try:
        pid = int(path.read_text().strip())
    except FileNotFoundError:
        print(f"no {path}: nothing to stop")
        return 0
    except (OSError, ValueError):
        print(f"s3server: no server PID in {path}", file=sys.stderr)
        return 1
    if stop_pid(pid):
        print(f"stopped moto server (pid {pid})")
    else:
        print(f"no moto server runs as pid {pid}: nothing to stop")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    moto = sub.add_parser("moto", help="start a moto S3 server on 127.0.0.1 and print its URL")
    moto.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    moto.add_argument("--port-file", help="write the chosen port here")
    moto.add_argument("--pid-file", help="write the server's PID here")
    moto.add_argument("--log-file", help="append the server's output here (default: discard)")
    moto.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached and stop the server on Ctrl-C/SIGTERM (default: leave it running)",
    )
    stop = sub.add_parser("stop", help="stop the server whose PID is in --pid-file")
    stop.add_argument("--pid-file", required=True)
    args = parser.parse_args(argv)
    if args.command == "moto":
        return _cmd_moto(args)
    return _cmd_stop(args)


if __name__ == "__main__":
    sys.exit(main())
