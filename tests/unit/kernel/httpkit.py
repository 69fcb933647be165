"""A tiny scripted HTTP/1.1 server on 127.0.0.1 for the native engine's tests
(``test_http_engine.py``, and the sanitized run in ``test_sanitized_fuzz.py``).

Each accepted connection gets a thread that reads request heads and answers each with what
``script(request, connection_number, request_number)`` returns: a list of byte pieces sent one
by one (a pause between them, so that they arrive split), optionally followed by ``CLOSE``
(close the connection after answering) or ``HANG`` (send nothing more, keep it open). Every
request head seen is kept in ``requests``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

CLOSE = b"<close>"
HANG = b"<hang>"
Script = Callable[[str, int, int], list[bytes]]


def ok(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", *headers, "", ""]
    return "\r\n".join(lines).encode() + body


class Server:
    """Owns the listening socket, its accept thread and the connection threads."""

    def __init__(self, script: Script, pause: float = 0.0) -> None:
        self._script = script
        self._pause = pause
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.requests: list[str] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # wakes accept() (close alone does not)
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
        for thread in self._threads:
            thread.join(timeout=10)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                number = self.connections
                self.connections += 1
                self._open.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn, number), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        pending = b""
        served = 0
        try:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in pending:
                    got = conn.recv(65536)
                    if not got:
                        return
                    pending += got
                head, _, pending = pending.partition(b"\r\n\r\n")
                request = head.decode("latin-1")
                with self._lock:
                    self.requests.append(request)
                pieces = self._script(request, number, served)
                served += 1
                for piece in pieces:
                    if piece == CLOSE:
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    if piece == HANG:
                        self._stop.wait()
                        return
                    conn.sendall(piece)
                    if self._pause:
                        time.sleep(self._pause)
        except OSError:
            return
        finally:
            conn.close()
