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
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefetchd.config import load_config
from prefetchd.consume.position_format import job_for
from prefetchd.download.order import host_of
from prefetchd.layout import Layout
from testkit.trainers import finish_trainer, start_trainer

pytestmark = pytest.mark.e2e

RESUME_TRAINER = "tests.e2e.records_resume_trainer"
TORCH_TRAINER = "tests.e2e.torch_resume_trainer"
KERAS_TRAINER = "tests.e2e.keras_trainer"
KIB = 1024
SIZES = [(10 + (i * 7) % 31) * KIB for i in range(36)]


def _host_config(
    write_config: Callable[..., Path],
    home: Path,
    *,
    hosts: int,
    index: int,
    epochs: int,
    resume_from: Path | None = None,
) -> Path:
    """Host ``index`` of a job of ``hosts`` hosts and ``epochs`` epochs, small shards (so a
    position falls inside the epoch); resumed from the old hosts' ``resume_from`` if given."""
    resume = {} if resume_from is None else {"sharding__resume_from": str(resume_from)}
    return write_config(
        home,
        epochs__count=epochs,
        sharding__num_workers=hosts,
        sharding__worker_index=index,
        output__shard_size="64KiB",
        **resume,
    )


def _old_run(
    tmp_path: Path,
    hosts: int,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    records: int,
    epoch: int,
) -> tuple[Path, list[list[int]]]:
    """N hosts, each trainer killed about half way through its share of ``epoch``: the
    directory of their saved positions, and the records their checkpoints say they trained."""
    positions = tmp_path / "positions"
    positions.mkdir()
    trained: list[list[int]] = []
    for index in range(hosts):
        home = tmp_path / f"old{index}"
        config = _host_config(write_config, home, hosts=hosts, index=index, epochs=epoch + 2)
        daemon = run_daemon(config)
        ckpt = home / "ckpt.json"
        crash = records // (2 * hosts) + 3 * index
        args = (str(ckpt), "--epochs", str(epoch + 2), "--save-every", "7")
        crashing = ("--crash-after", str(crash), "--crash-epoch", str(epoch))
        trainer = start_trainer(RESUME_TRAINER, config, home / "out.json", *args, *crashing)
        assert trainer.wait(120) == -signal.SIGKILL
        daemon.stop()
        saved = json.loads(ckpt.read_text())
        assert saved["position"]["epoch"] == epoch
        assert saved["position"]["objects"]["epoch"] == epoch
        assert saved["position"]["objects"]["listing"]["n"] > 0  # the share it was laid over
        (positions / f"host{index}.json").write_text(json.dumps(saved["position"]))
        trained += saved["records"]
        shutil.rmtree(home / "state", ignore_errors=True)  # the old host is gone
    return positions, trained


@pytest.mark.parametrize(("old", "new", "epoch"), [(2, 3, 0), (3, 2, 0), (2, 3, 1)])
def test_job_resumed_on_another_number_of_hosts_trains_each_record_once(
    old: int,
    new: int,
    epoch: int,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=25)
    positions, before = _old_run(tmp_path, old, write_config, run_daemon, dataset["records"], epoch)
    assert before, "the old trainers trained nothing before they were killed"
    daemons, trainers, outs = [], [], []
    for index in range(new):
        home = tmp_path / f"new{index}"
        config = _host_config(
            write_config, home, hosts=new, index=index, epochs=epoch + 2, resume_from=positions
        )
        daemons.append(run_daemon(config))
        out = home / "out.json"
        args = (str(home / "ckpt.json"), "--epochs", str(epoch + 2), "--save-every", "7")
        trainers.append(start_trainer(RESUME_TRAINER, config, out, *args))
        outs.append(out)
    after = [finish_trainer(t, out)["records"] for t, out in zip(trainers, outs, strict=True)]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    ids = Counter(dataset["ids"])
    every = before + [r for host in after for r in host]
    for earlier in range(epoch):  # the old hosts finished it; the new ones pass over it
        assert Counter(rid for e, rid in before if e == earlier) == ids
    assert all(e >= epoch for host in after for e, _ in host)
    resumed = Counter(rid for e, rid in every if e == epoch)
    assert resumed == ids, f"epoch {epoch}: records lost or trained twice across the host change"
    assert all(e <= epoch + 1 for e, _ in every)
    split = [Counter(rid for e, rid in host if e == epoch + 1) for host in after]
    assert sum(split, Counter()) == ids, f"epoch {epoch + 1}: records lost or trained twice"
    assert all(split), f"epoch {epoch + 1} is not split {new} ways"
    status = json.loads((tmp_path / "new0" / "state" / "status.json").read_text())
    assert status["job_resumed"].startswith(f"resumed epoch {epoch} of a job of {old} hosts")


def test_a_missing_host_position_stops_the_daemon_with_one_line_naming_it(
    tmp_path: Path, write_config: Callable[..., Path], upload: Callable[..., Any]
) -> None:
    """Positions of hosts 0 and 2 of 3 but not of host 1: the new daemon refuses to start
    (exit 2), naming host 1, rather than reshuffle what host 1 had trained."""
    upload("tfrecord", SIZES[:4], seed=26)
    positions = tmp_path / "positions"
    positions.mkdir()
    for index in (0, 2):
        home = tmp_path / f"old{index}"
        old = write_config(home, sharding__num_workers=3, sharding__worker_index=index)
        job = job_for(load_config(old))  # what its trainer would have saved
        raw = {"version": 2, "epoch": 0, "consumed": [], "records": {}, "job": job}
        (positions / f"host{index}.json").write_text(json.dumps(raw))
    config = write_config(
        tmp_path / "new0",
        sharding__num_workers=2,
        sharding__worker_index=0,
        sharding__resume_from=str(positions),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "prefetchd", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "no position of host 1 of 3" in lines[0]


@pytest.mark.parametrize("change", ["added", "removed"])
def test_a_source_changed_since_the_old_job_stops_the_new_daemon_with_one_line(
    change: str,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """An object added to (or removed from) the bucket after the 2 old hosts were killed moves
    their objects' places in the listing: the new daemon refuses (exit 2) with one line
    naming the old host whose share changed and its counts then and now, and touches
    nothing, rather than train that host's records twice or never."""
    dataset = upload("tfrecord", SIZES[:12], seed=27)
    positions, _ = _old_run(tmp_path, 2, write_config, run_daemon, dataset["records"], 0)
    keys, prefix = dataset["keys"], dataset["prefix"]
    if change == "added":
        moved = prefix + "added-" + keys[5][len(prefix) :]
        source = {"Bucket": bucket, "Key": keys[5]}
        s3_client.copy_object(Bucket=bucket, Key=moved, CopySource=source)
    else:
        moved = keys[3]
        s3_client.delete_object(Bucket=bucket, Key=moved)
    host = host_of(moved, 2)
    then = sum(host_of(k, 2) == host for k in keys)
    now = then + 1 if change == "added" else then - 1
    home = tmp_path / "new0"
    config = _host_config(write_config, home, hosts=3, index=0, epochs=2, resume_from=positions)
    proc = subprocess.run(
        [sys.executable, "-m", "prefetchd", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"the source changed since the old job: host {host} of 2 had {then} objects" in lines[0]
    assert f"has {now} now" in lines[0] and "same keys" in lines[0], lines[0]
    layout = Layout.of(load_config(config))
    assert not layout.job_file.exists(), "the refused daemon started a job"
    assert not any(layout.epochs.iterdir()) and not any(layout.cache_ready.iterdir())
    check = subprocess.run(
        [sys.executable, "-m", "prefetchd", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = check.stdout + check.stderr
    assert check.returncode != 0 and f"host {host} of 2 had {then} objects" in said, said


def test_a_new_host_killed_inside_the_resumed_epoch_resumes_it_exactly_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """2 hosts resumed on 3; then new host 0's daemon and trainer are SIGKILLed inside the
    resumed epoch and restarted with the same config: the daemon works out the same remainder
    again, the trainer resumes from its own position, and still every record comes once."""
    dataset = upload("tfrecord", SIZES, seed=27)
    positions, before = _old_run(tmp_path, 2, write_config, run_daemon, dataset["records"], 0)
    configs, daemons = [], []
    for index in range(3):
        home = tmp_path / f"new{index}"
        config = _host_config(
            write_config, home, hosts=3, index=index, epochs=2, resume_from=positions
        )
        configs.append(config)
        daemons.append(run_daemon(config))
    ckpts = [tmp_path / f"new{index}" / "ckpt.json" for index in range(3)]
    args = [(str(ckpts[i]), "--epochs", "2", "--save-every", "7") for i in range(3)]
    crashing = ("--crash-after", "40", "--crash-epoch", "0")
    killed = start_trainer(RESUME_TRAINER, configs[0], tmp_path / "k.json", *args[0], *crashing)
    assert killed.wait(120) == -signal.SIGKILL
    daemons[0].kill_group(signal.SIGKILL)
    daemons[0].wait(30)
    saved = json.loads(ckpts[0].read_text())
    assert saved["position"]["epoch"] == 0 and saved["position"]["objects"]["epoch"] == 0
    daemons[0] = run_daemon(configs[0])
    outs = [tmp_path / f"out{i}.json" for i in range(3)]
    trainers = [start_trainer(RESUME_TRAINER, configs[0], outs[0], *args[0], "--resume")]
    trainers += [start_trainer(RESUME_TRAINER, configs[i], outs[i], *args[i]) for i in (1, 2)]
    after = [finish_trainer(t, out)["records"] for t, out in zip(trainers, outs, strict=True)]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    every = before + saved["records"] + [r for host in after for r in host]
    ids = Counter(dataset["ids"])
    for epoch in (0, 1):
        assert Counter(rid for e, rid in every if e == epoch) == ids, f"epoch {epoch}"


def test_a_torch_job_with_dataloader_workers_resumes_on_another_number_of_hosts(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """2 hosts of a PyTorch job (``StatefulDataLoader``, 2 workers each) SIGKILLed mid-epoch,
    their loader states saved as JSON; resumed on 3 hosts: every record once."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchdata.stateful_dataloader")
    dataset = upload("tfrecord", SIZES, seed=28)
    positions = tmp_path / "positions"
    positions.mkdir()
    before: list[int] = []
    for index in range(2):
        home = tmp_path / f"old{index}"
        config = _host_config(write_config, home, hosts=2, index=index, epochs=1)
        daemon = run_daemon(config)
        ckpt = home / "ckpt.pt"
        args = (str(ckpt), "--workers", "2", "--crash-after", str(9 + index))
        trainer = start_trainer(TORCH_TRAINER, config, home / "out.json", *args)
        assert trainer.wait(300) == -signal.SIGKILL
        daemon.stop()
        saved = torch.load(ckpt, weights_only=False)
        # what a torch user keeps for a host change: the loader's state, as JSON
        (positions / f"host{index}.json").write_text(json.dumps(saved["loader"]))
        before += saved["records"]
        shutil.rmtree(home / "state", ignore_errors=True)
    assert 0 < len(before) < dataset["records"]
    trainers, outs, daemons = [], [], []
    for index in range(3):
        home = tmp_path / f"new{index}"
        config = _host_config(
            write_config, home, hosts=3, index=index, epochs=1, resume_from=positions
        )
        daemons.append(run_daemon(config))
        outs.append(home / "out.json")
        trainers.append(
            start_trainer(TORCH_TRAINER, config, outs[-1], str(home / "ckpt.pt"), "--workers", "2")
        )
    after = [finish_trainer(t, out)["records"] for t, out in zip(trainers, outs, strict=True)]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    got = Counter(before) + Counter(rid for host in after for _, rid in host)
    assert got == Counter(dataset["ids"]), "records lost or trained twice across the host change"


def _keras_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def test_a_keras_job_resumes_on_another_number_of_hosts(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """2 hosts of a Keras job (``model.fit`` with ``PositionCheckpoint``, whose position is
    a ``TrainingPosition``'s) SIGKILLed in epoch 0; resumed on 3 hosts from the positions saved
    with the last checkpoints: epoch 0's records once in all, epoch 1's once on the new hosts."""
    pytest.importorskip("tensorflow")
    dataset = upload("tfrecord", SIZES, seed=29)
    positions = tmp_path / "positions"
    positions.mkdir()
    before: list[int] = []
    for index in range(2):
        home = tmp_path / f"old{index}"
        config = _host_config(write_config, home, hosts=2, index=index, epochs=2)
        daemon = run_daemon(config)
        out, checkpoints = home / "fit.jsonl", home / "ckpt"
        args = (str(checkpoints), "--epochs", "2", "--save-freq", "3", "--die-at", "0:7")
        assert start_trainer(KERAS_TRAINER, config, out, *args).wait(300) == -signal.SIGKILL
        daemon.stop()
        lines = _keras_lines(out)
        marks = [i for i, line in enumerate(lines) if line.get("saved")]
        assert marks, "no checkpoint before the kill"
        before += [rid for line in lines[: marks[-1]] for rid in line.get("ids", [])]
        shutil.copy(checkpoints / "prefetchd-position.json", positions / f"host{index}.json")
        shutil.rmtree(home / "state", ignore_errors=True)
    trainers, outs, daemons = [], [], []
    for index in range(3):
        home = tmp_path / f"new{index}"
        config = _host_config(
            write_config, home, hosts=3, index=index, epochs=2, resume_from=positions
        )
        daemons.append(run_daemon(config))
        outs.append(home / "fit.jsonl")
        fit = (str(home / "ckpt"), "--epochs", "2", "--save-freq", "3")
        trainers.append(start_trainer(KERAS_TRAINER, config, outs[-1], *fit))
    for trainer in trainers:
        assert trainer.wait(300) == 0
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    after = [line for out in outs for line in _keras_lines(out)]
    ids = Counter(dataset["ids"])
    epoch0 = Counter(before) + Counter(
        rid for line in after if line.get("epoch") == 0 for rid in line.get("ids", [])
    )
    assert epoch0 == ids, "epoch 0: records lost or trained twice across the host change"
    epoch1 = Counter(rid for line in after if line.get("epoch") == 1 for rid in line.get("ids", []))
    assert epoch1 == ids, "epoch 1: records lost or trained twice"
