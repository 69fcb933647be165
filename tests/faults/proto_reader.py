"""A trainer that parses every record with protobuf, as a TensorFlow trainer does:

    python -m tests.faults.proto_reader CONFIG OUT.json

Each record of each shard ``ready_files()`` yields goes through ``tf.train.Example.FromString``
(which raises on a feature name that is not UTF-8, and then this trainer dies as a real one
would). Writes ``{"shards": [...], "examples": [{feature name: its bytes value}, ...]}``, a value
as hex, or ``"sha256:<hex digest>"`` when it is over 1 KiB.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import tensorflow as tf

from prefetchd import ready_files
from prefetchd.kernel.framing import read_records


def shown(value: bytes) -> str:
    return value.hex() if len(value) <= 1024 else "sha256:" + hashlib.sha256(value).hexdigest()


def main() -> int:
    config, out = sys.argv[1], Path(sys.argv[2])
    shards: list[str] = []
    examples: list[dict[str, str]] = []
    for path in ready_files(config, timeout=120):
        shards.append(Path(path).name)
        with open(path, "rb") as f:
            for record in read_records(f):
                feature = tf.train.Example.FromString(record).features.feature
                examples.append({n: shown(feature[n].bytes_list.value[0]) for n in feature})
    out.write_text(json.dumps({"shards": shards, "examples": examples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
