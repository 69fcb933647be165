"""A trainer that dies and restarts: exactly once relative to a saved consumer position,
at least once without one."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefetchd.consume.stream_position import parse_position
from testkit.trainers import delivered
from tests.faults.faultkit import SIZES, finish_reader, start_reader

pytestmark = pytest.mark.e2e


def crashed(proc: Any) -> None:
    assert proc.wait(120) == -signal.SIGKILL


@pytest.mark.parametrize("crash_after", [5, 30])
def test_trainer_restarted_from_its_saved_position_gets_every_record_exactly_once(
    crash_after: int,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """The trainer checkpoints every 3 shards and dies 1-2 shards after a checkpoint: the
    shards it read after the checkpoint come again, those before it never do."""
    dataset = upload("tfrecord", SIZES, seed=31)
    config = write_config(tmp_path, output__shard_size="128KiB", output__ram_budget="4MiB")
    daemon = run_daemon(config)
    ckpt = tmp_path / "ckpt.json"
    first = start_reader(
        config,
        tmp_path / "a.json",
        "--resumable",
        "--checkpoint",
        str(ckpt),
        "--checkpoint-every",
        "3",
        "--crash-after",
        str(crash_after),
    )
    crashed(first)
    saved = json.loads(ckpt.read_text())
    parse_position(saved["position"])  # a valid, JSON-able position
    assert len(json.dumps(saved["position"])) < 1000, "the position should stay small"
    out, ckpt2 = tmp_path / "b.json", tmp_path / "ckpt2.json"
    resumed = start_reader(
        config, out, "--resume", str(ckpt), "--checkpoint", str(ckpt2), "--checkpoint-every", "3"
    )
    second = finish_reader(resumed, out)
    assert daemon.wait(120) == 0, daemon.output()
    for epoch in (0, 1):
        got = delivered([saved, second], epoch)
        assert got == Counter(dataset["ids"]), f"epoch {epoch}: lost or doubled"


def test_trainer_restarted_without_a_position_gets_every_record_at_least_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=32)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    daemon = run_daemon(config)
    ckpt = tmp_path / "ckpt.json"
    first = start_reader(
        config, tmp_path / "a.json", "--checkpoint", str(ckpt), "--crash-after", "4"
    )
    crashed(first)
    out = tmp_path / "b.json"
    second = finish_reader(start_reader(config, out), out)
    assert daemon.wait(120) == 0, daemon.output()
    got = delivered([json.loads(ckpt.read_text()), second])
    assert set(got) == set(dataset["ids"]), "records lost"
