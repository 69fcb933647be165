"""``prefetchd.tf.dataset``: the tf.data pipeline on top of ``ready_files()`` in one line.

This module is for the trainer process and is the only one that imports TensorFlow; the
daemon never imports it.
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from prefetchd.config import Config, load_config
from prefetchd.consumer import ready_files


def dataset(
    config: str | os.PathLike[str] | Config,
    *,
    epoch: int | None = None,
    timeout: float | None = None,
    cycle_length: int = 4,
    block_length: int = 1,
    buffer_size: int = 8 * 1024 * 1024,
    deterministic: bool = False,
) -> Any:
    """A ``tf.data.Dataset`` of serialized records from the daemon's shards.

    Shard paths come from ``ready_files()`` (``from_generator``) and are read by
    ``cycle_length`` parallel ``TFRecordDataset`` readers, interleaved, then prefetched. Parse
    the records with ``.map(tf.io.parse_single_example, ...)`` as usual.
    """
    cfg = config if isinstance(config, Config) else load_config(config)
    compression = "GZIP" if cfg.output.compression == "gzip" else ""

    def paths() -> Any:
        yield from ready_files(cfg, epoch=epoch, timeout=timeout)

    files = tf.data.Dataset.from_generator(
        paths, output_signature=tf.TensorSpec(shape=(), dtype=tf.string)
    )
    records = files.interleave(
        lambda path: tf.data.TFRecordDataset(
            path, compression_type=compression, buffer_size=buffer_size
        ),
        cycle_length=cycle_length,
        block_length=block_length,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    return records.prefetch(tf.data.AUTOTUNE)
