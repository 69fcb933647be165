"""The differential fuzz of the C record kernel, run by ``test_sanitized_fuzz.py`` in a process
of its own: ``python fuzz_kernel.py PATH_OF_THE_SANITIZED_MODULE [EXAMPLES]``.

That module is ``_native.c`` built with AddressSanitizer and UndefinedBehaviorSanitizer; this
process runs with ``libasan`` preloaded and ``PYTHONMALLOC=malloc`` (so every Python buffer is
a malloc block with a red zone after it). Hypothesis draws tar streams (random blocks, made-up
headers with every number form and type flag, real tars mutated with their checksums fixed),
TFRecord files (valid, truncated, corrupted lengths and CRCs, lengths that pass their CRC),
text for ``frame_lines`` and the writers' draws by source (``source_picks``); each call goes to
the sanitized C module and to the Python twin, which must return the same (buffers compared by
their bytes) or raise the same exception class
(framing faults: the same offset and reason). The C side gets its input in a buffer allocated
to its exact size, so a read one byte past the end is a sanitizer report, not a read of a
``bytes`` object's trailing NUL. Exits 0 when every example agreed; a sanitizer report
ends the process with its own non-zero status.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import os
import sys
import tarfile
import tempfile
from array import array
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefetchd.kernel import choice, twin
from prefetchd.kernel.framing import frame, frame_header

EXAMPLES = int(sys.argv[2]) if len(sys.argv) > 2 else 500
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same inputs on every run: a CI failure reproduces
    database=None,
    suppress_health_check=list(HealthCheck),
)
BLOCK = 512


def load(path: str) -> Any:
    """The sanitized module at ``path`` (its init function is ``PyInit__native``)."""
    spec = importlib.util.spec_from_file_location("_native", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__file__ == path
    return module


if not hasattr(ctypes.CDLL(None), "__asan_init"):
    sys.exit("AddressSanitizer is not loaded in this process (LD_PRELOAD libasan)")
if os.environ.get("PYTHONMALLOC") != "malloc":
    sys.exit("PYTHONMALLOC=malloc is not set: buffers would not have red zones")
C = load(sys.argv[1])
ADDRESS = choice.crc32c_address()
if ADDRESS is None:
    sys.exit("no libcrc32c to give the C kernel")
C.set_crc32c(ADDRESS)


def exact(data: bytes) -> array[int] | bytes:
    """``data`` in a malloc block of exactly its size: ``bytes`` carries a NUL after its end,
    an array made from ``data`` has room to grow; a repeated array does not. (Empty data stays
    ``bytes``: an empty array's buffer is NULL, which no caller passes.)"""
    if not data:
        return data
    buffer = array("B", b"\0") * len(data)
    memoryview(buffer)[:] = data
    return buffer


def plain(value: Any) -> Any:
    """A result with its buffers as ``bytes``, to compare the two kernels' results."""
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, array | bytes | bytearray | memoryview):
        return bytes(value)
    return value


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """What ``call`` gave: ``("ok", result)``, or the exception's class (a framing fault with
    its offset and reason)."""
    try:
        return "ok", plain(call())
    except ValueError as exc:
        try:
            fault = choice.framing_error(exc)
        except ValueError:
            return type(exc).__name__, None
        return "FramingError", (fault.offset, fault.reason)
    except Exception as exc:
        return type(exc).__name__, None


def agree(name: str, python: tuple[Any, ...], native: tuple[Any, ...]) -> None:
    """``twin.<name>(*python)`` and ``C.<name>(*native)`` give the same outcome."""
    want = outcome(lambda: getattr(twin, name)(*python))
    got = outcome(lambda: getattr(C, name)(*native))
    if want != got:
        raise AssertionError(f"{name} differs on {python!r}:\n twin: {want!r}\n    C: {got!r}")


# --- tar ------------------------------------------------------------------------------------


def checksum(header: bytearray, signed: bool = False) -> None:
    """Write the header's checksum field as tarfile writes it (or the signed sum)."""
    header[148:156] = b" " * 8
    total = sum(memoryview(header).cast("b")) if signed else sum(header)
    header[148:156] = b"%06o\0 " % (total & 0o777777)


NUMBERS = st.one_of(
    st.integers(0, 5000).map(lambda n: b"%011o\0" % n),
    st.integers(0, 5000).map(lambda n: b"%o" % n + b"\0" * 3),
    st.integers(0, 700).map(lambda n: b"  %o  \0" % n),
    st.integers(0, 2**64).map(lambda n: b"\x80" + n.to_bytes(11, "big")),
    st.binary(min_size=11, max_size=11).map(lambda b: b"\x80" + b),
    st.binary(min_size=1, max_size=12),
    st.sampled_from([b"", b" ", b"\0", b"8", b"-1", b"0 1", b"\xff" * 12, b"7" * 12]),
)
NAMES = st.one_of(
    st.sampled_from(
        [b"a/b.jpg", b"a/b.cls", b"x.txt", b"noext", b".hidden", b"dir/", b"a.b.c", b"k.key"]
    ),
    st.tuples(
        st.sampled_from([b"s1", b"s2", b"d/s1"]), st.sampled_from([b"jpg", b"cls", b"\xff"])
    ).map(lambda p: p[0] + b"." + p[1]),
    st.binary(max_size=100),
)
TYPES = st.sampled_from([*b"0\x0012345677xgLKSVM", 0x41, 0xFF]).map(lambda t: bytes([t]))


@st.composite
def made_up_member(draw: st.DrawFn) -> bytes:
    """One header with drawn fields and a valid (or drawn) checksum, then some data."""
    header = bytearray(BLOCK)
    name = draw(NAMES)[:100]
    header[: len(name)] = name
    for at, n in ((100, 8), (108, 8), (116, 8), (136, 12), (329, 8), (337, 8)):
        if draw(st.booleans()):
            value = draw(NUMBERS)[:n]
            header[at : at + len(value)] = value
    size = draw(st.sampled_from([0, 1, 100, 511, 512, 513, 1500]))
    header[124:136] = draw(st.one_of(st.just(b"%011o\0" % size), NUMBERS))[:12].ljust(12, b"\0")
    header[156:157] = draw(TYPES)
    header[257:265] = draw(st.sampled_from([b"ustar\x0000", b"ustar  \0", bytes(8)]))
    if draw(st.booleans()):
        prefix = draw(st.binary(max_size=155))
        header[345 : 345 + len(prefix)] = prefix
    mode = draw(st.sampled_from(["unsigned", "signed", "random"]))
    if mode == "random":
        header[148:156] = draw(NUMBERS)[:8].ljust(8, b"\0")
    else:
        checksum(header, signed=mode == "signed")
    data = draw(st.binary(max_size=64)) * (size // 64 + 1)
    return bytes(header) + data[:size].ljust(-(-size // BLOCK) * BLOCK, b"\0")


@st.composite
def real_tar(draw: st.DrawFn) -> bytes:
    """A tar ``tarfile`` writes (ustar, GNU or pax; long names, links, directories)."""
    out = io.BytesIO()
    fmt = draw(st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for _ in range(draw(st.integers(0, 6))):
            base = draw(st.sampled_from(["s1", "s2", "dir/s3", "x" * 120 + "/s4", "ü"]))
            ext = draw(st.sampled_from(["jpg", "cls", "json", "tar.gz", "", "key"]))
            info = tarfile.TarInfo(f"{base}.{ext}" if ext else base)
            kind = draw(st.sampled_from([tarfile.REGTYPE] * 4 + [tarfile.DIRTYPE, tarfile.SYMTYPE]))
            info.type = kind
            data = draw(st.binary(max_size=1200)) if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            with contextlib.suppress(ValueError):  # a name this format cannot hold
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@st.composite
def mutated(draw: st.DrawFn, tar: bytes) -> bytes:
    """``tar`` with a few bytes changed; a changed header's checksum fixed (so the reader gets
    past it to the fields), or not."""
    data = bytearray(tar)
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
        if draw(st.booleans()):
            start = at - at % BLOCK
            if start + BLOCK <= len(data) and at % BLOCK != 148:
                header = data[start : start + BLOCK]
                checksum(header)
                data[start : start + BLOCK] = header
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


TARS = st.one_of(
    st.binary(max_size=3 * BLOCK),
    st.lists(made_up_member(), max_size=5).map(b"".join),
    st.lists(made_up_member(), max_size=4).map(lambda m: b"".join(m) + bytes(2 * BLOCK)),
    real_tar(),
    real_tar().flatmap(mutated),
)


@FUZZ
@given(TARS, st.data())
def fuzz_tar(buf: bytes, data: st.DataObject) -> None:
    # the whole stream, a cut anywhere, and one beside a block boundary (a short header)
    block = data.draw(st.integers(0, len(buf) // BLOCK))
    near = block * BLOCK + data.draw(st.sampled_from([-1, 1]))
    for cut in {len(buf), data.draw(st.integers(0, len(buf))), min(max(near, 0), len(buf))}:
        part = buf[:cut]
        for final in (False, True):
            for at_start in (False, True):
                for name in ("frame_tar", "check_tar"):
                    agree(name, (part, final, at_start), (exact(part), final, at_start))


# --- TFRecord files -------------------------------------------------------------------------


@st.composite
def tfrecord_file(draw: st.DrawFn) -> bytes:
    payloads = draw(st.lists(st.binary(max_size=300), max_size=8))
    data = bytearray(b"".join(frame(p) for p in payloads))
    for _ in range(draw(st.integers(0, 3))):
        damage = draw(st.sampled_from(["flip", "length", "truncate", "garbage", "huge"]))
        if damage == "flip" and data:
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif damage == "length" and data:  # a length that passes its CRC, at a frame start
            at = draw(st.sampled_from(frame_starts(payloads)))
            length = draw(st.one_of(st.integers(0, 400), st.integers(0, 2**64 - 1)))
            data[at : at + 12] = frame_header(length)
        elif damage == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif damage == "garbage":
            data += draw(st.binary(max_size=30))
        elif damage == "huge":
            data += frame_header(draw(st.integers(2**40, 2**64 - 1)))
    return bytes(data)


def frame_starts(payloads: list[bytes]) -> list[int]:
    starts, at = [], 0
    for p in payloads:
        starts.append(at)
        at += len(p) + 16
    return starts or [0]


@FUZZ
@given(tfrecord_file(), st.binary(max_size=8), st.integers(1, 2000))
def fuzz_tfrecord(content: bytes, changed: bytes, max_bytes: int) -> None:
    with tempfile.TemporaryFile() as f:
        f.write(content)
        f.flush()
        fd, size = f.fileno(), len(content)
        agree("index_file", (fd, size), (fd, size))
        agree("check_file", (fd, size), (fd, size))
        try:
            offsets = twin.index_file(fd, size)
        except ValueError:
            return
        count = len(offsets) // 8
        order, _ = twin.permutation(count, len(content))
        # the file as indexed, then changed under the reader (bytes overwritten, or cut short)
        if changed:
            os.pwrite(fd, changed, len(content) * changed[0] // 256)
        if len(changed) % 2:
            os.ftruncate(fd, len(content) * changed[-1] // 256)
        for start in sorted({0, count // 2, count - 1}):
            if 0 <= start < count:
                agree(
                    "read_frames",
                    (fd, size, offsets, order, start, max_bytes),
                    (fd, size, exact(offsets), exact(order), start, max_bytes),
                )


# --- lines ----------------------------------------------------------------------------------

TEXT = st.lists(
    st.sampled_from([b"\n", b"\r", b"\r\n", b"a", b"xyz", "ü".encode(), b"\xff", b" ", b"\0"]),
    max_size=200,
).map(b"".join)


@FUZZ
@given(
    st.one_of(TEXT, st.binary(max_size=600)),
    st.binary(max_size=40),
    st.one_of(st.integers(0, 1000), st.integers(0, 2**63 - 10**6)),
    st.booleans(),
)
def fuzz_lines(buf: bytes, key: bytes, first: int, final: bool) -> None:
    agree("frame_lines", (buf, key, first, final), (exact(buf), exact(key), first, final))


# --- the writers' draw by source ------------------------------------------------------------


def exact_credits(values: list[int]) -> array[int]:
    """int64 credits in a malloc block of exactly their size (see ``exact``)."""
    buffer = array("q", [0]) * len(values)
    for i, value in enumerate(values):
        buffer[i] = value
    return buffer


@FUZZ
@given(
    st.lists(st.integers(0, 5), max_size=70),
    st.lists(st.integers(0, 2**34), max_size=5),
    st.integers(0, 300),
    st.integers(0, 2**64 - 1),
    st.data(),
)
def fuzz_source_picks(
    groups: list[int], rates: list[int], k: int, state: int, data: st.DataObject
) -> None:
    """Slots of sources that exist or not, rates of 0 or not, credits one per rate or not:
    the same draws, credits and errors from both (the credits are moved in place)."""
    size = data.draw(st.sampled_from([len(rates), len(rates), max(0, len(rates) - 1)]))
    credits = data.draw(st.lists(st.integers(-(2**40), 2**40), min_size=size, max_size=size))
    slots, weights = array("I", groups).tobytes(), array("Q", rates).tobytes()

    def run(impl: Any, native: bool) -> tuple[Any, bytes]:
        moved = exact_credits(credits)
        buffers = (exact(slots), exact(weights)) if native else (slots, weights)
        return impl.source_picks(*buffers, moved, k, state), bytes(moved)

    want, got = outcome(lambda: run(twin, False)), outcome(lambda: run(C, True))
    if want != got:
        raise AssertionError(f"source_picks differs:\n twin: {want!r}\n    C: {got!r}")


if __name__ == "__main__":
    for fuzz in (fuzz_tar, fuzz_tfrecord, fuzz_lines, fuzz_source_picks):
        fuzz()
        print(f"{fuzz.__name__}: {EXAMPLES} examples agreed", flush=True)
