"""The paced network (``--network paced``): a TCP proxy on 127.0.0.1 in front of the store that
behaves like a real object store over a real network.

    python -m bench.drivers.paced_proxy UPSTREAM_PORT LISTEN_PORT
        [--rate-mib 75] [--first-byte-ms 30]

Every connection is paced to ``--rate-mib`` MiB/s from the store to the client, and the first
byte of each response is held until ``--first-byte-ms`` after the request that asked for it
arrived (a request is whatever the client sent since the last response began). Requests go
upstream untouched and unpaced.

The bytes of responses never enter Python: each connection's downstream thread ``splice``\\s
them from the store's socket into a pipe and from the pipe to the client's socket, in chunks
of at most ``CHUNK`` bytes, sleeping between chunks to keep the pace. Bounded: at most
``MAX_CONNECTIONS`` connections (more are closed at once), two threads and one pipe of
``CHUNK`` bytes each. It stops on SIGTERM, when its parent exits (checked every second) or
after ``MAX_LIFETIME`` seconds, whichever comes first; ``paced_proxy()`` starts and stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HOST = "127.0.0.1"
MiB = 1024**2
CHUNK = 256 * 1024  # ~3.3 ms of data at 75 MiB/s: the pace's granularity
MAX_CONNECTIONS = 512
MAX_LIFETIME = 6 * 3600.0
START_TIMEOUT = 10.0


class Pacing:
    """One connection's shared state: when the pending request arrived (None: no response is
    due), guarded by a lock as the two directions run on two threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: float | None = None

    def asked(self, now: float) -> None:
        with self._lock:
            if self._asked is None:
                self._asked = now

    def take(self) -> float | None:
        """When the request now being answered arrived, once per response (None after)."""
        with self._lock:
            asked, self._asked = self._asked, None
            return asked


def first_byte_wait(asked: float | None, first_byte: float, now: float) -> float:
    """Seconds to hold a response's first byte (pure): until ``first_byte`` after its request."""
    return 0.0 if asked is None else max(0.0, asked + first_byte - now)


def pace_due(due: float, now: float, size: int, rate: float) -> float:
    """When the next chunk may go after ``size`` bytes sent at ``now`` (pure): the link is idle
    from ``max(due, now)`` and ``size`` bytes take ``size / rate`` seconds on it."""
    return max(due, now) + size / rate


def pump_up(client: socket.socket, store: socket.socket, pacing: Pacing) -> None:
    """Client -> store, as it comes; each arrival marks a request (the first byte's clock)."""
    with contextlib.suppress(OSError):
        while data := client.recv(64 * 1024):
            pacing.asked(time.monotonic())
            store.sendall(data)
    with contextlib.suppress(OSError):
        store.shutdown(socket.SHUT_WR)


def pump_down(
    store: socket.socket, client: socket.socket, pacing: Pacing, rate: float, first_byte: float
) -> None:
    """Store -> client through a pipe with ``splice``: first bytes held, every chunk paced."""
    read_end, write_end = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, CHUNK)
    due = 0.0
    try:
        while (n := os.splice(store.fileno(), write_end, CHUNK)) > 0:
            now = time.monotonic()
            asked = pacing.take()
            if asked is not None:
                time.sleep(first_byte_wait(asked, first_byte, now))
                now = due = time.monotonic()
            left = n
            while left > 0:
                left -= os.splice(read_end, client.fileno(), left)
            due = pace_due(due, now, n, rate)
            time.sleep(max(0.0, due - time.monotonic()))  # one clock read: never negative
    except OSError:
        pass  # either side went away: the connection is over
    finally:
        os.close(read_end)
        os.close(write_end)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)


def serve_connection(
    client: socket.socket, upstream: int, rate: float, first_byte: float, slots: threading.Semaphore
) -> None:
    try:
        with client, socket.create_connection((HOST, upstream)) as store:
            pacing = Pacing()
            up = threading.Thread(target=pump_up, args=(client, store, pacing), daemon=True)
            up.start()
            pump_down(store, client, pacing, rate, first_byte)
            up.join()
    except OSError:
        pass  # the store refused or reset: the client sees its connection close
    finally:
        slots.release()


def serve(upstream: int, port: int, rate: float, first_byte: float) -> None:
    """Accept on 127.0.0.1:``port`` until told to stop (see the module docstring)."""
    parent, deadline = os.getppid(), time.monotonic() + MAX_LIFETIME
    slots = threading.Semaphore(MAX_CONNECTIONS)
    with socket.create_server((HOST, port), backlog=256) as server:
        server.settimeout(1.0)
        while os.getppid() == parent and time.monotonic() < deadline:
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            if not slots.acquire(blocking=False):
                client.close()
                continue
            args = (client, upstream, rate, first_byte, slots)
            threading.Thread(target=serve_connection, args=args, daemon=True).start()


@contextlib.contextmanager
def paced_proxy(
    upstream: int, port: int, rate_mib: float, first_byte_ms: float, env: dict[str, str]
) -> Iterator[str]:
    """The proxy in its own process, answering (through to the store) on ``port``; its URL.
    Stopped (SIGTERM, then SIGKILL) on exit, also on failure."""
    cmd = [sys.executable, "-m", "bench.drivers.paced_proxy", str(upstream), str(port)]
    cmd += ["--rate-mib", str(rate_mib), "--first-byte-ms", str(first_byte_ms)]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdin=subprocess.DEVNULL)
    try:
        url = f"http://{HOST}:{port}"
        _wait_answering(proc, url)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_answering(proc: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the pacing proxy exited ({proc.returncode})")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # an S3 error page: the store answered through the proxy
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"the pacing proxy did not answer on {url}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("upstream", type=int, help="the store's port on 127.0.0.1")
    p.add_argument("port", type=int, help="where to listen on 127.0.0.1")
    p.add_argument("--rate-mib", type=float, default=75.0, help="MiB/s per connection")
    p.add_argument("--first-byte-ms", type=float, default=30.0)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # daemon threads: nothing to flush
    serve(args.upstream, args.port, args.rate_mib * MiB, args.first_byte_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
