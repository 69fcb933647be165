"""End to end with PyTorch: ``prefetchd run`` against moto on 127.0.0.1, trainers reading through
``prefetchd.torch.RecordDataset`` in a ``DataLoader`` (``tests/e2e/torch_trainer.py``).

Every record reaches exactly one DataLoader worker (or DDP rank) once per epoch, and no
process of the trainer imports TensorFlow.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import finish_trainer, start_trainer

from .trainers import SIZES

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")  # the torch extra (scripts/_venv.sh installs the CPU build)

TRAINER = "tests.e2e.torch_trainer"
DDP_PORT = 25141  # this suite's port range is 25000-25999


def per_epoch(results: list[dict[str, Any]], epoch: int | None) -> Counter[int]:
    return Counter(rid for r in results for e, rid in r["records"] if e == epoch)


def assert_no_tensorflow(results: list[dict[str, Any]]) -> None:
    for result in results:
        assert not result["tensorflow"], "TensorFlow was imported by a torch trainer process"


@pytest.mark.parametrize("workers", [0, 2, 4])
def test_dataloader_workers_get_each_record_exactly_once(
    workers: int,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=11)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="128KiB")
    daemon = run_daemon(config)
    out = tmp_path / "torch.json"
    result = finish_trainer(start_trainer(TRAINER, config, out, "--workers", str(workers)), out)
    assert daemon.wait(120) == 0, daemon.output()

    assert per_epoch([result], None) == Counter(dataset["ids"]), "records lost or doubled"
    readers = {pid for _, pid in result["workers"]}
    if workers == 0:
        assert readers == {result["main_pid"]}
    else:
        assert result["main_pid"] not in readers, "records read in the main process"
        assert 1 <= len(readers) <= workers
    assert_no_tensorflow([result])


def test_persistent_workers_over_two_epochs_with_set_epoch(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=12)
    config = write_config(tmp_path, epochs__count=2, output__shard_size="128KiB")
    daemon = run_daemon(config)
    out = tmp_path / "torch.json"
    args = ("--workers", "2", "--persistent", "--passes", "2")
    result = finish_trainer(start_trainer(TRAINER, config, out, *args), out)
    assert daemon.wait(120) == 0, daemon.output()

    for epoch in (0, 1):
        assert per_epoch([result], epoch) == Counter(dataset["ids"]), f"epoch {epoch}"
    # the same two worker processes served both epochs (new ones each epoch would be up to 4)
    assert len({pid for _, pid in result["workers"]}) <= 2, "workers were not persistent"
    assert_no_tensorflow([result])


def test_two_ddp_ranks_on_one_host_share_one_daemon(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SIZES, seed=13)
    config = write_config(tmp_path, epochs__count=2, output__shard_size="64KiB")
    daemon = run_daemon(config)
    ranks = []
    for rank in (0, 1):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
        out = tmp_path / f"rank{rank}.json"
        args = ("--workers", "2", "--passes", "2", "--ddp", str(DDP_PORT))
        ranks.append((start_trainer(TRAINER, config, out, *args, env=env), out))
    results = [finish_trainer(proc, out) for proc, out in ranks]
    assert daemon.wait(120) == 0, daemon.output()

    for epoch in (0, 1):
        assert per_epoch(results, epoch) == Counter(dataset["ids"]), f"epoch {epoch}"
    assert all(r["total"] == 2 * dataset["records"] for r in results), "all_reduce disagrees"
    assert_no_tensorflow(results)
