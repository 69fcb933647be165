"""A trainer process that records what each record *is*, for inputs without an ``id``
feature (lines, tar, raw, plugins): the SHA-256 of every record's bytes, CRC checked.

    python -m tests.faults.digest_reader CONFIG OUT.json [--timeout S]

Writes ``{"shards": [...], "records": [[epoch, sha256], ...]}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from prefetchd import ready_files
from prefetchd.kernel.framing import read_records
from prefetchd.layout import parse_shard_name


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    shards: list[str] = []
    records: list[tuple[int, str]] = []
    for path in ready_files(args.config, timeout=args.timeout):
        name = os.path.basename(path).partition("-")[2]
        parsed = parse_shard_name(name)
        assert parsed is not None, path
        with open(path, "rb") as f:
            records.extend((parsed[0], hashlib.sha256(r).hexdigest()) for r in read_records(f))
        shards.append(name)
    Path(args.out).write_text(json.dumps({"shards": shards, "records": records}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
