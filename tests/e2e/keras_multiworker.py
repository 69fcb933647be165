"""``model.fit`` under ``MultiWorkerMirroredStrategy`` on prefetchd, as docs/multi-worker.md
writes it for Keras 3.15 (whose ``fit`` fails on ``(x, y)`` batches under this strategy).

    python -m tests.e2e.keras_multiworker CONFIG OUT.json CHECKPOINT_DIR [--epochs N]

TF_CONFIG (from the environment) names this worker; its own daemon serves CONFIG. One
prefetchd epoch per Keras epoch through ``prefetchd.keras.PositionCheckpoint``. Writes
``{"records": [[epoch, id], ...], "steps": [steps of epoch 0, ...]}``: the ids this worker's
replica trained on, and how many steps each Keras epoch ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

import prefetchd.keras
from tests.e2e.keras_multiworker_fit import Workaround  # the docs' recipe, shown to train

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64)}
BATCH = 8  # per worker


class Journal(keras.callbacks.Callback):  # type: ignore[misc]
    """Notes each step's ids (the step's ``tf.py_function`` hands them over) per Keras epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0
        self.records: list[list[int]] = []
        self.steps: list[int] = []

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch
        self.steps.append(0)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.steps[-1] += 1

    def trained(self, ids: Any) -> np.ndarray:
        self.records.extend([self.epoch, int(i)] for i in ids.numpy())
        return np.zeros((), np.int64)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("checkpoints")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    os.makedirs(args.checkpoints, exist_ok=True)  # no model checkpoint here creates it
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    journal = Journal()
    position = prefetchd.keras.PositionCheckpoint(
        args.config,
        os.path.join(args.checkpoints, "prefetchd-position.json"),
        batch_size=BATCH,
        timeout=120,
    )

    def packed(record: tf.Tensor) -> tf.Tensor:
        value = tf.cast(tf.io.parse_single_example(record, FEATURES)["id"], tf.float32)
        return tf.stack([value, value])  # [feature, label]

    # Batched by the global batch size: the strategy splits each batch between the replicas.
    data = position.dataset().map(packed).batch(BATCH * strategy.num_replicas_in_sync)

    class Logged(Workaround):
        def train_step(self, data: Any) -> Any:
            ids = tf.cast(data[:, 0], tf.int64)
            with tf.control_dependencies([tf.py_function(journal.trained, [ids], tf.int64)]):
                return super().train_step(tf.identity(data))

    with strategy.scope():
        model = Logged()
        model(tf.zeros((1, 2)))
        model.compile(optimizer=keras.optimizers.SGD(1e-9), loss="mse", jit_compile=False)
    model.fit(data, epochs=args.epochs, verbose=0, callbacks=[position, journal])
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"records": journal.records, "steps": journal.steps}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
