"""Stopping and starting the daemon, as systemd or an operator does, loses nothing."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .trainers import SIZES, finish, start_consumer, status_json

pytestmark = pytest.mark.e2e


def test_sigterm_drains_and_a_new_run_resumes_exactly_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES * 2, seed=11)
    config_path = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    config = yaml.safe_load(config_path.read_text())
    first = run_daemon(config_path)
    out = tmp_path / "c.json"
    consumer = start_consumer(config_path, out, "--delay", "0.1")

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _, status = status_json(config_path)
        if status and status["shards_written"] >= 3:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"no shards were written\n{first.output()}")
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0, first.output()
    assert "draining" in first.output()
    for area in ("output", "download"):
        key = "ram_dir" if area == "output" else "cache_dir"
        leftovers = list((Path(config[area][key]) / ".tmp").iterdir())
        assert not leftovers, f"a drained daemon left temp files: {leftovers}"

    second = run_daemon(config_path)  # the trainer keeps reading meanwhile
    result = finish(consumer, out)
    assert second.wait(120) == 0, second.output()
    assert "resuming job " in second.output()
    delivered = Counter(rid for _, rid in result["records"])
    assert delivered == Counter(dataset["ids"]), "records lost or doubled across the restart"
