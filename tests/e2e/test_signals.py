"""A closed terminal: SIGHUP to the daemon's whole process group drains it like SIGTERM, and
the children are drained by the supervisor rather than killed by the hangup."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from .trainers import SIZES, status_json

pytestmark = pytest.mark.e2e


def test_a_hangup_of_the_whole_group_drains_every_child_and_exits_0(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    upload("tfrecord", SIZES, seed=12)
    config_path = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    config = yaml.safe_load(config_path.read_text())
    daemon = run_daemon(config_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _, status = status_json(config_path)
        if status and status["state"] == "running" and status["shards_written"] >= 1:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"no shards were written\n{daemon.output()}")
    daemon.kill_group(signal.SIGHUP)  # what a terminal closing on `prefetchd run` does
    assert daemon.wait(60) == 0, daemon.output()
    log = daemon.output()
    assert "running -> draining (SIGTERM, SIGINT or SIGHUP): received SIGHUP" in log
    assert "killed by SIGHUP" not in log, "a child died of the hangup instead of draining"
    final = json.loads((Path(config["status"]["state_dir"]) / "status.json").read_text())
    assert final["state"] == "draining"
    assert {c["state"] for c in final["children"].values()} == {"exited"}
    assert log.count("(exited or killed after the grace period): exited with code 0") == len(
        final["children"]
    )
    leftovers = list((Path(config["output"]["ram_dir"]) / ".tmp").iterdir())
    assert not leftovers, f"a drained daemon left temp files: {leftovers}"
