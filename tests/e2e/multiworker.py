"""A MultiWorkerMirroredStrategy trainer as the TF guides write one, on prefetchd's shards.

    python -m tests.e2e.multiworker CONFIG OUT.json

TF_CONFIG (from the environment) names this worker; its own daemon serves CONFIG. Every step
all-reduces the number of records the workers trained on, as a gradient all-reduce would, so a
worker that ran out of steps early would hang its peers. Writes ``{"records": [[0, id], ...],
"steps": n, "global_records": total}``: the ids this worker's replica trained on.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

import prefetchd.tf

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64)}


def main() -> int:
    config, out = sys.argv[1], sys.argv[2]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    records = prefetchd.tf.dataset(config, epoch=0, timeout=120)
    ids = records.map(lambda r: tf.io.parse_single_example(r, FEATURES)["id"]).batch(8)
    batches = strategy.experimental_distribute_dataset(ids)

    def replica_step(batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        total = tf.distribute.get_replica_context().all_reduce("SUM", tf.size(batch))
        return batch, total

    @tf.function
    def step(batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return strategy.run(replica_step, args=(batch,))  # type: ignore[no-any-return]

    seen: list[int] = []
    steps = global_records = 0
    for batch in batches:
        local, total = step(batch)
        for part in strategy.experimental_local_results(local):
            seen.extend(int(i) for i in part.numpy())
        global_records += int(strategy.experimental_local_results(total)[0])
        steps += 1
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"records": [[0, i] for i in seen], "steps": steps, "global": global_records}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
