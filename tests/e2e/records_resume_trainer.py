"""A framework-free trainer that checkpoints ``prefetchd.records()``'s position with its
"model" (the records trained so far) and can be killed and resumed.

    python -m tests.e2e.records_resume_trainer CONFIG OUT.json CKPT --epochs N
        [--save-every N] [--crash-after N [--crash-epoch K]] [--resume] [--tokens]

Epoch by epoch, ``records(config, epoch=k, position=...)``; every ``--save-every`` records it
saves ``{"position": stream.position(), "epoch": k, "records": [[epoch, id], ...]}`` to CKPT
(atomically); ``--crash-after N`` dies by SIGKILL after the N-th record (of epoch K, with
``--crash-epoch K``); ``--resume`` starts from CKPT. Writes ``{"records": [[epoch, id],
...]}`` trained by this run. ``--tokens``: a record's id is the text before ``|`` of its first
``t``, ``data`` or ``txt`` feature (the records of tests/e2e/test_mixed_sources.py) instead of
its ``id`` feature.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import prefetchd
from prefetchd.example import parse


def save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def token(record: bytes) -> str:
    features = parse(record)
    value = next(features[name][0] for name in ("t", "data", "txt") if name in features)
    assert isinstance(value, bytes)
    return value.split(b"|", 1)[0].decode()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("ckpt")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--crash-after", type=int, default=None)
    parser.add_argument("--crash-epoch", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--tokens", action="store_true")
    args = parser.parse_args()
    ckpt = Path(args.ckpt)
    position: dict[str, Any] = {}
    trained: list[list[Any]] = []
    if args.resume:
        saved = json.loads(ckpt.read_text())
        position, trained = saved["position"], saved["records"]
    before, count, counted = len(trained), 0, 0
    for epoch in range(position.get("epoch", 0), args.epochs):
        stream = prefetchd.records(args.config, epoch=epoch, timeout=120, position=position)
        for record in stream:
            rid = token(record) if args.tokens else int(parse(record)["id"][0])
            trained.append([epoch, rid])
            count += 1
            counted += args.crash_epoch in (None, epoch)
            if count % args.save_every == 0:
                save(ckpt, {"position": stream.position(), "records": trained})
            if args.crash_after is not None and counted >= args.crash_after:
                os.kill(os.getpid(), signal.SIGKILL)
        position = stream.position()
        save(ckpt, {"position": position, "records": trained})
    Path(args.out).write_text(json.dumps({"records": trained[before:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
