"""TensorFlow as users write it, against the real daemon and moto: multi-worker
``experimental_distribute_dataset``, Keras ``fit`` with resume after SIGKILL, and trainers that
have no TF_CONFIG; and, without prefetchd, the Keras failure that keeps ``fit`` off
``MultiWorkerMirroredStrategy``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import ROOT, finish_trainer, log_tail, start_trainer
from tests.conftest import wait_for

pytestmark = pytest.mark.e2e

SMALL = [3 * 1024, 9 * 1024, 17 * 1024, 30 * 1024, 5 * 1024, 12 * 1024, 24 * 1024, 7 * 1024]


def port_range() -> range:
    """The ports tf.distribute's servers may use: ``PREFETCHD_TEST_PORTS`` ("FIRST-LAST") when
    set, so engineers sharing a machine keep to their own ranges, else 24100-24999."""
    first, _, last = os.environ.get("PREFETCHD_TEST_PORTS", "24100-24999").partition("-")
    return range(int(first), int(last) + 1)


def free_ports(n: int) -> list[int]:
    """``n`` free ports of ``port_range()`` on 127.0.0.1 (for tf.distribute's servers)."""
    ports = []
    for port in port_range():
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    pytest.fail(f"no {n} free ports in {port_range()}")


def tf_config(ports: list[int], index: int) -> str:
    workers = [f"127.0.0.1:{p}" for p in ports]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def test_ready_files_needs_no_tf_config_with_num_workers_auto(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Regression: the trainer raised ConfigError for `num_workers: auto` without TF_CONFIG."""
    dataset = upload("tfrecord", SMALL, seed=3)
    config = write_config(tmp_path, epochs__count=1, sharding={"num_workers": "auto"})
    run_daemon(config, env={"TF_CONFIG": tf_config([24001], 0)})  # one worker: every record
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    out = tmp_path / "c.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.consume", str(config), str(out)],
        stderr=open(out.with_suffix(".log"), "wb"),  # noqa: SIM115 (closed with the process)
        cwd=ROOT,
        env=env,
    )
    result = finish_trainer(proc, out, timeout=240)
    assert Counter(rid for _, rid in result["records"]) == Counter(dataset["ids"])


def test_two_workers_with_multi_worker_mirrored_strategy_train_on_every_record_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Regression: TF's default auto-shard policy sharded each host's share again, and 185 of
    319 records never reached the model. Hosts' shares differ in size: the worker that runs out
    first must neither hang the other nor make it drop records."""
    dataset = upload("tfrecord", SMALL * 2, seed=5)
    ports = free_ports(2)
    trainers = []
    for index in range(2):
        config = write_config(
            tmp_path / f"host{index}",
            epochs__count=1,
            output__shard_size="64KiB",
            sharding={"num_workers": "auto"},
        )
        env = {"TF_CONFIG": tf_config(ports, index)}
        run_daemon(config, env=env)
        out = tmp_path / f"worker{index}.json"
        trainers.append((start_trainer("tests.e2e.multiworker", config, out, env=env), out))
    results = [finish_trainer(proc, out, timeout=300) for proc, out in trainers]
    seen = Counter(rid for r in results for _, rid in r["records"])
    assert seen == Counter(dataset["ids"]), "records lost or trained twice across the workers"
    assert all(r["records"] for r in results), "one worker got no share"
    assert results[0]["steps"] == results[1]["steps"], "the workers ran different step counts"
    assert results[0]["global"] == len(dataset["ids"])


def test_two_workers_keras_fit_under_multi_worker_mirrored_strategy_trains_every_record_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """``model.fit(epochs=2)`` under a two-worker ``MultiWorkerMirroredStrategy``, written as
    docs/multi-worker.md says for Keras 3.15: every record of each epoch trained exactly once
    across the workers, both workers run the same steps, and no epoch's end hangs although
    the hosts' shares differ."""
    dataset = upload("tfrecord", SMALL * 2, seed=11)
    ports = free_ports(2)
    trainers = []
    for index in range(2):
        host = tmp_path / f"host{index}"
        config = write_config(
            host, epochs__count=2, output__shard_size="64KiB", sharding={"num_workers": "auto"}
        )
        env = {"TF_CONFIG": tf_config(ports, index)}
        run_daemon(config, env=env)
        out = tmp_path / f"worker{index}.json"
        args = (str(host / "ckpt"), "--epochs", "2")
        trainers.append(
            (start_trainer("tests.e2e.keras_multiworker", config, out, *args, env=env), out)
        )
    results = [finish_trainer(proc, out, timeout=300) for proc, out in trainers]
    for epoch in range(2):
        seen = Counter(rid for r in results for e, rid in r["records"] if e == epoch)
        assert seen == Counter(dataset["ids"]), f"epoch {epoch}: records lost or trained twice"
        assert all(any(e == epoch for e, _ in r["records"]) for r in results), "a worker got none"
    assert results[0]["steps"] == results[1]["steps"], "the workers ran different step counts"


def keras_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def trained_before_last_checkpoint(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batch lines up to the last checkpoint mark: what the saved model had trained on."""
    marks = [i for i, line in enumerate(lines) if line.get("saved")]
    return lines[: marks[-1]] if marks else []


def test_keras_fit_killed_mid_epoch_resumes_from_its_checkpoint_exactly_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SMALL * 2, seed=7)
    config = write_config(tmp_path, epochs__count=3, output__shard_size="64KiB")
    daemon = run_daemon(config)
    out, checkpoints = tmp_path / "fit.jsonl", tmp_path / "ckpt"
    args = (str(checkpoints), "--epochs", "3", "--save-freq", "3")
    first = start_trainer("tests.e2e.keras_trainer", config, out, *args, "--die-at", "1:7")
    assert first.wait(300) == -9, f"the trainer was not killed: {log_tail(out)}"
    before = keras_lines(out)
    killed_in = {line["epoch"] for line in before if "ids" in line}
    assert killed_in == {0, 1}, "the kill did not happen in epoch 1"
    out.rename(tmp_path / "fit-first.jsonl")
    second = start_trainer("tests.e2e.keras_trainer", config, out, *args)
    assert second.wait(300) == 0, f"the restarted trainer failed: {log_tail(out)}"
    assert daemon.wait(120) == 0, daemon.output()
    after = keras_lines(out)
    kept = trained_before_last_checkpoint(before)
    redo = before[len(kept) :]
    for epoch in range(3):
        lines = [line for line in kept + after if line.get("epoch") == epoch]
        trained = Counter(rid for line in lines for rid in line.get("ids", []))
        assert trained == Counter(dataset["ids"]), f"epoch {epoch}: records lost or repeated"
    # Trained after the last checkpoint, so not in the saved model: these must come again.
    lost_with_the_kill = {rid for line in redo for rid in line.get("ids", [])}
    assert lost_with_the_kill, "the kill came right at a checkpoint: nothing to train again"
    again = {rid for line in after if line.get("epoch") == 1 for rid in line.get("ids", [])}
    assert lost_with_the_kill <= again


def test_keras_fit_under_a_strategy_loses_nothing_to_the_batch_keras_draws_to_build(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Keras draws one batch from a throwaway iterator under a strategy: its shards must come
    back to the stream, not be freed untrained."""
    dataset = upload("tfrecord", SMALL, seed=9)
    config = write_config(tmp_path, epochs__count=2, output__shard_size="64KiB")
    daemon = run_daemon(config)
    out = tmp_path / "fit.jsonl"
    args = (str(tmp_path / "ckpt"), "--epochs", "2", "--mirrored")
    trainer = start_trainer("tests.e2e.keras_trainer", config, out, *args)
    assert trainer.wait(300) == 0, f"the trainer failed: {log_tail(out)}"
    assert daemon.wait(120) == 0, daemon.output()
    lines = keras_lines(out)
    for epoch in range(2):
        mine = [line.get("ids", []) for line in lines if line.get("epoch") == epoch]
        trained = Counter(r for ids in mine for r in ids)
        assert trained == Counter(dataset["ids"]), f"epoch {epoch}: records lost or repeated"


def test_keras_fit_trains_one_prefetchd_epoch_per_keras_epoch_with_endless_epochs(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """``epochs.count: null``: the daemon goes on producing epochs; ``fit(epochs=2)`` trains
    epochs 0 and 1, each exactly once, and returns."""
    dataset = upload("tfrecord", SMALL, seed=19)
    config = write_config(tmp_path, epochs__count=None, output__shard_size="64KiB")
    run_daemon(config)
    out = tmp_path / "fit.jsonl"
    args = (str(tmp_path / "ckpt"), "--epochs", "2")
    trainer = start_trainer("tests.e2e.keras_trainer", config, out, *args)
    assert trainer.wait(300) == 0, f"the trainer failed: {log_tail(out)}"
    lines = keras_lines(out)
    assert {line["epoch"] for line in lines} == {0, 1}
    for epoch in range(2):
        mine = [line.get("ids", []) for line in lines if line.get("epoch") == epoch]
        trained = Counter(r for ids in mine for r in ids)
        assert trained == Counter(dataset["ids"]), f"epoch {epoch}: records lost or repeated"


def fit_on_two_workers(tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    """Run ``tests.e2e.keras_multiworker_fit`` (no prefetchd) in ``mode`` on two workers with
    ``MultiWorkerMirroredStrategy``; their reports."""
    ports = free_ports(2)
    workers = []
    for index in range(2):
        out = tmp_path / f"{mode}{index}.json"
        with open(out.with_suffix(".log"), "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.keras_multiworker_fit", str(out), mode],
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=ROOT,
                env={**os.environ, "TF_CONFIG": tf_config(ports, index)},
            )
        workers.append((proc, out))
    return [finish_trainer(proc, out, timeout=240) for proc, out in workers]


KERAS_FIXED = (
    "Keras now trains under MultiWorkerMirroredStrategy (keras-team/keras#20585 fixed?): "
    "drop the workaround from docs/multi-worker.md and tests/e2e/keras_multiworker.py"
)


@pytest.mark.parametrize(
    ("mode", "where", "message"),
    [
        # The first (x, y) batch is reduced eagerly to build the model, and in multi-worker
        # mode strategy.reduce takes one distributed value, not a tuple of them.
        ("standard", "trainer.py:_maybe_symbolic_build", "with an unsupported type"),
        ("from-function", "trainer.py:_maybe_symbolic_build", "with an unsupported type"),
        # With one-tensor batches that passes; then each step's scalar logs are reduced with
        # axis=0, which a scalar does not have.
        ("packed", "trainer.py:_reduce", "Invalid reduction dimension 0"),
    ],
)
def test_keras_fit_under_multi_worker_mirrored_strategy_fails_in_keras_without_prefetchd(
    tmp_path: Path, mode: str, where: str, message: str
) -> None:
    """Documents a Keras limitation (keras-team/keras#20585, Keras 3.15): ``fit`` under a
    two-worker ``MultiWorkerMirroredStrategy`` fails before it trains, with no prefetchd
    involved: a ``Dataset.range`` pipeline with auto-sharding off, a model built and compiled
    in ``strategy.scope()`` with known shapes, ``jit_compile=False``, ``steps_per_epoch``.

    When this test fails because ``fit`` trained, Keras has fixed it: say so in
    docs/multi-worker.md, use plain ``(x, y)`` batches there, and delete this test."""
    for result in fit_on_two_workers(tmp_path, mode):
        assert not result["trained"], KERAS_FIXED
        assert (result["error"], result["where"]) == ("ValueError", where), result
        assert message in result["message"], result


def test_keras_fit_under_multi_worker_mirrored_strategy_trains_with_the_workaround(
    tmp_path: Path,
) -> None:
    """The workaround docs/multi-worker.md gives, without prefetchd: one-tensor batches and
    logs with a batch axis; ``fit`` trains both epochs on both workers."""
    for result in fit_on_two_workers(tmp_path, "workaround"):
        assert result.get("trained"), result
        assert len(result["loss"]) == 2


def journal(out: Path) -> list[dict[str, Any]]:
    """The lines a ``tests.e2e.mwms_resume_trainer`` run wrote (the last may be cut short)."""
    lines = []
    for text in out.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            break  # the kill cut the last line short
    return lines


def wait_for_position(directory: Path, *, save: int = 0, epoch: int = 0) -> None:
    """Until ``directory`` holds a saved position of save number ``save`` or later whose first
    epoch still to train is ``epoch`` or later (bounded: fails after 120 s)."""

    def saved() -> bool:
        for path in directory.glob("prefetchd-position-*.json"):
            try:
                position = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being written
            if int(path.stem.rsplit("-", 1)[1]) >= save and position["epoch"] >= epoch:
                return True
        return False

    wait_for(saved, 120, f"a position of save {save}+ and epoch {epoch}+ in {directory}")


def test_multi_worker_mirrored_workers_all_killed_resume_from_the_save_all_finished_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Two ``MultiWorkerMirroredStrategy`` workers, each with its own daemon and its own
    checkpoints (docs/multi-worker.md's resume recipe, every 4 steps and at each epoch's end),
    are all killed twice: mid-epoch, and at the checkpoint after epoch 0's last step. Each time
    worker 1 dies after saving its model and before saving its position, so worker 0, which
    finished that save, must go back one save (the second time across the end of the epoch).
    Over the three runs every record of both epochs is trained exactly once, counting what the
    restored checkpoints hold."""
    dataset = upload("tfrecord", SMALL * 2, seed=13)
    ports = free_ports(2)
    configs = [
        write_config(
            tmp_path / f"host{index}",
            epochs__count=2,
            output__shard_size="64KiB",
            sharding={"num_workers": "auto"},
        )
        for index in range(2)
    ]
    daemons = [
        run_daemon(config, env={"TF_CONFIG": tf_config(ports, index)})
        for index, config in enumerate(configs)
    ]
    checkpoints = tmp_path / "ckpt"

    def start(run: int, *worker1: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
        started = []
        for index, config in enumerate(configs):
            out = tmp_path / f"run{run}-worker{index}.jsonl"
            args = (str(checkpoints), "--epochs", "2", "--save-every", "4")
            extra = worker1 if index == 1 else ()
            env = {"TF_CONFIG": tf_config(ports, index)}
            trainer = "tests.e2e.mwms_resume_trainer"
            started.append((start_trainer(trainer, config, out, *args, *extra, env=env), out))
        return started

    def crash(run: int, die: str, **worker0_saved: int) -> None:
        (first, first_out), (second, second_out) = start(run, "--die-saving", die)
        assert second.wait(300) == -signal.SIGKILL, log_tail(second_out)
        # worker 0 finished that save, then waits for worker 1 in the next all-reduce
        wait_for_position(checkpoints / "worker0", **worker0_saved)
        first.kill()
        assert first.wait(60) == -signal.SIGKILL, log_tail(first_out)

    crash(0, "20", save=5)  # saves at steps 4, 8, 12, 16, 20
    crash(1, "end0", epoch=1)
    for proc, out in start(2):
        assert proc.wait(300) == 0, log_tail(out)
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()

    runs = [[journal(tmp_path / f"run{r}-worker{w}.jsonl") for w in range(2)] for r in range(3)]
    restored = [[lines[0]["restored"] for lines in run] for run in runs]
    epoch0_end = max(line["step"] for line in runs[1][0] if line.get("epoch") == 0)
    assert restored[0] == [0, 0]
    assert restored[1] == [16, 16], "the workers did not agree on the last save both finished"
    assert restored[2][0] == restored[2][1], "the workers restored different saves"
    assert epoch0_end - 4 < restored[2][0] <= epoch0_end, "not the last save inside epoch 0"
    assert all(lines[-1] == {"finished": True} for lines in runs[2])
    trained: Counter[tuple[int, int]] = Counter()
    for r, run in enumerate(runs):
        kept_until = restored[r + 1][0] if r < 2 else None  # what the next run restored
        for lines in run:
            for line in lines:
                if "ids" in line and (kept_until is None or line["step"] <= kept_until):
                    trained.update((line["epoch"], rid) for rid in line["ids"])
    for epoch in range(2):
        got = Counter({rid: n for (e, rid), n in trained.items() if e == epoch})
        assert got == Counter(dataset["ids"]), f"epoch {epoch}: records lost or trained twice"
