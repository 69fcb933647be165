"""A PyTorch trainer that checkpoints as PyTorch users do: ``StatefulDataLoader`` over
``prefetchd.torch.RecordDataset``, its ``state_dict()`` saved with the "model" every few steps.

    python -m tests.e2e.torch_resume_trainer CONFIG OUT.json CKPT [--workers K]
        [--persistent] [--save-every N] [--crash-after N] [--resume] [--ddp PORT]

The checkpoint (``torch.save``, atomic) holds the loader's state and the records trained so
far (what a model's weights would have learnt). ``--crash-after N`` dies by SIGKILL after the
N-th batch reached the loop; ``--resume`` loads CKPT first. After each save the trainer calls
``dataset.saved(state)``, which frees the shards the saved state covers.

Writes ``{"records": [[epoch, id], ...] (trained since the start, or since the resumed
checkpoint), "first_batch_s": seconds from start of iteration to the first batch}``.

``--ddp PORT``: a DDP rank (RANK, WORLD_SIZE from the environment, gloo on 127.0.0.1:PORT) with
its own checkpoint (CKPT.rank<RANK>); resuming, it takes its shards back with
``dataset.resume(state)`` and waits for every rank before its first batch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetchd.example import parse
from prefetchd.torch import RecordDataset


def record_id(record: bytes) -> int:
    return int(parse(record)["id"][0])


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def save(path: Path, trained: list[int], loader: StatefulDataLoader) -> dict[str, Any]:
    state: dict[str, Any] = loader.state_dict()
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"records": list(trained), "loader": state}, tmp)
    os.replace(tmp, path)
    return state


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("ckpt")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--crash-after", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--ddp", type=int, default=None, metavar="PORT")
    args = parser.parse_args()
    ckpt = Path(args.ckpt)
    if args.ddp is not None:
        rank = int(os.environ["RANK"])
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.ddp}",
            rank=rank,
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=120),
        )
        ckpt = ckpt.with_name(f"{ckpt.name}.rank{rank}")
    dataset = RecordDataset(args.config, timeout=120, transform=record_id)
    loader = StatefulDataLoader(
        dataset,
        batch_size=4,
        collate_fn=as_list,
        num_workers=args.workers,
        persistent_workers=args.persistent and args.workers > 0,
    )
    trained: list[int] = []
    if args.resume:
        saved = torch.load(ckpt, weights_only=False)
        trained = list(saved["records"])
        if args.ddp is not None:
            dataset.resume(saved["loader"])
        loader.load_state_dict(saved["loader"])
    if args.ddp is not None:
        dist.barrier()  # every rank took its shards back before any claims one
    before = len(trained)
    dataset.set_epoch(0)
    start, first_batch = time.monotonic(), None
    for step, batch in enumerate(loader, start=1):
        if first_batch is None:
            first_batch = time.monotonic() - start
            print(f"first batch after {first_batch:.3f} s", file=sys.stderr, flush=True)
        trained.extend(batch)  # the "model" finished these records
        if step % args.save_every == 0:
            dataset.saved(save(ckpt, trained, loader))
        if args.crash_after is not None and step >= args.crash_after:
            os.kill(os.getpid(), signal.SIGKILL)
    dataset.saved(save(ckpt, trained, loader))
    if args.ddp is not None:
        dist.destroy_process_group()
    result = {"records": [[0, r] for r in trained[before:]], "first_batch_s": first_batch}
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
