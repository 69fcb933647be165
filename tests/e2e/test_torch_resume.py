"""A PyTorch job killed mid-epoch (SIGKILL of the training process) and resumed from its last
saved ``StatefulDataLoader`` state trains every record of the epoch exactly once in total,
with 0, 2 and 4 DataLoader workers, persistent or not (``tests/e2e/torch_resume_trainer.py``
against ``prefetchd run`` on moto)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import ROOT, finish_trainer, log_tail, start_trainer

from .trainers import SIZES

pytestmark = pytest.mark.e2e
torch = pytest.importorskip("torch")
pytest.importorskip("torchdata.stateful_dataloader")

TRAINER = "tests.e2e.torch_resume_trainer"
DDP_PORTS = (25143, 25144)  # this suite's port range is 25000-25999 (test_torch.py: 25141)


@pytest.mark.parametrize(
    ("workers", "persistent"), [(0, False), (2, False), (2, True), (4, False), (4, True)]
)
def test_a_killed_torch_job_resumed_from_its_saved_state_trains_each_record_once(
    workers: int,
    persistent: bool,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Saves every 3 batches, dies 2 batches after a save (inside a shard: records of the
    shard in progress were trained, its others not)."""
    dataset = upload("tfrecord", SIZES, seed=41)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="64KiB")
    daemon = run_daemon(config)
    ckpt = tmp_path / "ckpt.pt"
    extra = ["--workers", str(workers), *(["--persistent"] if persistent else [])]
    first = start_trainer(
        TRAINER, config, tmp_path / "a.json", str(ckpt), *extra, "--crash-after", "11"
    )
    assert first.wait(300) == -signal.SIGKILL, log_tail(tmp_path / "a.json")
    saved = torch.load(ckpt, weights_only=False)
    before = Counter(saved["records"])
    assert 0 < sum(before.values()) < dataset["records"], "the kill was not mid-epoch"
    out = tmp_path / "b.json"
    resumed = finish_trainer(
        start_trainer(TRAINER, config, out, str(ckpt), *extra, "--resume"), out
    )
    assert daemon.wait(120) == 0, daemon.output()

    after = Counter(rid for epoch, rid in resumed["records"] if epoch == 0)
    assert before + after == Counter(dataset["ids"]), "records lost or trained twice"
    assert not set(before) & set(after), "a record trained before the save came again"


def test_the_docs_resume_recipe_runs_as_written_and_frees_every_shard(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """docs/pytorch.md's StatefulDataLoader recipe, run as is over the job's two epochs: it
    ends, its ``saved()`` calls free every shard (so the daemon finishes), and run again it
    resumes from its checkpoint past the last epoch and trains nothing more."""
    text = (ROOT / "docs" / "pytorch.md").read_text()
    section = text.split("\n## Resuming mid-epoch", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "docs/pytorch.md has no resume recipe"
    script = tmp_path / "train_resume.py"
    script.write_text(code.group(1))
    upload("tfrecord", SIZES, seed=45)
    config = write_config(tmp_path / "host", epochs__count=2, output__shard_size="64KiB")
    daemon = run_daemon(config)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script), str(config)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert daemon.wait(120) == 0, daemon.output()
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["epoch"] == 2


def test_two_ddp_ranks_killed_and_resumed_from_their_own_states_train_each_record_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Two DDP ranks (gloo, one host, 2 DataLoader workers each) save their own states
    (per-rank files), both die by SIGKILL mid-epoch, and both resume: every record of the
    epoch once over the four runs, counting what each rank's saved state covers."""
    dataset = upload("tfrecord", SIZES, seed=46)
    config = write_config(tmp_path, epochs__count=1, output__shard_size="64KiB")
    daemon = run_daemon(config)
    ckpt = tmp_path / "ckpt.pt"

    def ranks(port: int, *extra: str) -> list[tuple[Any, Path]]:
        started = []
        for rank in (0, 1):
            env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
            out = tmp_path / f"rank{rank}-{port}.json"
            args = (str(ckpt), "--workers", "2", "--ddp", str(port), *extra)
            started.append((start_trainer(TRAINER, config, out, *args, env=env), out))
        return started

    for proc, out in ranks(DDP_PORTS[0], "--crash-after", "11"):
        assert proc.wait(300) == -signal.SIGKILL, log_tail(out)
    saved = [torch.load(f"{ckpt}.rank{r}", weights_only=False)["records"] for r in (0, 1)]
    before = Counter(saved[0]) + Counter(saved[1])
    assert 0 < sum(before.values()) < dataset["records"], "the kill was not mid-epoch"
    results = [finish_trainer(proc, out) for proc, out in ranks(DDP_PORTS[1], "--resume")]
    assert daemon.wait(120) == 0, daemon.output()

    after = Counter(rid for r in results for epoch, rid in r["records"] if epoch == 0)
    assert before + after == Counter(dataset["ids"]), "records lost or trained twice"
