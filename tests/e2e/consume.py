"""A trainer process as users write it: ``ready_files()`` + ``TFRecordDataset``.

    python -m tests.e2e.consume CONFIG OUT.json [--epoch K] [--delay SECONDS] [--digest]

(from the repository root, as ``testkit.trainers`` starts it; ``python consume.py`` works too).

Writes ``{"shards": [...], "records": [[epoch, id], ...]}`` where ``id`` is the Example's
``id`` feature (tfrecord datasets), its ``data`` feature (lines datasets: each line is unique)
or its ``key`` feature (raw and tar datasets). With ``--digest``, raw records are
``"<key> <sha256 of data>"``, so a test can tell that the bytes, not just the keys, arrived.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

from prefetchd import ready_files
from prefetchd.layout import parse_shard_name


def record_id(serialized: bytes, digest: bool = False) -> int | str:
    features = tf.train.Example.FromString(serialized).features.feature
    if "id" in features:
        return int(features["id"].int64_list.value[0])
    if "line_number" in features:
        return str(features["data"].bytes_list.value[0].decode())
    key: str = features["key"].bytes_list.value[0].decode("utf-8", "surrogateescape")
    if digest:
        return f"{key} {hashlib.sha256(features['data'].bytes_list.value[0]).hexdigest()}"
    return key


def read_with_dataset(config: str, out: str) -> int:
    """The one-line pipeline; epochs are told apart by counting each id's deliveries."""
    import prefetchd.tf

    ids = [record_id(raw.numpy()) for raw in prefetchd.tf.dataset(config, timeout=120)]
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"shards": [], "records": [[None, i] for i in ids]}, f)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("--epoch", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.0, help="pause after each shard")
    parser.add_argument(
        "--tf-dataset", action="store_true", help="read through prefetchd.tf.dataset() instead"
    )
    parser.add_argument("--digest", action="store_true", help="raw records: key and SHA-256")
    args = parser.parse_args()
    if args.tf_dataset:
        return read_with_dataset(args.config, args.out)
    shards: list[str] = []
    records: list[tuple[int, int | str]] = []
    for path in ready_files(args.config, epoch=args.epoch, timeout=120):
        name = os.path.basename(path).partition("-")[2]
        parsed = parse_shard_name(name)
        assert parsed is not None, path
        shards.append(name)
        compression = "GZIP" if path.endswith(".gz") else ""
        for raw in tf.data.TFRecordDataset(path, compression_type=compression):
            records.append((parsed[0], record_id(raw.numpy(), args.digest)))
        time.sleep(args.delay)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"shards": shards, "records": records}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
