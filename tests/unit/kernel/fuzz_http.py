"""The native GET client's engine under AddressSanitizer, run by ``test_sanitized_fuzz.py`` in a
process of its own: ``python fuzz_http.py PATH_OF_THE_SANITIZED_MODULE [EXAMPLES]``.

Two parts. The response parser (``_http.parse``) is fed responses drawn from a grammar — valid
ones (Content-Length or chunked bodies, chunk extensions, trailers, many and huge headers) and
the same mutated (bytes flipped, cut short, lengths that lie) — each split at random points, as
recv() would; a valid response must parse to the same answer however it is split. Then the
engine itself serves a scripted server (``httpkit``): whole and split bodies, chunked error
bodies, servers that close, hang or time out, cancels and a close with requests left. Exits 0
when every check held; a sanitizer report ends the process with its own non-zero status.
"""

from __future__ import annotations

import errno
import importlib.machinery
import importlib.util
import os
import random
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from prefetchd.kernel import choice
from tests.unit.kernel.httpkit import CLOSE, HANG, Server, ok

EXAMPLES = int(sys.argv[2]) if len(sys.argv) > 2 else 2000


def load(path: str) -> Any:
    loader = importlib.machinery.ExtensionFileLoader("prefetchd.kernel._http", path)
    spec = importlib.util.spec_from_file_location("prefetchd.kernel._http", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def response(rng: random.Random) -> tuple[bytes, bytes]:
    """A valid response and its body."""
    body = rng.randbytes(rng.choice([0, 1, 17, 500, 5000, 70_000]))
    status = rng.choice([200, 206, 403, 404, 412, 500, 503])
    lines = [f"HTTP/1.{rng.choice([0, 1])} {status} Reason"]
    for i in range(rng.choice([0, 1, 5, 40])):
        lines.append(f"X-Header-{i}: " + "v" * rng.choice([0, 3, 100, 2000]))
    if rng.random() < 0.3:
        lines.append('ETag: "abc"')
        lines.append("x-amz-checksum-crc32: AAAAAA==")
    if rng.random() < 0.5:
        lines.append("Transfer-Encoding: chunked")
        out = b""
        rest = body
        while rest:
            n = rng.randint(1, max(1, len(rest)))
            ext = b";x=y" if rng.random() < 0.2 else b""
            out += b"%x%s\r\n%s\r\n" % (n, ext, rest[:n])
            rest = rest[n:]
        out += b"0\r\n" + (b"t: 1\r\n" if rng.random() < 0.3 else b"") + b"\r\n"
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + out, body
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body, body


def mutate(rng: random.Random, whole: bytes) -> bytes:
    data = bytearray(whole)
    for _ in range(rng.randint(1, 8)):
        kind = rng.random()
        if kind < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind < 0.6 and data:
            del data[rng.randrange(len(data)) :]
        elif kind < 0.8:
            at = rng.randrange(len(data) + 1)
            data[at:at] = rng.choice([b"\r\n", b"\n\n", b":", b"ffffffffffffffff\r\n", b"\x00"])
        else:
            data += b"X-Big: " + b"a" * rng.choice([1000, 70_000])
    return bytes(data)


def splits(rng: random.Random, data: bytes) -> list[bytes]:
    if len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 20))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def fuzz_parser(http: Any) -> None:
    rng = random.Random(28)
    for size in range(0, 600):  # the carry-less CRC32 reads 16 bytes at a time: no overread
        data = rng.randbytes(size)
        assert http.crc32(data) == zlib.crc32(data), size
    for _ in range(EXAMPLES):
        whole, body = response(rng)
        expected = http.parse([whole], -1, -1, True)
        assert expected[0] == 0 and expected[2] == 1 and expected[4] == body, expected[:3]
        assert http.parse(splits(rng, whole), -1, -1, True) == expected
        bad = mutate(rng, whole)
        http.parse(splits(rng, bad), rng.choice([-1, len(body)]), rng.choice([-1, 5]), True)
    print(f"parser: {EXAMPLES} examples agreed")


def drain(engine: Any, count: int, least: int = 1, hold: float = 0.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got += engine.wait(0.1, least, hold)
        if len(got) >= count:
            return got
    raise AssertionError(f"{len(got)} of {count} completed")


def exercise_engine(http: Any) -> None:
    rng = random.Random(7)
    bodies = [rng.randbytes(rng.randint(0, 200_000)) for _ in range(30)]

    def script(request: str, conn: int, n: int) -> list[bytes]:
        index = int(request.split()[1].rsplit("/", 1)[1])
        whole = ok(bodies[index])
        if index % 7 == 3:
            return [whole[:10], whole[10:], CLOSE]
        if index % 11 == 5:
            return [b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n"]
        return [whole]

    with tempfile.TemporaryDirectory() as tmp, Server(script) as server:
        engine = http.Engine("127.0.0.1", server.port, 4, 5.0, 5.0, "us-east-1")
        engine.set_credentials("AKID", "SECRET", "TOKEN")
        fds = [os.open(Path(tmp) / str(i), os.O_RDWR | os.O_CREAT, 0o600) for i in range(30)]
        engine.set_limit(2)  # the rest queued, and raised halfway: the queue's paths too
        for i, body in enumerate(bodies):
            engine.submit(i, "h", f"/b/{i}", fds[i], 0, len(body), len(body))
            if i == 15:
                engine.set_limit(4)
        # gathered: batches of 4, the last ones after their hold
        for tag, status, err, written, *_ in drain(engine, 30, 4, 0.002):
            if status == 200:
                assert (err, written) == (0, len(bodies[tag])), (tag, err, written)
                assert os.pread(fds[tag], written + 1, 0) == bodies[tag]
            else:
                assert status == 503, status
        engine.close()
        for fd in fds:
            os.close(fd)

    with tempfile.TemporaryDirectory() as tmp, Server(lambda *_: [HANG]) as server:
        fd = os.open(Path(tmp) / "x", os.O_RDWR | os.O_CREAT, 0o600)
        engine = http.Engine("127.0.0.1", server.port, 2, 5.0, 0.2, "us-east-1")
        engine.set_credentials("AKID", "SECRET", None)
        for i in range(4):
            engine.submit(i, "h", "/b/k", fd, 0, 10, 10)
        errs = sorted(c[2] for c in drain(engine, 2))  # two time out; two were queued behind
        assert errno.ETIMEDOUT in errs, errs
        engine.cancel_all()
        engine.submit(9, "h", "/b/k", fd, 0, 10, 10)
        engine.close()  # what is left completes with ECANCELED
        engine.wait(0)
        del engine
        os.close(fd)
    print("engine: examples agreed")


def main() -> None:
    http = load(sys.argv[1])
    address = choice.crc32c_address()
    assert address is not None
    http.set_crc32c(address)
    fuzz_parser(http)
    exercise_engine(http)


if __name__ == "__main__":
    main()
