"""A PyTorch trainer as users write it: ``prefetchd.torch.RecordDataset`` in a ``DataLoader``.

    python -m tests.e2e.torch_trainer CONFIG OUT.json [--workers K] [--passes N]
        [--persistent] [--ddp PORT]

``--passes N`` runs N passes over the loader with ``set_epoch(pass)`` before each (the
DistributedSampler habit); without it, one pass with no ``set_epoch`` (every epoch of the job).
``--ddp PORT`` joins a gloo process group on 127.0.0.1:PORT from the environment torchrun
sets (RANK, WORLD_SIZE), as a DDP trainer does, and all-reduces the record count at the end.

Writes ``{"shards": [], "records": [[epoch, id], ...], "workers": [[epoch, pid], ...],
"tensorflow": bool, "main_pid": pid, "total": n}``; ``tensorflow`` is true if any process
(main or worker) had TensorFlow in ``sys.modules`` while handing out a record.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from prefetchd.example import parse
from prefetchd.torch import RecordDataset


def tag(record: bytes) -> tuple[int, int, bool]:
    """Runs where the record is read (a worker): its id, who read it, whether TF is loaded."""
    return int(parse(record)["id"][0]), os.getpid(), "tensorflow" in sys.modules


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--passes", type=int, default=None)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--ddp", type=int, default=None, metavar="PORT")
    args = parser.parse_args()
    if args.ddp is not None:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.ddp}",
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=120),
        )
    dataset = RecordDataset(args.config, timeout=120, transform=tag)
    loader = DataLoader(
        dataset,
        batch_size=8,
        collate_fn=as_list,
        num_workers=args.workers,
        persistent_workers=args.persistent,
    )
    records: list[tuple[int | None, int]] = []
    workers: list[tuple[int | None, int]] = []
    tensorflow = "tensorflow" in sys.modules
    for epoch in range(args.passes) if args.passes is not None else [None]:
        if epoch is not None:
            dataset.set_epoch(epoch)
        for batch in loader:
            for rid, pid, tf_loaded in batch:
                records.append((epoch, rid))
                workers.append((epoch, pid))
                tensorflow = tensorflow or tf_loaded
    total = len(records)
    if args.ddp is not None:
        count = torch.tensor([total])
        dist.all_reduce(count)
        total = int(count.item())
        dist.destroy_process_group()
    result = {
        "shards": [],
        "records": records,
        "workers": workers,
        "tensorflow": tensorflow or "tensorflow" in sys.modules,
        "main_pid": os.getpid(),
        "total": total,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
