"""The demo's small training loop: a tiny Keras model trained on prefetchd's shards.

Reads ``prefetchd.tf.dataset(config)``, parses the records written by ``testkit.sample_data``
(``id`` int64, ``payload`` bytes), turns the first 64 payload bytes into a float vector and
trains two Dense layers to tell whether the first byte is above 127 (a rule the model can learn,
so the loss visibly falls on random data). It reads until the data ends, so the daemon sees
every shard consumed and can exit; after ``--max-steps`` it keeps reading without training.

At the end it prints steps, records/s and MB/s delivered to the model, and how often each
record id arrived. With ``--expect SUMMARY.json`` (from ``testkit.sample_data --summary-json``) it
exits 1 unless every expected id arrived exactly ``--epochs`` times and nothing else did.

    python -m testkit.demo_train --config prefetchd.yaml --expect summary.json --epochs 2
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported

FEATURES = 64  # payload bytes per sample fed to the model
MB = 1e6


def build_model(tf: Any) -> Any:
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(FEATURES,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(1),  # a logit
        ]
    )


def make_parser(tf: Any) -> Any:
    """Batch of serialized Examples -> (features, labels, ids, serialized bytes)."""
    spec = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "payload": tf.io.FixedLenFeature([], tf.string),
    }

    def parse(serialized: Any) -> tuple[Any, Any, Any, Any]:
        parsed = tf.io.parse_example(serialized, spec)
        raw = tf.io.decode_raw(parsed["payload"], tf.uint8, fixed_length=FEATURES)
        x = tf.cast(raw, tf.float32) / 255.0
        y = tf.cast(x[:, 0] > 0.5, tf.float32)
        nbytes = tf.reduce_sum(tf.strings.length(serialized, unit="BYTE"))
        return x, y, parsed["id"], nbytes

    return parse


def make_train_step(tf: Any, model: Any) -> Any:
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.01)
    signature = [
        tf.TensorSpec([None, FEATURES], tf.float32),
        tf.TensorSpec([None], tf.float32),
    ]

    def step(x: Any, y: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)[:, 0]
            loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        accuracy = tf.reduce_mean(tf.cast(tf.equal(logits > 0, y > 0.5), tf.float32))
        return loss, accuracy

    return tf.function(step, input_signature=signature)


def _reason(exc: BaseException) -> str:
    """The Python error inside a TensorFlow one (the generator's TimeoutError, DaemonFailed)."""
    message = getattr(exc, "message", None) or str(exc)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Failed): ", line)]
    return named[-1] if named else (lines[0] if lines else type(exc).__name__)


def check_delivery(seen: collections.Counter[int], expected: list[int], epochs: int) -> list[str]:
    """Problems with exactly-once delivery: ids missing, repeated or unknown (empty if none)."""
    problems = []
    wanted = set(expected)
    missing = [i for i in expected if seen[i] < epochs]
    extra = [i for i in expected if seen[i] > epochs]
    unknown = [i for i in seen if i not in wanted]
    if missing:
        problems.append(
            f"{len(missing)} ids delivered fewer than {epochs} times, e.g. {missing[:5]}"
        )
    if extra:
        problems.append(f"{len(extra)} ids delivered more than {epochs} times, e.g. {extra[:5]}")
    if unknown:
        problems.append(f"{len(unknown)} ids that are not in the dataset, e.g. {unknown[:5]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the daemon's YAML config")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-steps", type=int, default=None, help="stop training (not reading)")
    parser.add_argument("--epoch", type=int, default=None, help="read only this epoch")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds without a new shard")
    parser.add_argument("--log-every", type=int, default=50, help="print progress every N steps")
    parser.add_argument("--expect", type=Path, help="testkit.sample_data --summary-json output")
    parser.add_argument("--epochs", type=int, default=1, help="times each expected id must arrive")
    args = parser.parse_args(argv)

    import tensorflow as tf

    import prefetchd
    import prefetchd.tf

    model = build_model(tf)
    train_step = make_train_step(tf, model)
    data = (
        prefetchd.tf.dataset(args.config, epoch=args.epoch, timeout=args.timeout)
        .batch(args.batch_size)
        .map(make_parser(tf), num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(2)
    )

    seen: collections.Counter[int] = collections.Counter()
    steps = records = nbytes = 0
    loss = accuracy = float("nan")
    started = time.monotonic()
    first: float | None = None
    print(f"training on {args.config} (batch {args.batch_size})", flush=True)
    try:
        for x, y, ids, size in data:
            if first is None:
                first = time.monotonic()
                print(f"first batch after {first - started:.1f} s", flush=True)
            seen.update(ids.numpy().tolist())
            records += int(ids.shape[0])
            nbytes += int(size)
            if args.max_steps is not None and steps >= args.max_steps:
                continue  # keep reading so every shard is consumed and the daemon can finish
            loss_t, accuracy_t = train_step(x, y)
            loss, accuracy = float(loss_t), float(accuracy_t)
            steps += 1
            if steps % args.log_every == 0:
                rate = nbytes / MB / max(time.monotonic() - first, 1e-9)
                print(
                    f"step {steps:5d}  loss {loss:.3f}  accuracy {accuracy:.2f}  "
                    f"records {records}  {rate:.1f} MB/s",
                    flush=True,
                )
    except (tf.errors.OpError, TimeoutError, prefetchd.DaemonFailed) as exc:
        print(f"error: reading the shards failed: {_reason(exc)}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - (first if first is not None else started)
    total = time.monotonic() - started
    rate = max(elapsed, 1e-9)
    counts = collections.Counter(seen.values())
    print(
        f"done: {steps} steps, {records} records, {nbytes / MB:.1f} MB in {total:.1f} s "
        f"({elapsed:.1f} s since the first batch)\n"
        f"      {records / rate:.0f} records/s, {nbytes / MB / rate:.1f} MB/s delivered to the "
        f"model; final loss {loss:.3f}, accuracy {accuracy:.2f}\n"
        f"      {len(seen)} distinct ids; times each arrived: "
        + ", ".join(f"{n}x: {k} ids" for n, k in sorted(counts.items())),
        flush=True,
    )
    if records == 0:
        print("error: no records arrived", file=sys.stderr)
        return 1
    if args.expect is not None:
        expected = json.loads(args.expect.read_text())["ids"]
        problems = check_delivery(seen, expected, args.epochs)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if problems:
            return 1
        print(f"exactly once: each of {len(expected)} ids arrived {args.epochs} times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
