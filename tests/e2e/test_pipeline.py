"""End to end, as a user runs it: moto on 127.0.0.1, ``prefetchd run`` as a process, two
trainer processes reading shards through ``ready_files()`` and TensorFlow."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefetchd.supervise.status import REQUIRED_KEYS
from testkit.trainers import ram_bytes, tree_bytes

from .trainers import KIB, MIB, SIZES, finish, start_consumer, status_json

pytestmark = pytest.mark.e2e


class Sampler(threading.Thread):
    """Samples the byte budgets while the daemon runs (docs/reliability.md invariant 3)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.ram = Path(config["output"]["ram_dir"])
        self.cache = Path(config["download"]["cache_dir"])
        self.max_ram = 0
        self.max_raw = 0
        self.samples = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.max_ram = max(self.max_ram, ram_bytes(self.ram))
            # raw object bytes: published, claimed by writers, and downloads in flight
            raw = tree_bytes(self.cache, only=("ready", "claimed", ".tmp"))
            self.max_raw = max(self.max_raw, raw)
            self.samples += 1
            time.sleep(0.01)


@pytest.mark.parametrize(
    ("kind", "client"),
    # crt: the default where awscrt is installed; native: the C engine (download.client: native)
    [("tfrecord", "crt"), ("raw", "crt"), ("tfrecord", "native"), ("raw", "native")],
)
def test_two_epochs_exactly_once_to_two_trainers(
    kind: str,
    client: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload(kind, SIZES, seed=7)
    config_path = write_config(tmp_path, source__format=kind, download__client=client)
    config = yaml.safe_load(config_path.read_text())
    expected = Counter(dataset["ids"] if kind == "tfrecord" else dataset["keys"])
    assert len(expected) == dataset["records"]

    sampler = Sampler(config)
    sampler.start()
    daemon = run_daemon(config_path)
    # Trainers that do some work per shard, as real ones do: neither can drain every shard
    # before the other has started, so both must get some and none may get the same.
    consumers = [
        (
            start_consumer(config_path, tmp_path / f"c{i}.json", "--delay", "0.2"),
            tmp_path / f"c{i}.json",
        )
        for i in range(2)
    ]
    status = None
    deadline = time.monotonic() + 60
    while status is None and time.monotonic() < deadline and daemon.alive():
        code, status = status_json(config_path)
        time.sleep(0.2)
    results = [finish(proc, out) for proc, out in consumers]
    code = daemon.wait(120)
    sampler.halt.set()
    sampler.join()

    assert code == 0, daemon.output()
    assert status is not None, f"status --json never answered\n{daemon.output()}"
    missing = [k for k in REQUIRED_KEYS if k not in status]
    assert not missing, f"status --json lacks {missing}"
    assert set(status["children"]) == {"downloader", "writer-0", "writer-1"}
    for child in status["children"].values():
        assert {"pid", "alive", "restarts"} <= set(child)

    for epoch in (0, 1):
        delivered = Counter(rid for r in results for e, rid in r["records"] if e == epoch)
        assert delivered == expected, f"epoch {epoch}: records lost or doubled"
    shards = [set(r["shards"]) for r in results]
    assert shards[0].isdisjoint(shards[1]), "two trainers got the same shard"
    assert all(r["shards"] for r in results), "one trainer got no shard at all"

    ram_budget, window = 8 * MIB, 8 * MIB
    assert sampler.samples > 10
    assert sampler.max_ram <= ram_budget, f"RAM disk held {sampler.max_ram} bytes"
    assert sampler.max_raw <= window, f"cache held {sampler.max_raw} raw bytes"
    for leftovers in (Path(config["output"]["ram_dir"]), Path(config["download"]["cache_dir"])):
        assert not list((leftovers / ".tmp").iterdir()), f"temp files left in {leftovers}/.tmp"
    assert not list((Path(config["output"]["ram_dir"]) / "ready").iterdir())
    assert not list((Path(config["output"]["ram_dir"]) / "claimed").iterdir())


def test_crashed_writer_is_restarted_and_nothing_is_lost(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES * 2, seed=3)
    config_path = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    daemon = run_daemon(config_path)
    out = tmp_path / "c.json"
    consumer = start_consumer(config_path, out, "--delay", "0.05")

    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        _, status = status_json(config_path)
        if status and status["records_written"] > 0:
            victim = status["children"]["writer-0"]["pid"]
        time.sleep(0.05)
    assert victim, f"the writers never wrote\n{daemon.output()}"
    os.kill(victim, signal.SIGKILL)

    result = finish(consumer, out)
    assert daemon.wait(120) == 0, daemon.output()
    delivered = Counter(rid for _, rid in result["records"])
    assert delivered == Counter(dataset["ids"]), "records lost or doubled across a writer crash"
    log = daemon.output()
    assert "writer-0" in log and "restarting" in log


def test_tf_dataset_reads_an_epoch_larger_than_the_ram_budget(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Regression: an interleave holds claimed shards open while ready_files() waits for the
    next one; if those and the writers' shards fill the RAM budget, the next one never comes.
    (With a parallel interleave TF even stopped reading them.) dataset() must keep its cycle
    within the budget and the writers must stay alive while they wait."""
    dataset = upload("tfrecord", [512 * KIB] * 10, seed=5)  # 5 MiB per epoch
    config_path = write_config(
        tmp_path, output__ram_budget="1MiB", output__shard_size="256KiB", output__writers=2
    )
    daemon = run_daemon(config_path)
    out = tmp_path / "tf.json"
    result = finish(start_consumer(config_path, out, "--tf-dataset"), out)
    assert daemon.wait(120) == 0, daemon.output()
    delivered = Counter(rid for _, rid in result["records"])
    assert delivered == Counter({i: 2 for i in dataset["ids"]}), "2 epochs, each record twice"
