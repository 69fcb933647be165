"""Keras ``model.fit`` under ``MultiWorkerMirroredStrategy``, with no prefetchd at all.

    python -m tests.e2e.keras_multiworker_fit OUT.json [standard|from-function|packed|workaround]

The smallest trainer the TF multi-worker Keras tutorial describes: TF_CONFIG (from the
environment) names this worker, the data is a ``tf.data.Dataset.range`` with auto-sharding off
(as ``prefetchd.tf.dataset`` sets it), the model is built and compiled inside
``strategy.scope()`` with known input shapes and ``jit_compile=False``, and ``fit`` gets
``steps_per_epoch``. ``standard`` (the default) feeds ``(x, y)`` batches to a ``Sequential``
model; ``from-function`` is ``standard`` with the dataset distributed by
``strategy.distribute_datasets_from_function`` before ``fit``; ``packed`` feeds one tensor per
batch (``[x, y]`` per record) to a model that takes the label from it; ``workaround`` is
``packed`` whose ``train_step`` also gives its logs a batch axis (the recipe of
docs/multi-worker.md).

Writes ``{"trained": true, "loss": [...]}`` if ``fit`` returned, or ``{"trained": false,
"error": "ValueError", "message": "...", "where": "..."}`` naming the exception and the
innermost Keras function it came through. It exists to show that the failure of ``fit`` under
this strategy is Keras's (keras-team/keras#20585), not prefetchd's.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import tensorflow as tf

BATCH = 8
STEPS = 4


def batches(packed: bool) -> Any:
    """Batches of one feature and its label: ``(x, y)``, or one tensor ``[x, y]`` per record."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    values = tf.data.Dataset.range(BATCH * STEPS).map(lambda i: tf.cast(i, tf.float32) / 100.0)
    if packed:
        records = values.map(lambda v: tf.stack([v, v]))
    else:
        records = values.map(lambda v: (tf.reshape(v, (1,)), tf.reshape(v, (1,))))
    return records.batch(BATCH).with_options(options)


class Packed(keras.Model):  # type: ignore[misc]
    """A regression on one-tensor batches: the last column is the label."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, packed: Any) -> Any:
        return self.dense(packed[:, :-1])

    def compute_loss(self, x: Any = None, y: Any = None, *args: Any, **kwargs: Any) -> Any:
        return super().compute_loss(x, x[:, -1:], *args, **kwargs)


class Workaround(Packed):
    """``Packed`` whose logs have a batch axis, as the multi-worker reduce of logs needs."""

    def train_step(self, data: Any) -> Any:
        logs = super().train_step(data)
        return {name: tf.reshape(value, (1,)) for name, value in logs.items()}


def data(strategy: Any, mode: str) -> Any:
    """What ``fit`` gets in ``mode``: the batches, or them distributed by the strategy."""
    if mode == "from-function":
        return strategy.distribute_datasets_from_function(lambda context: batches(False))
    return batches(mode not in ("standard", "from-function"))


def build(mode: str) -> Any:
    """The model of ``mode``, built (known input shape) in the current strategy's scope."""
    if mode in ("standard", "from-function"):
        return keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model = Packed() if mode == "packed" else Workaround()
    model(tf.zeros((1, 2)))
    return model


def keras_frame(exc: BaseException) -> str:
    """The innermost Keras function the exception passed through (``file:function``)."""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if f"{os.sep}keras{os.sep}" in frame.filename:
            where = f"{os.path.basename(frame.filename)}:{frame.name}"
    return where


def main() -> int:
    out, mode = sys.argv[1], (sys.argv[2:] or ["standard"])[0]
    keras.config.disable_traceback_filtering()  # keep Keras's own frames in the traceback
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build(mode)
        model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    try:
        history = model.fit(data(strategy, mode), epochs=2, steps_per_epoch=STEPS, verbose=0)
    except Exception as exc:  # reported to the test, which judges it
        result = {
            "trained": False,
            "error": type(exc).__name__,
            "message": str(exc)[:2000],
            "where": keras_frame(exc),
        }
    else:
        result = {"trained": True, "loss": [float(v) for v in history.history["loss"]]}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
