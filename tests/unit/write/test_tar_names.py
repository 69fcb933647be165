"""Every record the ``tar`` format emits parses with the trainer's own parser, whatever bytes
the member names hold: ``tf.train.Example.FromString`` (protobuf, which requires feature names
to be UTF-8) accepts each one, the sample's ``key`` holds the name's bytes unchanged, and each
feature name gives the extension's bytes back with ``urllib.parse.unquote_to_bytes``."""

from __future__ import annotations

import io
import tarfile
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefetchd.write.formats.tar import TarFormat, feature_name
from prefetchd.write.frames import Frames

tf = pytest.importorskip("tensorflow")

# any byte but NUL (it ends a tar name) and "/" (a directory, not part of the extension)
NAME_BYTE = st.integers(1, 255).filter(lambda b: b != 0x2F).map(lambda b: bytes([b]))
NAME_PART = st.lists(NAME_BYTE, min_size=1, max_size=20).map(b"".join)


def ustar(members: list[tuple[bytes, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def records(frames: list[Frames]) -> list[bytes]:
    out: list[bytes] = []
    for batch in frames:
        start = 0
        for end in batch.ends:
            frame = bytes(batch.data[start:end])
            out.append(frame[12:-4])  # length, its CRC ... the record ... its CRC
            start = end
    return out


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    samples=st.lists(
        st.tuples(NAME_PART, st.lists(NAME_PART, min_size=1, max_size=3, unique=True)),
        min_size=1,
        max_size=6,
    )
)
def test_member_names_of_random_bytes_give_examples_protobuf_parses(
    samples: list[tuple[bytes, list[bytes]]], tmp_path: Path
) -> None:
    members: list[tuple[bytes, bytes]] = []
    expected: list[tuple[bytes, dict[bytes, bytes]]] = []
    for i, (base, exts) in enumerate(samples):
        base = base.replace(b".", b"_") + b"%d" % i  # one sample per entry, in order
        exts = [e for e in exts if e != b"key"]
        if not exts:
            continue
        sample: dict[bytes, bytes] = {}
        for j, ext in enumerate(exts):
            data = b"%d-%d" % (i, j)
            members.append((base + b"." + ext, data))
            sample[ext] = data
        expected.append((base, sample))
    path = tmp_path / "names.tar"
    path.write_bytes(ustar(members))

    fmt = TarFormat(max_record_size=1 << 20)
    emitted = records(list(fmt.frames("names.tar", str(path))))
    assert emitted == list(fmt.records("names.tar", str(path)))  # both readers agree
    got = []
    for record in emitted:
        example = tf.train.Example.FromString(record)  # raises on a name that is not UTF-8
        feature = example.features.feature
        key = feature["key"].bytes_list.value[0]
        got.append(
            (
                key,
                {
                    urllib.parse.unquote_to_bytes(name): feature[name].bytes_list.value[0]
                    for name in feature
                    if name != "key"
                },
            )
        )
    assert got == expected


@given(st.binary(min_size=1, max_size=40))
def test_feature_names_are_utf8_and_reversible(raw: bytes) -> None:
    name = feature_name(raw.decode("utf-8", "surrogateescape"))
    name.encode("utf-8")  # strict: no surrogates left
    assert urllib.parse.unquote_to_bytes(name) == raw


def test_a_utf8_extension_without_percent_is_unchanged() -> None:
    assert feature_name("seg.png") == "seg.png"
    assert feature_name("ü.txt") == "ü.txt"
    assert feature_name("caf\udce9") == "caf%E9"
    assert feature_name("50%.jpg") == "50%25.jpg"
