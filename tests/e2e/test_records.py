"""End to end with no framework: ``prefetchd run`` against moto on 127.0.0.1, trainers reading
through ``prefetchd.records()`` in processes where TensorFlow, PyTorch, JAX and numpy cannot be
imported (``tests/e2e/plain_trainer.py``); what they read is compared with what TensorFlow's
``TFRecordDataset`` reads from the very same shard files, in a separate TensorFlow process.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.trainers import finish_trainer, log_tail, start_trainer

from .trainers import SIZES

pytestmark = pytest.mark.e2e

TRAINER = "tests.e2e.plain_trainer"
RESUME_TRAINER = "tests.e2e.records_resume_trainer"

# Reads every shard named on the command line with TensorFlow; prints the records as hex.
TF_READER = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
out = []
for path in sys.argv[1:]:
    shard = tf.data.TFRecordDataset(path, compression_type="GZIP" if path.endswith(".gz") else "")
    out += [r.hex() for r in shard.as_numpy_iterator()]
print(json.dumps(out))
"""


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_two_plain_trainers_get_each_record_exactly_once_per_epoch(
    compression: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=21)
    config = write_config(
        tmp_path, epochs__count=2, output__shard_size="64KiB", output__compression=compression
    )
    daemon = run_daemon(config)
    trainers = []
    for epoch in (0, 1):
        for i in range(2):
            out = tmp_path / f"e{epoch}-t{i}.json"
            trainers.append((start_trainer(TRAINER, config, out, "--epoch", str(epoch)), out))
    results = [finish_trainer(proc, out) for proc, out in trainers]
    assert daemon.wait(120) == 0, daemon.output()

    for epoch in (0, 1):
        got = Counter(rid for r in results for e, rid in r["records"] if e == epoch)
        assert got == Counter(dataset["ids"]), f"epoch {epoch}: records lost or doubled"
    assert not any(r["blocked"] for r in results), "a framework import was attempted"


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_records_are_byte_identical_to_what_tensorflow_reads_from_the_same_shards(
    compression: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=22)
    config = write_config(
        tmp_path, epochs__count=1, output__shard_size="128KiB", output__compression=compression
    )
    ram = Path(yaml.safe_load(config.read_text())["output"]["ram_dir"])
    daemon = run_daemon(config)
    out, go = tmp_path / "plain.json", tmp_path / "go"
    # A resumable stream keeps every shard it read on the RAM disk; the trainer holds after the
    # last record, so the shards it read can be copied before it lets them go.
    trainer = start_trainer(TRAINER, config, out, "--hold", str(dataset["records"]), str(go))
    _wait_for_file(out, trainer)
    copies = tmp_path / "shards"
    shutil.copytree(ram / "claimed", copies)
    go.touch()
    result = finish_trainer(trainer, out)
    assert daemon.wait(120) == 0, daemon.output()

    assert Counter(rid for _, rid in result["records"]) == Counter(dataset["ids"])
    shards = sorted(str(p) for p in copies.iterdir())
    assert shards, "no shard was kept"
    assert all(p.endswith(".tfrecord.gz" if compression == "gzip" else ".tfrecord") for p in shards)
    read_by_tf = subprocess.run(
        [sys.executable, "-c", TF_READER, *shards],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert Counter(result["raw"]) == Counter(json.loads(read_by_tf.stdout)), "not byte-identical"
    assert not result["blocked"], "a framework import was attempted"


def _wait_for_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    """Until the trainer wrote ``path``; fails if it exits first or takes over ``timeout``."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"trainer exited ({proc.returncode}) before holding:\n{log_tail(path)}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"trainer never held after {timeout:.0f} s")
        time.sleep(0.05)


def test_records_killed_mid_shard_and_resumed_trains_each_record_once_per_epoch(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Saved every 7 records, killed 4 records after a save: the saved position is inside a
    shard, whose trained records must not come again and whose others must."""
    dataset = upload("tfrecord", SIZES, seed=44)
    config = write_config(tmp_path, epochs__count=2, output__shard_size="128KiB")
    daemon = run_daemon(config)
    ckpt = tmp_path / "ckpt.json"
    args = (str(ckpt), "--epochs", "2", "--save-every", "7")
    first = start_trainer(
        RESUME_TRAINER, config, tmp_path / "a.json", *args, "--crash-after", "130"
    )
    assert first.wait(120) == -signal.SIGKILL
    saved = json.loads(ckpt.read_text())
    assert saved["position"]["records"], "the saved position is not inside a shard"
    out = tmp_path / "b.json"
    second = finish_trainer(start_trainer(RESUME_TRAINER, config, out, *args, "--resume"), out)
    assert daemon.wait(120) == 0, daemon.output()
    for epoch in (0, 1):
        got = Counter(rid for e, rid in saved["records"] + second["records"] if e == epoch)
        assert got == Counter(dataset["ids"]), f"epoch {epoch}: records lost or trained twice"
