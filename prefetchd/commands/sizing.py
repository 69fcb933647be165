"""Rules of thumb for the four sizes a user picks, as pure arithmetic for ``prefetchd check``.

Each rule returns None when the value is fine, or one line that names the key, says why it is
too small (or too large) for this host and config, and gives the value to use. Nothing here
refuses a config: the hard limits are in config.py; these are advice (``WARN``).

- ``output.ram_budget`` >= ``(2 * writers + 1) * shard_size``: each writer has one shard in
  progress and one ready for the trainer, and the trainer reads one more. With less, writers
  wait for the trainer to free RAM before it has anything queued.
- ``download.window`` >= ``writers * mix * object + in flight``: each writer draws records from
  ``mix`` objects at once while the downloader keeps ``concurrency`` requests going, which puts
  ``concurrency * min(object, part_size)`` bytes in flight (a large object's parts share one
  object's reservation). ``object`` is the mean size of the listed objects.
- ``download.concurrency`` >= 16: over a real network each connection is capped (per-connection
  limits, first-byte latency); the benchmark in docs/tuning.md peaks at 16-32.
- ``output.writers`` <= half the cores (at least 1): each busy writer takes about a core, and
  the trainer needs the rest.
"""

from __future__ import annotations

from prefetchd.config import Config
from prefetchd.sizes import format_size

MIN_CONCURRENCY = 16


def ram_budget_advice(config: Config) -> str | None:
    out = config.output
    need = (2 * out.writers + 1) * out.shard_size
    if out.ram_budget >= need:
        return None
    return (
        f"output.ram_budget {format_size(out.ram_budget)} holds less than one shard in "
        f"progress and one ready per writer plus one being read: use output.ram_budget: "
        f"{_round_up(need)} ((2 x writers + 1) x shard_size) or a smaller output.shard_size"
    )


def window_need(config: Config, object_size: int) -> int:
    """Bytes of raw objects the writers hold plus what the downloader keeps in flight."""
    dl, out = config.download, config.output
    in_flight = max(object_size, dl.concurrency * min(object_size, dl.part_size))
    return out.writers * out.mix * object_size + in_flight


def window_advice(config: Config, object_size: int) -> str | None:
    """``object_size``: the mean size of the listed objects (0 when nothing was listed)."""
    if object_size <= 0:
        return None
    need = window_need(config, object_size)
    if config.download.window >= need:
        return None
    return (
        f"download.window {format_size(config.download.window)} is too small for objects of "
        f"about {format_size(object_size)}: writers x mix objects plus "
        f"{config.download.concurrency} requests in flight need about {format_size(need)}; "
        f"use download.window: {_round_up(need)}"
    )


def concurrency_advice(config: Config) -> str | None:
    concurrency = config.download.concurrency
    if concurrency >= MIN_CONCURRENCY:
        return None
    return (
        f"download.concurrency {concurrency} keeps few requests in flight: over a real "
        f"network each connection is capped; use {MIN_CONCURRENCY}-32"
    )


def writers_advice(config: Config, cores: int) -> str | None:
    most = max(1, cores // 2)
    writers = config.output.writers
    if writers <= most:
        return None
    return (
        f"output.writers {writers} on {cores} cores leaves too few for the trainer (each busy "
        f"writer takes about a core): use {most}"
    )


def advice(config: Config, *, cores: int, object_size: int) -> list[str]:
    """Every rule's line that applies, in the order of the config file."""
    lines = (
        window_advice(config, object_size),
        concurrency_advice(config),
        ram_budget_advice(config),
        writers_advice(config, cores),
    )
    return [line for line in lines if line]


def _round_up(size: int) -> str:
    """A size to write in the config: whole GiB above 1 GiB, whole MiB below."""
    unit, suffix = (1024**3, "GiB") if size > 1024**3 else (1024**2, "MiB")
    return f"{-(-size // unit)}{suffix}"
