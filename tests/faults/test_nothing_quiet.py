"""Nothing dropped or doubled quietly (each case run against the real daemon and moto):

- a tar member name that is not UTF-8 reaches a protobuf-parsing trainer intact, escaped
  reversibly in the feature name (docs/troubleshooting.md, "DecodeError: String field had
  bad UTF-8");
"""

from __future__ import annotations

import io
import tarfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import finish_trainer, start_trainer

pytestmark = pytest.mark.e2e

KIB, MIB = 1024, 1024**2
PREFIX = "data/"


def latin1_tar(samples: int) -> tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]:
    """A WebDataset tar as old archives are: member names in Latin-1 (``\\xe9``), in the base
    name and in the extension; and what each sample holds."""
    buf = io.BytesIO()
    want: list[tuple[bytes, dict[bytes, bytes]]] = []
    with tarfile.open(
        fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT, encoding="latin-1"
    ) as tar:
        for i in range(samples):
            base = f"s/caf\xe9-{i:03d}"
            sample: dict[bytes, bytes] = {}
            for ext in ("jpg", "l\xe9gende", "50%.txt"):
                data = f"{i}:{ext}".encode() * 20
                info = tarfile.TarInfo(f"{base}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                sample[ext.encode("latin-1")] = data
            want.append((base.encode("latin-1"), sample))
    return buf.getvalue(), want


def test_tar_names_that_are_not_utf8_reach_a_protobuf_trainer(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    want: list[tuple[bytes, dict[bytes, bytes]]] = []
    for n in range(3):
        body, samples = latin1_tar(40)
        s3_client.put_object(Bucket=bucket, Key=f"{PREFIX}{n:03d}.tar", Body=body)
        want.extend(samples)
    config = write_config(tmp_path, epochs__count=1, source__format="tar")
    daemon = run_daemon(config)
    out = tmp_path / "trainer.json"
    result = finish_trainer(start_trainer("tests.faults.proto_reader", config, out), out, 240)
    assert daemon.wait(120) == 0, daemon.output()

    got = []
    for example in result["examples"]:
        key = bytes.fromhex(example.pop("key"))
        sample = {urllib.parse.unquote_to_bytes(n): bytes.fromhex(v) for n, v in example.items()}
        got.append((key, sample))
    assert sorted(got) == sorted(want)
