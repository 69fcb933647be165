"""A Keras trainer as docs/keras.md writes one: ``model.fit(epochs=N)`` over prefetchd epochs,
``BackupAndRestore`` + ``prefetchd.keras.PositionCheckpoint`` for resume.

    python -m tests.e2e.keras_trainer CONFIG OUT.jsonl CHECKPOINT_DIR [--epochs N]
        [--save-freq N] [--die-at EPOCH:BATCH]

Appends one JSON line per trained batch to OUT.jsonl, ``{"epoch": e, "ids": [...]}`` (the ids
the model's train_step got), and ``{"epoch": e, "saved": true}`` after each checkpoint. With
``--die-at`` it SIGKILLs itself after that batch (0-based) of that epoch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import tensorflow as tf

import prefetchd.keras

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64)}
BATCH = 8


class Logged(keras.Model):  # type: ignore[misc]
    """A tiny regression model whose train_step writes down the ids it trains on."""

    def __init__(self, log: Any) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.log = log
        self.epoch = 0

    def call(self, x: Any) -> Any:
        return self.dense(x)

    def train_step(self, data: Any) -> Any:
        x, _ = data
        self.log.write(
            json.dumps({"epoch": self.epoch, "ids": [int(i) for i in x[:, 0].numpy()]}) + "\n"
        )
        self.log.flush()
        return super().train_step(data)


class Journal(keras.callbacks.Callback):  # type: ignore[misc]
    """Marks checkpoints in the log (after BackupAndRestore and PositionCheckpoint saved) and
    dies at the requested batch."""

    def __init__(self, model: Logged, save_freq: int, die_at: tuple[int, int] | None) -> None:
        super().__init__()
        self.logged, self.save_freq, self.die_at = model, save_freq, die_at
        self.batches = 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.logged.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches += 1
        if self.batches % self.save_freq == 0:
            self.mark()
        if self.die_at == (self.logged.epoch, batch):
            os.kill(os.getpid(), signal.SIGKILL)

    def mark(self) -> None:
        self.logged.log.write(json.dumps({"epoch": self.logged.epoch, "saved": True}) + "\n")
        self.logged.log.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("checkpoints")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save-freq", type=int, default=3)
    parser.add_argument("--die-at", default=None)
    parser.add_argument("--mirrored", action="store_true", help="under a MirroredStrategy")
    args = parser.parse_args()
    die_at = tuple(map(int, args.die_at.split(":"))) if args.die_at else None
    resume = prefetchd.keras.PositionCheckpoint(
        args.config,
        os.path.join(args.checkpoints, "prefetchd-position.json"),
        batch_size=BATCH,
        save_freq=args.save_freq,
        timeout=120,
    )

    def example(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        value = tf.cast(tf.io.parse_single_example(record, FEATURES)["id"], tf.float32)
        return tf.reshape(value, (1,)), tf.reshape(value, (1,))

    data = resume.dataset().map(example).batch(BATCH)
    scope = tf.distribute.MirroredStrategy().scope() if args.mirrored else contextlib.nullcontext()
    with open(args.out, "a", encoding="utf-8") as log, scope:
        model = Logged(log)
        model(tf.zeros((1, 1)))  # builds its variables (BackupAndRestore needs a built model)
        model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
        backup = keras.callbacks.BackupAndRestore(args.checkpoints, save_freq=args.save_freq)
        journal = Journal(model, args.save_freq, die_at)  # type: ignore[arg-type]
        model.fit(data, epochs=args.epochs, verbose=0, callbacks=[backup, resume, journal])
    return 0


if __name__ == "__main__":
    sys.exit(main())
