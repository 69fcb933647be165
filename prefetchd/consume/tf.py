"""``prefetchd.tf.dataset``: the tf.data pipeline on top of ``ready_files()`` in one line.

This module is for the trainer process and is the only one that imports TensorFlow; the
daemon never imports it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from prefetchd.config import Config, load_config
from prefetchd.consume.position import TrainingPosition
from prefetchd.consume.ready import ready_files

log = logging.getLogger(__name__)


def safe_cycle_length(config: Config, wanted: int) -> int:
    """The most shards one reader may hold open without starving the writers.

    An interleave keeps ``cycle_length`` claimed shards open while it waits for the next one;
    those shards and the writers' shards in progress must fit in the RAM budget together with
    the one being waited for, or nothing can move.
    """
    out = config.output
    limit = max(1, out.ram_budget // out.shard_size - out.writers - 1)
    if wanted > limit:
        log.warning(
            "cycle_length %d lowered to %d: output.ram_budget holds only %d shards of "
            "output.shard_size next to %d writers",
            wanted,
            limit,
            out.ram_budget // out.shard_size,
            out.writers,
        )
    return max(1, min(wanted, limit))


def dataset(
    config: str | os.PathLike[str] | Config,
    *,
    epoch: int | None = None,
    timeout: float | None = None,
    position: TrainingPosition | None = None,
    cycle_length: int = 4,
    block_length: int = 1,
    buffer_size: int | None = None,
) -> Any:
    """A ``tf.data.Dataset`` of serialized records from the daemon's shards.

    Shard paths come from ``ready_files()`` (``from_generator``) and are read by
    ``cycle_length`` ``TFRecordDataset`` readers, interleaved. Parse the records with
    ``.map(tf.io.parse_single_example, ...)`` as usual, then ``.batch(B).prefetch(AUTOTUNE)``:
    that prefetch overlaps reading with training. There is no prefetch per record in here:
    with 64 KiB records, handing every record across a prefetch thread cost the trainer
    ~0.2 CPU-s/GiB of thread wake-ups (python -m bench.profile.trainer); per batch it is noise.

    tf.distribute's auto-sharding is turned off (``AutoShardPolicy.OFF``): the daemon already
    gives each host its own share and ``ready_files()`` each process its own shards, so
    ``strategy.experimental_distribute_dataset`` must not shard again (with its default policy
    it silently dropped more than half of every worker's records).

    ``position`` (a ``TrainingPosition``, with ``epoch`` given) makes the stream resumable to
    the record: shards are then read one after the other, the first records of a shard the
    position says were trained are skipped, and the trainer reports trained records to the
    position (``prefetchd.keras.PositionCheckpoint`` does that for Keras).

    ``buffer_size`` is each reader's read buffer in bytes; ``None`` keeps TensorFlow's default
    (256 KiB). Shards are on a RAM disk, so a larger buffer saves no I/O, and one of several MiB
    costs the trainer the kernel's time: reading a GiB through 8 MiB buffers took three times
    the page faults and ~0.9 CPU-s more than through 256 KiB ones (python -m bench.profile.trainer).

    The interleave is deliberately sequential: TensorFlow's parallel interleave produces
    nothing while its input iterator blocks, and ``ready_files()`` blocks whenever the daemon
    is behind. The trainer would then hold claimed shards it never reads, the RAM budget would
    fill, and the writers could never publish the shard the generator waits for (a deadlock
    seen with TF 2.21). Reading stays in C++ either way.
    """
    cfg = config if isinstance(config, Config) else load_config(config, trainer=True)
    if position is not None:
        if not isinstance(position, TrainingPosition):
            raise TypeError(
                "position: expected a prefetchd.tf.TrainingPosition (TrainingPosition.load(path) "
                f"or TrainingPosition(saved)), got {type(position).__name__}"
            )
        if epoch is None:
            raise ValueError("dataset(position=...) needs epoch=k: positions are kept per epoch")
        position.check(cfg)
        k = epoch
        return resumable_dataset(
            cfg, lambda: position.files(cfg, k, timeout=timeout), buffer_size=buffer_size
        )
    cycle_length = safe_cycle_length(cfg, cycle_length)

    def paths() -> Any:
        yield from ready_files(cfg, epoch=epoch, timeout=timeout)

    files = tf.data.Dataset.from_generator(
        paths, output_signature=tf.TensorSpec(shape=(), dtype=tf.string)
    )
    records = files.interleave(
        lambda path: tf.data.TFRecordDataset(
            path, compression_type=_compression(cfg), buffer_size=buffer_size
        ),
        cycle_length=cycle_length,
        block_length=block_length,
    )
    return records.with_options(_no_auto_shard())


def resumable_dataset(
    config: Config,
    files: Callable[[], Iterator[tuple[str, int]]],
    *,
    buffer_size: int | None = None,
) -> Any:
    """Records of the shards ``files()`` yields as ``(path, records to skip)``, one shard after
    the other in that order (so the records trained can be counted back to shards); a new
    ``files()`` each time the dataset is iterated."""
    shards = tf.data.Dataset.from_generator(
        files,
        output_signature=(
            tf.TensorSpec(shape=(), dtype=tf.string),
            tf.TensorSpec(shape=(), dtype=tf.int64),
        ),
    )
    compression = _compression(config)
    records = shards.flat_map(
        lambda path, skip: tf.data.TFRecordDataset(
            path, compression_type=compression, buffer_size=buffer_size
        ).skip(skip)
    )
    return records.with_options(_no_auto_shard())


def _compression(config: Config) -> str:
    return "GZIP" if config.output.compression == "gzip" else ""


def _no_auto_shard() -> Any:
    """Options that keep tf.distribute from sharding prefetchd's already-sharded stream."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options
