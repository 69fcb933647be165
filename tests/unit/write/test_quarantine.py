"""Hostile input, one object at a time: every parser's limit (output.max_record_size) holds
while streaming, before the bytes are held; whatever a parser or plugin raises becomes a
quarantine reason; a plugin that hangs is stopped (source.parse_timeout); a tar member name
that is not UTF-8 is kept as bytes."""

from __future__ import annotations

import gzip
import io
import random
import sys
import tarfile
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import zstandard

from prefetchd.config import config_from_dict
from prefetchd.errors import ConfigError, CorruptObject
from prefetchd.kernel.framing import frame
from prefetchd.write.formats import check_object, get_format, object_frames, read_whole_first
from prefetchd.write.formats.lines import LinesFormat
from prefetchd.write.formats.plugin import PluginFormat
from prefetchd.write.quarantine import (
    ParseTimeout,
    PluginError,
    Reason,
    RecordTooLarge,
    classify,
)
from testkit.sample_data import decode_example

KIB, MIB = 1024, 1024**2
LIMIT = MIB
BUFFERS = 4 * MIB  # read and decompression buffers, whatever the object holds


def compress(body: bytes, suffix: str) -> bytes:
    if suffix == ".gz":
        return gzip.compress(body, compresslevel=1)
    if suffix == ".zst":
        return zstandard.ZstdCompressor().compress(body)
    return body


def put(tmp_path: Path, name: str, body: bytes) -> str:
    path = tmp_path / "obj"
    path.write_bytes(body)
    return str(path)


def every_record(fmt_name: str, key: str, path: str, limit: int = LIMIT) -> list[bytes]:
    """Both readers of a format (``records`` and the writer's ``frames``) must agree."""
    fmt = get_format(fmt_name, max_record_size=limit)
    by_records = list(fmt.records(key, path))
    by_frames = [r for f in object_frames(fmt, key, path) for r in f.payloads()]
    assert by_records == by_frames
    assert sum(check_object(fmt, key, path)) == len(by_records), "the writer's read-through"
    return by_records


def both_raise(fmt_name: str, key: str, path: str, limit: int = LIMIT) -> list[CorruptObject]:
    fmt = get_format(fmt_name, max_record_size=limit)
    errors = []
    reads: list[Callable[[], object]] = [
        lambda: list(fmt.records(key, path)),
        lambda: list(object_frames(fmt, key, path)),
        lambda: list(check_object(fmt, key, path)),  # the writer's read-through (_validate)
    ]
    for read in reads:
        with pytest.raises(CorruptObject) as info:
            read()
        errors.append(info.value)
    framed, checked = errors[1:]
    assert (type(framed), str(framed)) == (type(checked), str(checked)), "the same quarantine"
    return errors


def peak_python_bytes(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        with pytest.raises(RecordTooLarge):
            work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- lines -------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_a_line_over_max_record_size_is_too_large_and_one_at_the_limit_passes(
    tmp_path: Path, suffix: str
) -> None:
    at_limit = b"a" * LIMIT + b"\r\n"
    ok = put(tmp_path, "ok", compress(b"first\n" + at_limit + b"last\n", suffix))
    assert len(every_record("lines", f"ok.txt{suffix}", ok)) == 3
    body = b"first\n" + b"b" * (LIMIT + 1) + b"\nlast\n"
    bad = put(tmp_path, "bad", compress(body, suffix))
    for error in both_raise("lines", f"bad.txt{suffix}", bad):
        assert isinstance(error, RecordTooLarge)
        assert "line 2" in error.reason and "output.max_record_size" in error.reason


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_a_huge_compressed_line_is_refused_without_being_held(tmp_path: Path, suffix: str) -> None:
    """A 64 MiB line (a small object: it compresses well) costs about one limit of memory."""
    body = b"x" * (64 * MIB) + b"\n"
    path = put(tmp_path, "big", compress(body, suffix))
    fmt = get_format("lines", max_record_size=LIMIT)
    key = f"big.jsonl{suffix}"
    peak = peak_python_bytes(lambda: list(object_frames(fmt, key, path)))
    assert peak < 8 * LIMIT, f"peak {peak} bytes for a {len(body)}-byte line"
    peak = peak_python_bytes(lambda: list(fmt.records(key, path)))
    assert peak < 8 * LIMIT, f"peak {peak} bytes for a {len(body)}-byte line"


# --- raw ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_a_raw_object_over_max_record_size_is_too_large(tmp_path: Path, suffix: str) -> None:
    ok = put(tmp_path, "ok", compress(b"r" * LIMIT, suffix))
    (record,) = every_record("raw", f"ok.bin{suffix}", ok)
    assert decode_example(record)["data"] == b"r" * LIMIT
    bad = put(tmp_path, "bad", compress(b"r" * (LIMIT + 1), suffix))
    for error in both_raise("raw", f"bad.bin{suffix}", bad):
        assert isinstance(error, RecordTooLarge) and "raw object" in error.reason


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_a_decompression_bomb_costs_one_limit_of_memory(tmp_path: Path, suffix: str) -> None:
    path = put(tmp_path, "bomb", compress(bytes(256 * MIB), suffix))
    fmt = get_format("raw", max_record_size=LIMIT)
    peak = peak_python_bytes(lambda: list(object_frames(fmt, f"bomb.bin{suffix}", path)))
    assert peak < 2 * LIMIT + BUFFERS, f"peak {peak} bytes for 256 MiB inflated"


# --- tfrecord ----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_a_tfrecord_record_over_max_record_size_is_too_large(tmp_path: Path, suffix: str) -> None:
    small = [frame(b"s%d" % i) for i in range(5)]
    ok = put(tmp_path, "ok", compress(b"".join([*small, frame(b"t" * LIMIT)]), suffix))
    assert len(every_record("tfrecord", f"ok.tfrecord{suffix}", ok)) == 6
    body = b"".join([*small, frame(b"t" * (LIMIT + 1)), *small])
    bad = put(tmp_path, "bad", compress(body, suffix))
    for error in both_raise("tfrecord", f"bad.tfrecord{suffix}", bad):
        assert isinstance(error, RecordTooLarge), error


# --- tar ---------------------------------------------------------------------------------------


def tar_bytes(members: Sequence[tuple[str | tarfile.TarInfo, bytes]], **options: object) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", **options) as tar:  # type: ignore[call-overload]
        for name, data in members:
            info = name if isinstance(name, tarfile.TarInfo) else tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_tar_sample_over_max_record_size_is_too_large(tmp_path: Path, suffix: str) -> None:
    half = b"h" * (LIMIT // 2 + 1)
    body = tar_bytes([("s/0.cls", b"0"), ("s/1.a", half), ("s/1.b", half), ("s/2.cls", b"2")])
    bad = put(tmp_path, "bad", compress(body, suffix))
    for error in both_raise("tar", f"bad.tar{suffix}", bad):
        assert isinstance(error, RecordTooLarge) and "tar sample 's/1'" in error.reason


def test_a_huge_pax_header_is_refused_before_tarfile_holds_it(tmp_path: Path) -> None:
    info = tarfile.TarInfo("s/0.cls")
    info.pax_headers = {"comment": "c" * (4 * LIMIT)}
    body = tar_bytes([(info, b"0")], format=tarfile.PAX_FORMAT)
    path = put(tmp_path, "pax", body)
    for error in both_raise("tar", "pax.tar", path):
        assert isinstance(error, RecordTooLarge) and "tar header" in error.reason


def test_a_non_utf8_member_name_is_kept_reversibly(tmp_path: Path) -> None:
    """Was: UnicodeEncodeError in the Example encoder, the writer crash-looped; then a feature
    name of raw bytes that protobuf rejects. The key keeps the bytes, the name escapes them."""
    body = tar_bytes([("s/\xff\xfe0.cl\udcffs", b"0"), ("s/1.cls", b"1")], encoding="latin-1")
    path = put(tmp_path, "names", body)
    records = every_record("tar", "names.tar", path)
    names = [set(decode_example_raw(r)) for r in records]
    assert len(records) == 2 and any(b"cl%FFs" in n for n in names), names
    for name in set().union(*names):
        name.decode("utf-8")  # strict: what protobuf requires of a feature name


def decode_example_raw(record: bytes) -> dict[bytes, object]:
    """Feature names as bytes (``decode_example`` decodes them as UTF-8)."""
    from testkit.sample_data import _fields  # the same wire reader, names undecoded

    out: dict[bytes, object] = {}
    for _, _, features in _fields(record):
        assert isinstance(features, bytes)
        for _, _, entry in _fields(features):
            assert isinstance(entry, bytes)
            fields = {n: v for n, _, v in _fields(entry)}
            name = fields[1]
            assert isinstance(name, bytes)
            out[name] = fields.get(2)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_any_damage_to_a_tar_raises_corrupt_object_or_reads(tmp_path: Path, seed: int) -> None:
    """Bit flips, truncation, garbage: the reader gives records or raises something that
    ``classify`` names; it never loops, never holds more than the limit."""
    rng = random.Random(seed)
    members = [
        (f"s/{i}.{ext}", rng.randbytes(rng.randrange(2000))) for i in range(8) for ext in ("a", "b")
    ]
    body = bytearray(
        tar_bytes(members, format=rng.choice([tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT]))
    )
    for _ in range(rng.randrange(1, 6)):
        body[rng.randrange(len(body))] = rng.randrange(256)
    if rng.random() < 0.3:
        body = body[: rng.randrange(len(body))]
    path = put(tmp_path, "t", bytes(body))
    fmt = get_format("tar", max_record_size=LIMIT)
    try:
        list(object_frames(fmt, "t.tar", path))
    except Exception as exc:  # what the writer catches: it must classify
        reason, message = classify(exc)
        assert reason in (Reason.CORRUPT, Reason.TOO_LARGE) and message


# --- plugins -----------------------------------------------------------------------------------

EXCEPTIONS = [ValueError, KeyError, UnicodeDecodeError, MemoryError, RecursionError, OSError]


def plugin(function: Callable[[str, str], Iterator[bytes]], timeout: float = 300) -> PluginFormat:
    return PluginFormat("tests:plugin", function, LIMIT, timeout)


@pytest.mark.parametrize("kind", EXCEPTIONS)
def test_any_exception_from_a_plugin_is_a_plugin_error(kind: type[BaseException]) -> None:
    def raises(key: str, path: str) -> Iterator[bytes]:
        yield b"one"
        if kind is UnicodeDecodeError:
            b"\xff".decode()
        raise kind("boom")

    with pytest.raises(PluginError) as info:
        list(plugin(raises).records("k", "p"))
    assert classify(info.value)[0] is Reason.PLUGIN_ERROR and kind.__name__ in info.value.reason


def test_a_plugin_yielding_text_or_a_huge_record_is_quarantined() -> None:
    with pytest.raises(PluginError, match="yielded str"):
        list(plugin(lambda k, p: iter(["text"])).records("k", "p"))  # type: ignore[list-item]
    with pytest.raises(RecordTooLarge):
        list(plugin(lambda k, p: iter([bytes(LIMIT + 1)])).records("k", "p"))


def test_a_hanging_plugin_is_stopped_after_parse_timeout() -> None:
    def hangs(key: str, path: str) -> Iterator[bytes]:
        yield b"one"
        time.sleep(3600)
        yield b"never"

    with pytest.raises(ParseTimeout) as info:
        list(plugin(hangs, timeout=1).records("k", "p"))
    assert classify(info.value)[0] is Reason.TIMEOUT
    assert "source.parse_timeout" in info.value.reason


def test_a_plugin_that_swallows_exceptions_is_still_stopped() -> None:
    def stubborn(key: str, path: str) -> Iterator[bytes]:
        while True:
            try:
                time.sleep(3600)
            except Exception:
                continue
        yield b"never"  # pragma: no cover

    with pytest.raises(ParseTimeout):
        list(plugin(stubborn, timeout=1).records("k", "p"))


def test_the_time_limit_counts_only_the_plugins_own_time() -> None:
    """Time spent by the writer between two records is not charged to the plugin."""

    def quick(key: str, path: str) -> Iterator[bytes]:
        yield from (b"a", b"b", b"c")

    records = []
    for record in plugin(quick, timeout=1).records("k", "p"):
        records.append(record)
        time.sleep(0.6)  # the writer busy elsewhere: 1.8 s in all, over the limit
    assert records == [b"a", b"b", b"c"]


def test_classify_names_what_a_builtin_parser_raised() -> None:
    reason, message = classify(ValueError("invalid literal for int()"))
    assert reason is Reason.CORRUPT and "ValueError" in message


# --- config ------------------------------------------------------------------------------------


def config(**output: object) -> dict[str, object]:
    return {"source": {"url": "s3://bucket/p/"}, "output": {"shard_size": "1MiB", **output}}


def test_max_record_size_over_what_the_ram_budget_holds_is_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(config(ram_budget="8MiB", max_record_size="4MiB"))
    text = str(info.value)
    assert text.startswith("output.max_record_size: 4.0 MiB is too large") and "\n" not in text
    assert "output.ram_budget" in text


def test_max_record_size_defaults_to_64mib_or_what_the_ram_budget_holds() -> None:
    assert config_from_dict(config()).output.max_record_size == 64 * MIB
    small = config_from_dict(config(ram_budget="9MiB")).output  # shard_size 1 MiB, 2 writers
    # each writer's share of what the trainers' shard and the small files leave, less a
    # record's Example and framing: (9 MiB - 64 KiB - 1 MiB) / 2 - 16 KiB
    assert small.max_record_size == (9 * MIB - 64 * KIB - MIB) // 2 - 16 * KIB


@pytest.mark.parametrize("value", [0, -1, "soon", True, 10**6])
def test_parse_timeout_must_be_a_sensible_number_of_seconds(value: object) -> None:
    raw = {"source": {"url": "s3://bucket/p/", "parse_timeout": value}}
    with pytest.raises(ConfigError, match=r"^source\.parse_timeout: .* is not allowed"):
        config_from_dict(raw)


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("SIGALRM and tmpfs: Linux only")


def test_which_objects_the_writer_need_not_read_through_first(tmp_path: Path) -> None:
    """Only objects that cannot fail after their first record skip the writer's read-through:
    an uncompressed lines object no larger than max_record_size (no line can be over it), a
    raw object (one record); not a compressed one, nor a larger one."""
    lines = LinesFormat(max_record_size=1024)
    small, large, packed = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl.gz"
    small.write_bytes(b"x\n" * 512)
    large.write_bytes(b"x\n" * 513)
    packed.write_bytes(gzip.compress(b"x\n"))
    assert read_whole_first(lines, "a.jsonl", str(small))
    assert not read_whole_first(lines, "b.jsonl", str(large))
    assert not read_whole_first(lines, "c.jsonl.gz", str(packed))
    assert read_whole_first(get_format("raw"), "b.jsonl", str(large))
