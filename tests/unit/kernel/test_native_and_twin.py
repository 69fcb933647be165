"""The C kernel (``prefetchd.kernel._native``) gives the same bytes as its pure-Python twin
(``prefetchd.kernel.twin``) for every operation, including the errors on bad input."""

from __future__ import annotations

import os
import random
from array import array
from pathlib import Path
from typing import Any

import pytest

from prefetchd.kernel import choice, twin
from prefetchd.kernel.framing import FramingError, frame

native = pytest.importorskip("prefetchd.kernel._native")
if choice.crc32c_address() is None:
    pytest.skip("no libcrc32c for the C kernel", allow_module_level=True)
native.set_crc32c(choice.crc32c_address())

rng = random.Random(20260601)
KEY = b"logs/part-0.jsonl"


def same(a: Any, b: Any) -> None:
    """Two results equal, comparing buffers (bytes, array) by their bytes."""
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif isinstance(a, array | bytes | memoryview):
        assert bytes(a) == bytes(b)
    else:
        assert a == b


def text(lines: int) -> bytes:
    choices = [b"", b"\r", b" ", b"x" * 200, b'{"a": 1}', "ü".encode(), b"\r\r", b"a\rb"]
    return b"\n".join(rng.choice(choices) + b"%d" % rng.randrange(10) for _ in range(lines))


@pytest.mark.parametrize(
    "buf",
    [b"", b"\n", b"\n\n\r\n", b"no newline", b"a\r\nb\r\n", b"\r", text(500), text(3) + b"\n"],
)
@pytest.mark.parametrize("final", [False, True])
def test_frame_lines(buf: bytes, final: bool) -> None:
    same(twin.frame_lines(buf, KEY, 7, final), native.frame_lines(buf, KEY, 7, final))


def test_frame_lines_with_large_line_numbers_and_keys() -> None:
    buf = text(50)
    for first in (1, 127, 128, 2**31, 2**62):
        key = "k" * rng.choice([0, 1, 127, 128, 20000])
        same(
            twin.frame_lines(buf, key.encode(), first, True),
            native.frame_lines(buf, key.encode(), first, True),
        )


def test_frame_records_and_examples() -> None:
    payloads = [b"", b"a", rng.randbytes(300), rng.randbytes(70000)]
    same(twin.frame_records(payloads), native.frame_records(payloads))
    samples: list[list[tuple[bytes, bytes | int]]] = [
        [(b"data", rng.randbytes(1000)), (b"key", b"k")],
        [(b"a", -1), (b"b", 2**63 - 1), (b"c", -(2**63)), (b"d", 0)],
        [],
        [("ü".encode(), b"")],
    ]
    same(twin.frame_examples(samples), native.frame_examples(samples))


@pytest.mark.parametrize("bad", [2**63, True, 1.5, "text"])
def test_frame_examples_rejects_what_encode_example_rejects(bad: object) -> None:
    sample = [[(b"x", bad)]]
    with pytest.raises((TypeError, ValueError)) as python_error:
        twin.frame_examples(sample)  # type: ignore[arg-type]
    with pytest.raises(python_error.type):
        native.frame_examples(sample)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384, 200_000, 3 * 1024 * 1024])
@pytest.mark.parametrize("where", ["first", "last", "middle"])
def test_frame_file_example_is_frame_examples_with_the_file_read_into_it(
    tmp_path: Path, size: int, where: str
) -> None:
    content = rng.randbytes(size)
    path = tmp_path / "object"
    path.write_bytes(content)
    others: list[tuple[bytes, bytes | int | None]] = [(b"b", 7), (b"c", b"x" * 200)]
    at = {"first": 0, "middle": 1, "last": 2}[where]
    sample: list[tuple[bytes, bytes | int | None]] = [*others]
    sample.insert(at, (b"a" if at == 0 else b"bb" if at == 1 else b"d", None))
    filled: list[tuple[bytes, bytes | int]] = [
        (name, content if value is None else value) for name, value in sample
    ]
    expected = twin.frame_examples([filled])
    fd = os.open(path, os.O_RDONLY)
    try:
        same(native.frame_file_example(sample, fd, size), expected)
        same(twin.frame_file_example(sample, fd, size), expected)
    finally:
        os.close(fd)


def test_frame_file_example_gives_none_unless_the_file_holds_exactly_size_bytes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "object"
    path.write_bytes(b"0123456789")
    sample: list[tuple[bytes, bytes | int | None]] = [(b"data", None), (b"key", b"k")]
    fd = os.open(path, os.O_RDONLY)
    try:
        for size in (0, 9, 11, 100):  # the file grew, or shrank, since its size was taken
            assert native.frame_file_example(sample, fd, size) is None
            assert twin.frame_file_example(sample, fd, size) is None
    finally:
        os.close(fd)


def read_calls(io: int) -> int:
    """This process's read syscalls so far (``read``, ``pread64``...), from ``/proc/self/io``
    open at ``io``: one read, counted in the next answer."""
    for line in os.pread(io, 4096, 0).decode().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    raise AssertionError("no syscr in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="no per-task I/O accounting")
def test_frame_file_example_reads_a_file_in_one_call(tmp_path: Path) -> None:
    """A small raw object costs the writer one read: the call that asks for one byte more
    than its size finds its end (a regular file's read is short only there), no second read
    of one byte to probe it; a file that grew is still found by that byte."""
    path = tmp_path / "object"
    path.write_bytes(rng.randbytes(150_000))
    sample: list[tuple[bytes, bytes | int | None]] = [(b"data", None), (b"key", b"k")]
    fd, io = os.open(path, os.O_RDONLY), os.open("/proc/self/io", os.O_RDONLY)
    try:
        for impl in (native, twin):
            before = read_calls(io)
            assert impl.frame_file_example(sample, fd, 150_000) is not None
            assert read_calls(io) - before == 1 + 1, impl.__name__  # and the first look's
            assert impl.frame_file_example(sample, fd, 149_999) is None  # it grew
    finally:
        os.close(fd)
        os.close(io)


@pytest.mark.parametrize(
    "sample", [[(b"data", b"x")], [(b"a", None), (b"b", None)], [(b"a", None), (b"b", 1.5)]]
)
def test_frame_file_example_rejects_what_is_not_one_file_value(sample: Any, tmp_path: Path) -> None:
    path = tmp_path / "object"
    path.write_bytes(b"abc")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(TypeError):
            twin.frame_file_example(sample, fd, 3)
        with pytest.raises(TypeError):
            native.frame_file_example(sample, fd, 3)
    finally:
        os.close(fd)


def test_frame_file_example_raises_the_os_error_of_the_read() -> None:
    sample: list[tuple[bytes, bytes | int | None]] = [(b"data", None)]
    with pytest.raises(OSError):
        twin.frame_file_example(sample, 987654, 3)
    with pytest.raises(OSError):
        native.frame_file_example(sample, 987654, 3)


def tfrecord_file(path: Path, sizes: list[int]) -> Path:
    path.write_bytes(b"".join(frame(rng.randbytes(n)) for n in sizes))
    return path


def test_index_and_read_frames(tmp_path: Path) -> None:
    path = tfrecord_file(tmp_path / "f", [rng.choice([0, 5, 5000, 70000]) for _ in range(300)])
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        offsets = native.index_file(fd, size)
        assert offsets == twin.index_file(fd, size)
        order, _ = native.permutation(300, 5)
        for start, max_bytes in ((0, 1), (0, 10**9), (17, 100_000), (299, 1)):
            same(
                twin.read_frames(fd, size, offsets, order, start, max_bytes),
                native.read_frames(fd, size, offsets, order, start, max_bytes),
            )
    finally:
        os.close(fd)


@pytest.mark.parametrize("damage", ["flip-data", "flip-length", "truncate", "garbage"])
def test_both_kernels_report_the_same_framing_error(tmp_path: Path, damage: str) -> None:
    data = bytearray(b"".join(frame(b"%05d" % i) for i in range(100)))
    if damage == "flip-data":
        data[len(data) // 2] ^= 0x01
    elif damage == "flip-length":
        data[len(frame(b"00000")) * 3] ^= 0x01
    elif damage == "truncate":
        del data[-2:]
    else:
        data += b"\x00" * 5
    path = tmp_path / "f"
    path.write_bytes(bytes(data))
    errors = []
    for impl in (twin, native):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            offsets = impl.index_file(fd, size)
            order = array("I", range(len(offsets) // 8)).tobytes()
            impl.read_frames(fd, size, offsets, order, 0, 10**9)
        except ValueError as exc:
            errors.append(choice.framing_error(exc))
        finally:
            os.close(fd)
    assert len(errors) == 2 and all(isinstance(e, FramingError) for e in errors)
    assert (errors[0].offset, errors[0].reason) == (errors[1].offset, errors[1].reason)


def check_file_result(impl: Any, path: Path) -> tuple[int, str] | None:
    """What ``impl.check_file`` says of the file: None (all good) or (offset, reason)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        impl.check_file(fd, os.fstat(fd).st_size)
    except ValueError as exc:
        error = choice.framing_error(exc)
        return error.offset, error.reason
    finally:
        os.close(fd)
    return None


MiB = 1024 * 1024
# Records around the C kernel's 1 MiB read: frames straddle its chunks, one spans several.
CHECK_SIZES = [0, 5, 70000, MiB - 20, MiB, 3 * MiB + 7, 12, 0, 999_999]


def checked_file(damage: str) -> bytes:
    data = bytearray(b"".join(frame(rng.randbytes(n)) for n in CHECK_SIZES))
    second = len(frame(b"")) + len(frame(b"x" * 5))  # the third frame (70000 bytes) starts here
    if damage == "flip-data-far":  # in the 3 MiB record, past the first chunk
        data[second + 70016 + MiB - 4 + 16 + MiB + 2 * MiB] ^= 0x10
    elif damage == "flip-data":
        data[second + 100] ^= 0x01
    elif damage == "flip-length":
        data[second + 2] ^= 0x01
    elif damage == "flip-footer":
        data[second + 70000 + 12 + 1] ^= 0x80
    elif damage == "truncate-data":
        del data[-100:]
    elif damage == "truncate-footer":
        del data[-2:]
    elif damage in ("garbage-5", "garbage-13"):
        data += b"\x00" * int(damage.split("-")[1])
    elif damage == "garbage-header":  # a valid header promising more than there is
        data += frame(b"y" * 1000)[:40]
    return bytes(data)


@pytest.mark.parametrize(
    "damage",
    [
        "none",
        "flip-data",
        "flip-data-far",
        "flip-length",
        "flip-footer",
        "truncate-data",
        "truncate-footer",
        "garbage-5",
        "garbage-13",
        "garbage-header",
    ],
)
def test_both_kernels_check_a_whole_file_alike(tmp_path: Path, damage: str) -> None:
    """The downloader's check of a TFRecord object (every frame's CRCs, in file order): both
    cores find the same first fault, at the same offset, with the same reason, across the C
    kernel's 1 MiB reads; an intact file passes both."""
    path = tmp_path / "f"
    path.write_bytes(checked_file(damage))
    found = check_file_result(twin, path)
    assert found == check_file_result(native, path)
    assert (found is None) == (damage == "none"), found


def test_check_file_of_an_empty_file_passes_and_of_a_stub_fails(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"")
    assert check_file_result(native, path) is None is check_file_result(twin, path)
    path.write_bytes(b"\x01")
    assert check_file_result(native, path) == (0, "truncated record header")
    assert check_file_result(twin, path) == (0, "truncated record header")


def batch(n: int) -> tuple[bytes, bytes]:
    framed: tuple[bytes, bytes] = native.frame_records(
        [rng.randbytes(rng.randrange(0, 200)) for _ in range(n)]
    )
    return framed


def test_take_across_parts() -> None:
    a, b = batch(40), batch(25)
    parts = [(a[0], a[1], 3, 40), (b[0], b[1], 0, 10), (a[0], a[1], 0, 0)]
    order, _ = native.permutation(47, 11)
    for start, stop in ((0, 47), (5, 20), (9, 9)):
        same(twin.take(parts, order, start, stop), native.take(parts, order, start, stop))
    with pytest.raises(IndexError):
        native.take([(a[0], a[1], 0, 41)], order, 0, 1)
    with pytest.raises(IndexError):
        native.take([(a[0], a[1], 0, 2)], order, 0, 47)


def test_interleave_stops_at_limit_and_at_an_empty_source() -> None:
    sources = [batch(30), batch(5), batch(60)]
    picks, _ = native.picks(3, 200, 9)
    for start, limit in ((0, 10**9), (0, 1), (10, 2000), (199, 10**9)):
        cursors = [array("Q", [0, 2, 7]) for _ in range(2)]
        got = [
            impl.interleave(sources, c, picks, start, limit)
            for impl, c in zip((twin, native), cursors, strict=True)
        ]
        same(got[0], got[1])
        assert cursors[0] == cursors[1]


def test_seeded_draws_are_the_same_in_both() -> None:
    for n, state in ((0, 1), (1, 2), (2, 3), (1000, 2**64 - 1)):
        same(twin.permutation(n, state), native.permutation(n, state))
    for n, k, state in ((1, 5, 0), (8, 10000, 42), (3, 0, 7)):
        same(twin.picks(n, k, state), native.picks(n, k, state))
    perm, _ = native.permutation(1000, 1)
    assert sorted(memoryview(perm).cast("I")) == list(range(1000))


def draw_by_source(
    impl: Any, groups: list[int], rates: list[int], credits: list[int], k: int
) -> Any:
    c = array("q", credits)
    picks, state = impl.source_picks(
        array("I", groups).tobytes(), array("Q", rates).tobytes(), c, k, 77
    )
    return list(memoryview(picks).cast("I")), state, list(c)


def test_draws_by_source_are_the_same_in_both() -> None:
    rng = random.Random(5)
    for _ in range(50):
        sources = rng.randint(1, 4)
        groups = [rng.randrange(sources) for _ in range(rng.randint(1, 40))]
        rates = [rng.randint(1, 2**32) for _ in range(sources)]
        credits = [rng.randint(-(2**33), 2**33) for _ in range(sources)]
        k = rng.randint(0, 500)
        assert draw_by_source(twin, groups, rates, credits, k) == draw_by_source(
            native, groups, rates, credits, k
        )


@pytest.mark.parametrize("impl", [twin, native])
def test_a_draw_by_source_gives_each_source_its_rate_in_any_window(impl: Any) -> None:
    """Sources 0, 1, 2 at 85, 11 and 4 % (source 1's only slot is 3; source 3 has no slot,
    so earns nothing): in every window of 100 draws each present source is within 2 draws of
    its rate, and a source's slots share its draws."""
    groups = [0, 0, 2, 1, 0, 2, 0]
    rates = [85 << 20, 11 << 20, 4 << 20, 50 << 20]
    picks, _, credits = draw_by_source(impl, groups, rates, [0, 0, 0, 0], 20000)
    sources = [groups[p] for p in picks]
    for start in range(0, len(sources) - 100, 37):
        window = sources[start : start + 100]
        for source, share in ((0, 85), (1, 11), (2, 4)):
            assert abs(window.count(source) - share) <= 2, (start, source)
    assert credits[3] == 0
    by_slot = [picks.count(i) for i in range(len(groups))]
    assert by_slot[3] == sources.count(1)
    assert min(by_slot[i] for i in (0, 1, 4, 6)) > 0.2 * 17000 / 4


def test_a_draw_by_source_refuses_what_it_cannot_draw_from() -> None:
    for impl in (twin, native):
        with pytest.raises(ValueError):
            draw_by_source(impl, [], [1], [0], 3)  # no slot
        with pytest.raises(ValueError):
            draw_by_source(impl, [0], [1, 1], [0], 3)  # not one credit per rate
        with pytest.raises(IndexError):
            draw_by_source(impl, [0, 2], [1, 1], [0, 0], 3)  # a slot of no source
        with pytest.raises(ValueError):
            draw_by_source(impl, [0], [0, 5], [0, 0], 3)  # the sources present have rate 0


def test_masked_crc_is_tensorflows() -> None:
    from prefetchd.kernel.framing import masked_crc

    for data in (b"", b"123456789", rng.randbytes(100_000)):
        assert native.masked_crc(data) == masked_crc(data)
