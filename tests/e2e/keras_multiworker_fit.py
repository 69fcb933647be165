"""Keras ``model.fit`` under ``MultiWorkerMirroredStrategy``, with no prefetchd at all.

    python -m tests.e2e.keras_multiworker_fit OUT.json

The smallest trainer the TF multi-worker Keras tutorial describes: TF_CONFIG (from the
environment) names this worker, the data is a ``tf.data.Dataset.range`` with auto-sharding off
(as ``prefetchd.tf.dataset`` sets it), the model is built and compiled inside
``strategy.scope()`` with known input shapes and ``jit_compile=False``, and ``fit`` gets
``steps_per_epoch``. Writes ``{"trained": true, "loss": [...]}`` if ``fit`` returned, or
``{"trained": false, "error": "ValueError", "message": "...", "where": "..."}`` naming the
exception and the innermost Keras function it came through. It exists to show that the
failure of ``fit`` under this strategy is Keras's (keras-team/keras#20585), not prefetchd's.
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


def pairs() -> Any:
    """``(x, y)`` batches of one feature, as a regression dataset would have them."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    values = tf.data.Dataset.range(BATCH * STEPS).map(lambda i: tf.cast(i, tf.float32) / 100.0)
    return values.map(lambda v: (tf.reshape(v, (1,)), tf.reshape(v, (1,)))).batch(BATCH)


def keras_frame(exc: BaseException) -> str:
    """The innermost Keras function the exception passed through (``file:function``)."""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if f"{os.sep}keras{os.sep}" in frame.filename:
            where = f"{os.path.basename(frame.filename)}:{frame.name}"
    return where


def main() -> int:
    out = sys.argv[1]
    keras.config.disable_traceback_filtering()  # keep Keras's own frames in the traceback
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    try:
        history = model.fit(pairs(), epochs=2, steps_per_epoch=STEPS, verbose=0)
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
