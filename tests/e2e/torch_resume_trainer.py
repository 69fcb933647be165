"""A PyTorch trainer that checkpoints as PyTorch users do: ``StatefulDataLoader`` over
``prefetchd.torch.RecordDataset``, its ``state_dict()`` saved with the "model" every few steps.

    python -m tests.e2e.torch_resume_trainer CONFIG OUT.json CKPT [--workers K]
        [--persistent] [--save-every N] [--crash-after N] [--resume]

The checkpoint (``torch.save``, atomic) holds the loader's state and the records trained so
far (what a model's weights would have learnt). ``--crash-after N`` dies by SIGKILL after the
N-th batch reached the loop; ``--resume`` loads CKPT first. After each save the trainer calls
``dataset.saved(state)``, which frees the shards the saved state covers.

Writes ``{"records": [[epoch, id], ...] (trained since the start, or since the resumed
checkpoint), "first_batch_s": seconds from start of iteration to the first batch}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from prefetchd.example import parse
from prefetchd.torch import RecordDataset


def record_id(record: bytes) -> int:
    return int(parse(record)["id"][0])


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def save(path: Path, trained: list[int], loader: StatefulDataLoader) -> dict[str, Any]:
    state = loader.state_dict()
    tmp = path.with_suffix(".tmp")
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
    args = parser.parse_args()
    ckpt = Path(args.ckpt)
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
        loader.load_state_dict(saved["loader"])
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
    final = save(ckpt, trained, loader)
    freed = dataset.saved(final)
    if os.environ.get("PREFETCHD_DEBUG_STATE"):
        print(
            json.dumps(final, default=str),
            freed,
            os.listdir(dataset._layout.ram_claimed),
            file=sys.stderr,
        )
    result = {"records": [[0, r] for r in trained[before:]], "first_batch_s": first_batch}
    Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
