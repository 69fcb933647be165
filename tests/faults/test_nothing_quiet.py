"""Nothing dropped or doubled quietly (each case run against the real daemon and moto):

- a tar member name that is not UTF-8 reaches a protobuf-parsing trainer intact, escaped
  reversibly in the feature name (docs/troubleshooting.md, "DecodeError: String field had
  bad UTF-8");
"""

from __future__ import annotations

import io
import random
import tarfile
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.trainers import finish_trainer, start_trainer, tree_bytes

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


# --- the RAM budget holds always ------------------------------------------------------------


class Sampler:
    """Bytes under ``ram_dir`` every ~20 ms, in a thread, until stopped: the largest seen."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.largest = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.largest = max(self.largest, tree_bytes(self.root))
            self.samples += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.largest


BUDGET = 5 * MIB
RUNS = 3


@pytest.mark.parametrize("run", range(RUNS))
def test_the_ram_budget_holds_with_raw_objects_near_the_record_limit(
    run: int,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """2 writers, 2 trainers, raw objects of 1.5-1.6 MiB under a 5 MiB budget (the derived
    record limit is above them): every sample of ``ram_dir`` stays within the budget, and every
    object arrives once per epoch."""
    rng = random.Random(run)
    keys = []
    for n in range(16):
        key = f"{PREFIX}{n:03d}.bin"
        s3_client.put_object(
            Bucket=bucket, Key=key, Body=rng.randbytes(rng.randrange(1536 * KIB, 1600 * KIB))
        )
        keys.append(key)
    config = write_config(
        tmp_path,
        epochs__count=2,
        source__format="raw",
        output__ram_budget="5MiB",
        output__writers=2,
        output__shard_size="512KiB",
        output__mix=2,
    )
    ram_dir = Path(yaml.safe_load(config.read_text())["output"]["ram_dir"])
    sampler = Sampler(ram_dir)
    try:
        daemon = run_daemon(config)
        outs = [tmp_path / f"trainer-{i}.json" for i in range(2)]
        trainers = [start_trainer("tests.faults.proto_reader", config, o) for o in outs]
        results = [finish_trainer(t, o, 300) for t, o in zip(trainers, outs, strict=True)]
        code = daemon.wait(120)
    finally:
        largest = sampler.stop()
    assert code == 0, daemon.output()
    assert sampler.samples > 10
    assert largest <= BUDGET, f"{largest} bytes under ram_dir, over the budget of {BUDGET}"
    got = Counter(bytes.fromhex(e["key"]).decode() for r in results for e in r["examples"])
    assert got == Counter({k: 2 for k in keys})
