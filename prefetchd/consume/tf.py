"""``prefetchd.tf.dataset``: the tf.data pipeline on top of ``ready_files()`` in one line.

This module is for the trainer process and is the only one that imports TensorFlow; the
daemon never imports it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import tensorflow as tf

from prefetchd.config import Config, load_config
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
    ~0.2 CPU-s/GiB of thread wake-ups (python -m bench.profile_trainer); per batch it is noise.

    ``buffer_size`` is each reader's read buffer in bytes; ``None`` keeps TensorFlow's default
    (256 KiB). Shards are on a RAM disk, so a larger buffer saves no I/O, and one of several MiB
    costs the trainer the kernel's time: reading a GiB through 8 MiB buffers took three times
    the page faults and ~0.9 CPU-s more than through 256 KiB ones (python -m bench.profile_trainer).

    The interleave is deliberately sequential: TensorFlow's parallel interleave produces
    nothing while its input iterator blocks, and ``ready_files()`` blocks whenever the daemon
    is behind. The trainer would then hold claimed shards it never reads, the RAM budget would
    fill, and the writers could never publish the shard the generator waits for (a deadlock
    seen with TF 2.21). Reading stays in C++ either way.
    """
    cfg = config if isinstance(config, Config) else load_config(config)
    cycle_length = safe_cycle_length(cfg, cycle_length)
    compression = "GZIP" if cfg.output.compression == "gzip" else ""

    def paths() -> Any:
        yield from ready_files(cfg, epoch=epoch, timeout=timeout)

    files = tf.data.Dataset.from_generator(
        paths, output_signature=tf.TensorSpec(shape=(), dtype=tf.string)
    )
    return files.interleave(
        lambda path: tf.data.TFRecordDataset(
            path, compression_type=compression, buffer_size=buffer_size
        ),
        cycle_length=cycle_length,
        block_length=block_length,
    )
