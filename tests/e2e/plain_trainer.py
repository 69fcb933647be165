"""A trainer with no framework at all: ``prefetchd.records()`` in a process where TensorFlow,
PyTorch, JAX and numpy cannot be imported (a meta-path blocker is installed first).

    python -m tests.e2e.plain_trainer CONFIG OUT.json [--epoch K] [--hold N GO_FILE]

Writes ``{"shards": [], "records": [[epoch, id], ...], "raw": [hex, ...], "blocked": [...]}``:
``epoch`` is the one asked for (or null), ``id`` the Example's ``id`` feature decoded with
``prefetchd.example.parse``, ``raw`` every record's bytes, ``blocked`` the framework imports
that were attempted (and refused). ``--hold N GO_FILE``: a resumable stream (``position={}``),
so read shards stay on the RAM disk; after N records the output is written and the trainer
waits (at most 120 s) for GO_FILE before finishing the stream, so a test can copy the shards.
"""

from __future__ import annotations

import argparse
import importlib.abc
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

FRAMEWORKS = ("tensorflow", "torch", "jax", "numpy")


class Blocker(importlib.abc.MetaPathFinder):
    """Refuses every framework import and remembers that one was tried."""

    def __init__(self) -> None:
        self.tried: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.partition(".")[0] in FRAMEWORKS:
            self.tried.append(fullname)
            raise ImportError(f"{fullname} is blocked in this trainer")


BLOCKER = Blocker()
sys.meta_path.insert(0, BLOCKER)

import prefetchd  # noqa: E402  (after the blocker, on purpose)
from prefetchd.example import parse  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--epoch", type=int, default=None)
    parser.add_argument("--hold", nargs=2, metavar=("N", "GO_FILE"), default=None)
    args = parser.parse_args()
    position: dict[str, Any] | None = {} if args.hold else None
    stream = prefetchd.records(args.config, epoch=args.epoch, timeout=120, position=position)
    records: list[tuple[int | None, int]] = []
    raw: list[str] = []
    for record in stream:
        records.append((args.epoch, int(parse(record)["id"][0])))
        raw.append(record.hex())
        if args.hold and len(records) == int(args.hold[0]):
            write(args.out, records, raw)
            wait_for(Path(args.hold[1]))
    leaked = [name for name in FRAMEWORKS if name in sys.modules]
    assert not leaked, f"imported {leaked}"
    write(args.out, records, raw)
    return 0


def write(out: str, records: list[tuple[int | None, int]], raw: list[str]) -> None:
    result = {"shards": [], "records": records, "raw": raw, "blocked": BLOCKER.tried}
    tmp = Path(out + ".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.rename(out)


def wait_for(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
