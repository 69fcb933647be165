"""A light trainer process for the fault tests: ``ready_files()`` and a CRC-checking reader,
without TensorFlow (whose start-up would dominate these tests; the e2e tests read with TF).

    python -m tests.faults.reader CONFIG OUT.json [--epoch K] [--delay S] [--timeout S]
        [--resumable] [--checkpoint FILE [--checkpoint-every N]] [--resume FILE]
        [--crash-after N]

(from the repository root, so that ``testkit`` imports).

Writes ``{"shards": [...], "records": [[epoch, id], ...]}``. ``--checkpoint FILE`` saves, every
N shards, what a trainer's checkpoint holds: the records trained on so far and (with
``--resumable``) ``files.position()``. ``--crash-after N`` dies by SIGKILL (no clean-up) after
reading N shards. ``--resume FILE`` starts from the position in a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from prefetchd import ready_files
from prefetchd.kernel.framing import read_records
from prefetchd.layout import parse_shard_name
from testkit.sample_data import decode_example


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--epoch", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--resumable", action="store_true")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--crash-after", type=int, default=None)
    args = parser.parse_args()
    position = None
    if args.resume:
        position = json.loads(Path(args.resume).read_text())["position"]
    elif args.resumable:
        position = {}
    files = ready_files(args.config, epoch=args.epoch, timeout=args.timeout, position=position)
    shards: list[str] = []
    records: list[tuple[int, int]] = []
    out = Path(args.out)
    for path in files:
        name = os.path.basename(path).partition("-")[2]
        parsed = parse_shard_name(name)
        assert parsed is not None, path
        with open(path, "rb") as f:
            ids = [int(decode_example(r)["id"]) for r in read_records(f)]
        shards.append(name)
        records.extend((parsed[0], i) for i in ids)
        if args.checkpoint and len(shards) % args.checkpoint_every == 0:
            state = {"shards": shards, "records": records}
            if position is not None:
                state["position"] = files.position()
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, args.checkpoint)
        if args.crash_after is not None and len(shards) >= args.crash_after:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(args.delay)
    out.write_text(json.dumps({"shards": shards, "records": records}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
