"""Regression: heartbeats used the wall clock, so an NTP step could get healthy children
SIGKILLed, fail the daemon, or expire a trainer's grace. Here every process of the daemon and
the trainer sees its wall clock jump an hour ahead mid-epoch (``wallclock/sitecustomize.py``),
then back: nothing is killed or restarted, the run ends ``done``, every record once."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import delivered, start_trainer
from tests.faults.faultkit import READER, SIZES, finish_reader, read_status, wait_status

pytestmark = pytest.mark.e2e
HOUR = 3600
HOOK = Path(__file__).resolve().parent / "wallclock"


def test_a_wall_clock_step_of_an_hour_kills_nothing_and_expires_no_grace(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=31)
    step = tmp_path / "wall-step"
    step.write_text("0", encoding="ascii")
    path = os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "PREFETCHD_TEST_WALL_STEP": str(step)}
    config = write_config(tmp_path, epochs__count=1)
    daemon = run_daemon(config, env=env)
    out = tmp_path / "trainer.json"
    # A slow trainer, so the daemon runs (and waits on it) through both steps.
    reader = start_trainer(READER, config, out, "--delay", "1", env=env)
    wait_status(config, lambda s: s.get("state") == "running", 120, "the daemon to run")
    for offset in (HOUR, 0):
        before = time.time()
        step.write_text(str(offset), encoding="ascii")
        # the supervisor has written status (and checked heartbeats) with the stepped clock

        def stepped(s: dict[str, Any], o: float = offset, t: float = before) -> bool:
            updated = float(s.get("updated", 0))
            return abs(updated - (t + o)) < 60 and updated - o > t + 2

        wait_status(
            config,
            stepped,
            60,
            f"status written {offset} s ahead",
        )
    result = finish_reader(reader, out)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"
    status = read_status(config)
    assert status is not None and status["state"] == "done"
    assert all(child["restarts"] == 0 for child in status["children"].values()), status
    assert "stopped reporting" not in daemon.output(10**6)
