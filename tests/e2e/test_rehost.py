"""End to end: a job checkpointed on N hosts resumed on M (``sharding.resume_from``).

Each old host runs its own daemon (``sharding.num_workers: N``) and a ``records()`` trainer
that saves its position every few records and is SIGKILLed mid-epoch. The M new hosts get the
N saved positions and nothing else of the old hosts (fresh state, cache and RAM dirs): every
record of the interrupted epoch that no old trainer had trained must come exactly once across
the new hosts, and the next epoch must be complete, split M ways.
"""

from __future__ import annotations

import json
import shutil
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import finish_trainer, start_trainer

pytestmark = pytest.mark.e2e

RESUME_TRAINER = "tests.e2e.records_resume_trainer"
KIB = 1024
SIZES = [(10 + (i * 7) % 31) * KIB for i in range(36)]


def _old_run(
    tmp_path: Path,
    hosts: int,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    records: int,
) -> tuple[Path, list[list[int]]]:
    """N hosts, each trainer killed about half way through its share of epoch 0: the directory
    of their saved positions, and the records their checkpoints say they trained."""
    positions = tmp_path / "positions"
    positions.mkdir()
    trained: list[list[int]] = []
    for index in range(hosts):
        home = tmp_path / f"old{index}"
        config = write_config(
            home,
            epochs__count=2,
            sharding__num_workers=hosts,
            sharding__worker_index=index,
            output__shard_size="64KiB",
        )
        daemon = run_daemon(config)
        ckpt = home / "ckpt.json"
        crash = records // (2 * hosts) + 3 * index
        args = (str(ckpt), "--epochs", "2", "--save-every", "7", "--crash-after", str(crash))
        trainer = start_trainer(RESUME_TRAINER, config, home / "out.json", *args)
        assert trainer.wait(120) == -signal.SIGKILL
        daemon.stop()
        saved = json.loads(ckpt.read_text())
        assert saved["position"]["epoch"] == 0
        assert saved["position"]["objects"]["epoch"] == 0
        (positions / f"host{index}.json").write_text(json.dumps(saved["position"]))
        trained += saved["records"]
        shutil.rmtree(home / "state", ignore_errors=True)  # the old host is gone
    return positions, trained


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_job_resumed_on_another_number_of_hosts_trains_each_record_once(
    old: int,
    new: int,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=25)
    positions, before = _old_run(tmp_path, old, write_config, run_daemon, dataset["records"])
    assert before, "the old trainers trained nothing before they were killed"
    daemons, trainers, outs = [], [], []
    for index in range(new):
        home = tmp_path / f"new{index}"
        config = write_config(
            home,
            epochs__count=2,
            sharding__num_workers=new,
            sharding__worker_index=index,
            sharding__resume_from=str(positions),
            output__shard_size="64KiB",
        )
        daemons.append(run_daemon(config))
        out = home / "out.json"
        args = (str(home / "ckpt.json"), "--epochs", "2", "--save-every", "7")
        trainers.append(start_trainer(RESUME_TRAINER, config, out, *args))
        outs.append(out)
    after = [finish_trainer(t, out)["records"] for t, out in zip(trainers, outs, strict=True)]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    ids = Counter(dataset["ids"])
    every = before + [r for host in after for r in host]
    epoch0 = Counter(rid for e, rid in every if e == 0)
    assert epoch0 == ids, "epoch 0: records lost or trained twice across the host change"
    assert all(e in (0, 1) for e, _ in every)
    split = [Counter(rid for e, rid in host if e == 1) for host in after]
    assert sum(split, Counter()) == ids, "epoch 1: records lost or trained twice"
    assert all(split), f"epoch 1 is not split {new} ways"
