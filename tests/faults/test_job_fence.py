"""Leftovers of another job: a trainer never reads them, and a restart says what it does.

A job script starts the trainer first and the daemon after it, so the trainer finds whatever an
earlier daemon (stopped with SIGTERM) left on the RAM disk. It must not read those shards: it
waits for the daemon to fence the job (``ram_dir/prefetchd.job``) and then reads exactly the
new job's records, each once. A daemon restarted with a changed config starts a new job
cleanly, says so first, and ends once the trainer has read it — docs/reliability.md, "Another
job's leftovers"."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.trainers import delivered
from tests.faults.faultkit import KIB, finish_reader, start_reader, state_dir, wait_status

pytestmark = pytest.mark.e2e

# ~50 records in a few 128 KiB shards: the whole epoch fits the RAM budget, so a daemon with no
# trainer writes every shard and then waits for one
SMALL = [40 * KIB, 90 * KIB, 12 * KIB, 150 * KIB, 64 * KIB, 33 * KIB]


def _dirs(config: Path) -> tuple[Path, Path]:
    raw = yaml.safe_load(config.read_text())
    return Path(raw["output"]["ram_dir"]), Path(raw["download"]["cache_dir"])


def _leave_shards(config: Path, run_daemon: Callable[..., Any]) -> list[str]:
    """Run a daemon with no trainer until every shard of epoch 0 is ready, stop it with
    SIGTERM, and return the shards it left in ``ram_dir/ready``."""
    first = run_daemon(config)
    wait_status(config, lambda s: s["epoch"] >= 1, 120, "epoch 0 written")
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0, first.output()
    ram, _ = _dirs(config)
    left = sorted(p.name for p in (ram / "ready").iterdir())
    assert len(left) >= 2, f"expected shards left on the RAM disk, found {left}"
    return left


def _start_trainer_first(config: Path, out: Path) -> Any:
    """The trainer, started before the daemon: returns once it is up and had time to claim
    what it found (today it claims the leftovers at once)."""
    ram, _ = _dirs(config)
    reader = start_reader(config, out, "--timeout", "120")
    deadline = time.monotonic() + 60
    while not any((ram / "consumers").glob("*.lock")):
        assert reader.poll() is None, out.with_suffix(".log").read_text()
        assert time.monotonic() < deadline, "the trainer did not start"
        time.sleep(0.05)
    time.sleep(1.0)  # its claim loop polls every 0.2 s: several rounds over the leftovers
    return reader


def test_a_trainer_started_before_a_fresh_job_never_reads_the_shards_an_earlier_job_left(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SMALL, seed=291)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    _leave_shards(config, run_daemon)
    _, cache = _dirs(config)
    shutil.rmtree(state_dir(config))  # "start over": the state and the cache go, ram_dir stays
    shutil.rmtree(cache)

    out = tmp_path / "t.json"
    reader = _start_trainer_first(config, out)
    second = run_daemon(config)
    result = finish_reader(reader, out)
    assert second.wait(120) == 0, second.output()
    assert delivered([result], 0) == Counter(dataset["ids"]), "the trainer read another job"
    first_line = second.stderr.read_text().splitlines()[0]
    assert "starting a new job" in first_line, second.output()
    assert "no earlier job" in first_line and "shards" in first_line, first_line


def test_a_restart_with_a_changed_seed_starts_a_new_job_says_so_and_ends(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SMALL, seed=292)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    _leave_shards(config, run_daemon)
    raw = yaml.safe_load(config.read_text())
    raw["epochs"]["seed"] = 1  # the state stays: the user only changed the seed
    config.write_text(yaml.safe_dump(raw, sort_keys=False))

    out = tmp_path / "t.json"
    reader = _start_trainer_first(config, out)
    second = run_daemon(config)
    result = finish_reader(reader, out)
    # it ends (today it waits for ever for a trainer that read the old job and left)
    assert second.wait(120) == 0, second.output()
    assert delivered([result], 0) == Counter(dataset["ids"])
    first_line = second.stderr.read_text().splitlines()[0]
    assert "starting a new job" in first_line, second.output()
    assert "epochs.seed changed 0 -> 1" in first_line, first_line
    status = json.loads((state_dir(config) / "status.json").read_text())
    assert "epochs.seed changed 0 -> 1" in status["job"], status.get("job")


def test_a_restart_with_the_same_config_resumes_and_says_which_job(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """The other branch: the same job's leftovers are its own, read by a trainer started
    first, each record once, and the first line says the job resumed."""
    dataset = upload("tfrecord", SMALL, seed=293)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    _leave_shards(config, run_daemon)
    out = tmp_path / "t.json"
    reader = _start_trainer_first(config, out)
    second = run_daemon(config)
    result = finish_reader(reader, out)
    assert second.wait(120) == 0, second.output()
    assert delivered([result], 0) == Counter(dataset["ids"])
    first_line = second.stderr.read_text().splitlines()[0]
    assert "resuming job" in first_line, second.output()
