"""The fast ``tar`` reader (``frame_tar`` in the C kernel and its Python twin) gives exactly the
Examples, in the same order, and the same error, as the reference reader (Python's ``tarfile``)
for every tar: WebDataset-style, odd and damaged ones; and where it gives up, the reference
reader carries on from the sample it stopped at."""

from __future__ import annotations

import gzip
import io
import random
import tarfile
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import zstandard

from prefetchd.kernel import choice, twin
from prefetchd.write.formats import tar as tarfmt
from prefetchd.write.formats.tar import TarFormat, tarfile_records
from prefetchd.write.frames import Frames
from testkit import sample_data

IMPLS: list[ModuleType] = [twin]
try:
    from prefetchd.kernel import _native
except ImportError:
    pass
else:
    if (address := choice.crc32c_address()) is not None:
        _native.set_crc32c(address)
        IMPLS.append(_native)

BLOCK = 512
Outcome = tuple[list[bytes], tuple[str, str] | None]


# --- tars, written header by header -----------------------------------------------------------


def header(
    name: bytes,
    size: int,
    kind: bytes = b"0",
    *,
    prefix: bytes = b"",
    size_field: bytes | None = None,
    mode: bytes = b"0000644\0",
    checksum: int | None = None,
) -> bytes:
    """A ustar header, its checksum right unless ``checksum`` says otherwise."""
    h = bytearray(BLOCK)
    h[0 : len(name)] = name
    h[100:108] = mode
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = size_field if size_field is not None else b"%011o\0" % size
    h[136:148] = b"14000000000\0"
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    h[345 : 345 + len(prefix)] = prefix
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % (sum(h) if checksum is None else checksum)
    return bytes(h)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def member(name: bytes, data: bytes, kind: bytes = b"0", **fields: Any) -> bytes:
    return header(name, len(data), kind, **fields) + padded(data)


END = bytes(2 * BLOCK)
NAMES = ["s{i}", "dir/s{i}", "a.b/s{i}", "//s{i}", "a//b/s{i}", "d/ü{i}", "d/\udcff{i}"]
EXTS = ["jpg", "cls", "json", "seg.png", "tar.gz", "ü.txt"]
SIZES = [0, 1, 100, 511, 512, 513, 1024, 5000, 70_000]


def random_member(rng: random.Random, i: int) -> bytes:
    """A member that is not a sample file, now and then."""
    choice = rng.randrange(8)
    if choice == 0:
        return member(b"dir%d/" % i, b"", b"5")
    if choice == 1:
        return header(b"link%d.jpg" % i, rng.choice([0, 700]), b"2")  # no data follows
    if choice == 2:
        return member(b"NOTES%d" % i, rng.randbytes(rng.choice(SIZES)))
    if choice == 3:
        return member(b"d/.hidden%d" % i, b"x")
    if choice == 4:
        return header(b"v7dir%d/" % i, 0, b"\0")
    if choice == 5:
        return member(b"x%d." % i, b"trailing dot")
    if choice == 6:
        return member(b"hard%d.jpg" % i, b"", b"1")
    return member(b"old%d.bin" % i, rng.randbytes(rng.choice(SIZES)), b"\0")


def random_tar(rng: random.Random, ascii_only: bool = False) -> bytes:
    """Samples of 1-4 members (adjacent, as WebDataset writes them) and stray members."""
    parts = []
    names = NAMES[:5] if ascii_only else NAMES
    exts = EXTS[:5] if ascii_only else EXTS
    for i in range(rng.randrange(0, 25)):
        base = rng.choice(names).format(i=i % 7)  # names repeat, though never adjacent
        for ext in rng.sample(exts, rng.randrange(1, 5)):
            name = f"{base}.{ext}".encode("utf-8", "surrogateescape")
            parts.append(member(name, rng.randbytes(rng.choice(SIZES))))
            if rng.random() < 0.1:
                parts.append(random_member(rng, i))
        if rng.random() < 0.2:
            parts.append(random_member(rng, i))
    parts.append(rng.choice([END, b"", bytes(BLOCK), END + b"garbage", bytes(10240)]))
    return b"".join(parts)


def tarfile_tar(members: list[tuple[str, bytes]], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def long_names(rng: random.Random, fmt: int) -> bytes:
    """Names up to ~250 bytes: ustar splits them into prefix + name; GNU writes ``L``
    members, pax ``x`` headers (also for non-ASCII names)."""
    members = []
    for i in range(20):
        directory = "/".join("d" * rng.randrange(1, 60) for _ in range(rng.randrange(1, 4)))
        for ext in ("jpg", "cls"):
            members.append((f"{directory}/sample{i}.{ext}", rng.randbytes(rng.choice(SIZES))))
    if fmt != tarfile.USTAR_FORMAT:
        members.append(("ü/" + "n" * 120 + ".jpg", b"long and not ascii"))
    return tarfile_tar(members, fmt)


# --- the two readers ----------------------------------------------------------------------------


def outcome(records: Callable[[], Iterator[bytes]]) -> Outcome:
    """The records a reader gives, and the error it ends with (type and message)."""
    got: list[bytes] = []
    try:
        for record in records():
            got.append(record)
    except Exception as exc:
        return got, (type(exc).__name__, str(exc))
    return got, None


def write(tmp_path: Path, body: bytes, suffix: str = "") -> tuple[str, str]:
    if suffix == ".gz":
        body = gzip.compress(body, mtime=0)
    elif suffix == ".zst":
        body = zstandard.ZstdCompressor().compress(body)
    path = tmp_path / f"obj{suffix}"
    path.write_bytes(body)
    return f"shards/s.tar{suffix}", str(path)


def frames_outcome(key: str, path: str, limit: int = 64 << 20) -> Outcome:
    def records() -> Iterator[bytes]:
        for frames in TarFormat(limit).frames(key, path):
            yield from frames.payloads()

    return outcome(records)


def check_outcome(key: str, path: str, limit: int = 64 << 20) -> tuple[int, tuple[str, str] | None]:
    """What the writer's read-through (``TarFormat.check``) finds: records passed, error."""
    passed = 0
    try:
        for count in TarFormat(limit).check(key, path):
            passed += count
    except Exception as exc:
        return passed, (type(exc).__name__, str(exc))
    return passed, None


def assert_check_agrees(key: str, path: str, limit: int = 64 << 20) -> None:
    """The read-through raises what framing raises, and passes every record when it does not:
    the same objects are quarantined with the same reason."""
    records, error = frames_outcome(key, path, limit)
    passed, checked = check_outcome(key, path, limit)
    assert checked == error
    assert error is not None or passed == len(records)


def assert_same_as_tarfile(
    monkeypatch: pytest.MonkeyPatch,
    key: str,
    path: str,
    chunks: tuple[int, ...] = (1, 4096),
    intact: list[bytes] | None = None,
) -> Outcome:
    """Both kernels, at several chunk sizes, give what the tarfile reader gives: the same
    Examples, or the same error after a prefix of them (a batch an error cuts short is not
    yielded, as before; ``intact``: the Examples before damage to compressed data, of which
    tarfile loses those its last read had decoded); and the two kernels give the same."""
    want = outcome(lambda: tarfile_records(key, path))
    intact = want[0] if intact is None else intact
    for chunk in (*chunks, 1024 * 1024):
        monkeypatch.setattr(tarfmt, "BATCH_BYTES", chunk)
        got = []
        for impl in IMPLS:
            monkeypatch.setattr(choice, "KERNEL", impl)
            records, error = frames_outcome(key, path)
            assert_check_agrees(key, path)
            assert error == want[1], (impl.__name__, chunk)
            assert records == intact[: len(records)], (impl.__name__, chunk)
            assert error is not None or len(records) == len(want[0]), (impl.__name__, chunk)
            got.append((records, error))
        assert all(g == got[0] for g in got), chunk
    return want


def fast_only(key: str, path: str) -> bool:
    """Whether the fast reader read the whole object, without tarfile's help."""
    scan = tarfmt._FastScan()
    for _ in scan.frames(key, path):
        pass
    return scan.complete


# --- the same Examples -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_random_tars_give_what_tarfile_gives(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    key, path = write(tmp_path, random_tar(rng, ascii_only=seed % 2 == 0))
    _, error = assert_same_as_tarfile(monkeypatch, key, path, chunks=(1, 700, 4096))
    if seed % 2 == 0:
        assert error is None and fast_only(key, path), "plain ustar stays on the fast path"


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_sample_data_webdataset_tars(
    suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body, ids = sample_data.tar_object(0, 300_000, random.Random(3))
    key, path = write(tmp_path, body, suffix)
    records, error = assert_same_as_tarfile(monkeypatch, key, path, chunks=(1000, 65536))
    assert error is None and len(records) == len(ids)
    assert fast_only(key, path)


@pytest.mark.parametrize(
    "fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=str
)
def test_long_names_through_ustar_prefix_gnu_and_pax(
    fmt: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, path = write(tmp_path, long_names(random.Random(fmt), fmt))
    records, error = assert_same_as_tarfile(monkeypatch, key, path)
    assert error is None and len(records) == 21 - (fmt == tarfile.USTAR_FORMAT)
    assert fast_only(key, path) == (fmt == tarfile.USTAR_FORMAT), "prefix is read, L/x left"


def test_pax_header_midway_hands_over_after_the_samples_framed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clean = b"".join(
        member(b"s%03d.%s" % (i, e), b"%d" % i) for i in range(300) for e in (b"a", b"b")
    )
    rest = tarfile_tar([("tail.jpg", b"1"), ("tail.cls", b"2")], tarfile.PAX_FORMAT)
    pax = tarfile_tar([("ü.jpg", b"x")], tarfile.PAX_FORMAT)[: 4 * BLOCK]  # x header + member
    key, path = write(tmp_path, clean + pax + rest)
    records, error = assert_same_as_tarfile(monkeypatch, key, path)
    assert error is None and len(records) == 302
    scan = tarfmt._FastScan()
    # the last clean sample is still open at the pax header: tarfile's reader yields it
    assert sum(len(f) for f in scan.frames(key, path)) == scan.samples == 299
    assert not scan.complete


def test_base256_and_spaced_number_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"d" * 600
    body = (
        header(b"a.jpg", 600, size_field=b"\x80" + (600).to_bytes(11, "big")) + padded(data)
        + header(b"a.cls", 3, size_field=b"   3     \0\0\0") + padded(b"abc")
        + header(b"b.cls", 0, size_field=b"\0" * 12, mode=b"\x80" + bytes(7))
        + END
    )  # fmt: skip
    key, path = write(tmp_path, body)
    records, error = assert_same_as_tarfile(monkeypatch, key, path)
    assert error is None and len(records) == 2 and fast_only(key, path)


def high_header(name: bytes, size: int, signed: bool, wrong: int = 0) -> bytes:
    """A ustar header with 387 bytes >= 0x80 (name, link name, prefix, user and group names)
    and the checksum tarfile takes: the unsigned byte sum, or the signed one; ``wrong`` off."""
    h = bytearray(header(name, size, prefix=b"\xfe" * 155))
    h[157:257] = b"\xfd" * 100  # the link name: tarfile decodes it, a regular file ignores it
    h[265:297] = h[297:329] = b"\xfc" * 31 + b"\0"
    rest = h[:148] + h[156:]
    unsigned = sum(rest) + 8 * 32
    stored = unsigned - 256 * sum(1 for b in rest if b >= 0x80) if signed else unsigned
    h[148:156] = b"%06o\0 " % (stored + wrong)
    return bytes(h)


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned-sum", "signed-sum"])
def test_checksums_of_headers_full_of_high_bytes(
    signed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tarfile takes the unsigned or the signed byte sum; the C kernel sums eight bytes at a
    time, so hundreds of bytes >= 0x80 in one header must count the same."""
    name = b"\xff" * 96 + b".cls"
    good = high_header(name, 1, signed) + padded(b"1")
    good += high_header(name.replace(b".cls", b".txt"), 1, signed) + padded(b"2")
    key, path = write(tmp_path, good + END)
    records, error = assert_same_as_tarfile(monkeypatch, key, path)
    assert len(records) == 1 and error is None and fast_only(key, path)
    key, path = write(tmp_path, high_header(name, 1, signed, wrong=1) + padded(b"1") + END)
    _, error = assert_same_as_tarfile(monkeypatch, key, path)
    assert error is not None and "checksum" in error[1]


@pytest.mark.parametrize(
    "field",
    [b"+0000001750\0", b"0_1750\0\0\0\0\0\0", b"\t1750\0\0\0\0\0\0\0", b"\xff" * 12, b"9" * 12],
    ids=["plus", "underscore", "tab", "negative", "not-octal"],
)
def test_number_fields_only_tarfile_reads_go_to_tarfile(
    field: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = member(b"a.jpg", b"1") + header(b"b.jpg", 0, size_field=field) + member(b"c.jpg", b"")
    key, path = write(tmp_path, body + END)
    assert_same_as_tarfile(monkeypatch, key, path)
    assert not fast_only(key, path)


# --- the same errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        member(b"a.jpg", b"1") + member(b"a.key", b"2"),
        member(b"a.jpg", b"1") + member(b"a.cls", b"2") + member(b"a.jpg", b"3"),
        member(b"a.jpg", b"1") + member(b"b.\xff", b"2"),
        member(b"a.jpg", b"1") + member(b"b.j\xc3\xbcpg", b"2"),
        b"",
        b"x" * 100,
        bytes(BLOCK),
        header(b"a.jpg", 0, checksum=1) + END,
        member(b"a.jpg", b"1") + header(b"b.jpg", 0, checksum=1) + member(b"c.jpg", b""),
        member(b"a.jpg", b"1") + member(b"BIG", bytes(2 * 1024 * 1024)) + member(b"a.cls", b""),
    ],
    ids=[
        "reserved-key",
        "twice",
        "ext-not-utf8",
        "ext-not-ascii",
        "empty",
        "short",
        "zeros",
        "bad-checksum-first",
        "bad-checksum-later",
        "big-skipped-member",
    ],
)
def test_odd_tars(body: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, path = write(tmp_path, body)
    assert_same_as_tarfile(monkeypatch, key, path)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_every_truncation(suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = (
        member(b"a.jpg", b"x" * 1000) + member(b"a.cls", b"1") + member(b"dir/", b"", b"5")
        + member(b"b.jpg", b"y" * 512) + member(b"NOTES", b"z" * 700) + member(b"c.jpg", b"")
        + END
    )  # fmt: skip
    cuts = sorted({*range(0, len(body), 97), *range(0, len(body), BLOCK), len(body) - 1})
    for cut in cuts:
        key, path = write(tmp_path, body[:cut], suffix)
        assert_same_as_tarfile(monkeypatch, key, path, chunks=(1,))


@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_damaged_gzip_gives_what_it_gave(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body, _ = sample_data.tar_object(0, 200_000, random.Random(5))
    squeezed = bytearray(gzip.compress(body, mtime=0))
    if damage == "cut":
        del squeezed[len(squeezed) // 2 :]
    else:  # deflate may decode it; tarfile stops before the gzip CRC: then no error, as before
        squeezed[len(squeezed) // 2] ^= 0xFF
    path = tmp_path / "obj.gz"
    path.write_bytes(bytes(squeezed))
    key, plain = write(tmp_path, body)
    intact = list(tarfile_records(key, plain)) if damage == "cut" else None
    _, error = assert_same_as_tarfile(monkeypatch, "s.tar.gz", str(path), intact=intact)
    assert damage == "flip" or (error is not None and error[0] == "CorruptObject")


# --- the two kernels agree ------------------------------------------------------------------------


def test_both_kernels_frame_every_prefix_the_same() -> None:
    if len(IMPLS) < 2:
        pytest.skip("the C kernel is not built")
    rng = random.Random(7)
    for body in (random_tar(rng), random_tar(rng, ascii_only=True), long_names(rng, 0)):
        for cut in sorted({*range(0, len(body), 331), len(body)}):
            for final in (False, True):
                for at_start in (False, True):
                    got = [impl.frame_tar(body[:cut], final, at_start) for impl in IMPLS]
                    python, native = ((bytes(d), bytes(e), c, s) for d, e, c, s in got)
                    assert python == native, (cut, final, at_start)


def test_both_kernels_check_every_prefix_as_they_frame_it() -> None:
    """``check_tar`` is ``frame_tar``'s walk: the same count, largest frame, consumed and
    status, in both kernels, for every cut of odd tars."""
    rng = random.Random(11)
    for body in (random_tar(rng), random_tar(rng, ascii_only=True), long_names(rng, 0)):
        for cut in sorted({*range(0, len(body), 331), len(body)}):
            for final, at_start in ((False, False), (False, True), (True, False), (True, True)):
                args = (body[:cut], final, at_start)
                checks = {impl.check_tar(*args) for impl in IMPLS}
                assert len(checks) == 1, (cut, final, at_start)
                data, ends, consumed, status = twin.frame_tar(*args)
                frames = Frames.of(data, ends)
                assert checks.pop() == (len(frames), frames.largest(), consumed, status)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_sample_over_the_limit_is_quarantined_by_the_check_as_by_framing(
    suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Limits around the largest sample's frame and its member bytes: the check falls back to
    tarfile exactly where framing does, and both end the same (records or RecordTooLarge)."""
    body = (
        member(b"s/0.cls", b"0") + member(b"s/1.a", b"a" * 3000) + member(b"s/1.b", b"b" * 3000)
        + member(b"s/2.cls", b"2") + END
    )  # fmt: skip
    key, path = write(tmp_path, body, suffix)
    largest = max(len(r) for r in tarfile_records(key, path)) + 16  # framed: 12 + 4 bytes
    for impl in IMPLS:
        monkeypatch.setattr(choice, "KERNEL", impl)
        for limit in (5999, 6000, 6001, largest - 1, largest, largest + 1, 1 << 20):
            assert_check_agrees(key, path, limit)
        _, error = frames_outcome(key, path, 5999)
        assert error is not None and error[0] == "RecordTooLarge"


def test_the_read_through_builds_no_examples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's read-through of a clean tar walks headers only: ``frame_tar`` (Examples,
    CRCs) is never called, and every sample is counted."""
    body, ids = sample_data.tar_object(0, 300_000, random.Random(9), ("json", "cls"))
    key, path = write(tmp_path, body)
    for impl in IMPLS:
        walk_only = types.SimpleNamespace(check_tar=impl.check_tar)  # no frame_tar at all
        monkeypatch.setattr(choice, "KERNEL", walk_only)
        assert sum(TarFormat().check(key, path)) == len(ids)
