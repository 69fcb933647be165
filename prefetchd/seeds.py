"""Every seeded random choice prefetchd makes, derived from ``epochs.seed`` by stable hashes.

The same seed, epoch (and writer or key) give the same generator on every run and every host:
the epoch's object order (``download.order``), which open object gives a writer its next record,
and the order of records inside one object (``write.shuffle``). Python's ``hash()`` is salted
per process, so these use BLAKE2b.
"""

from __future__ import annotations

import hashlib
import random


def stable_hash(*parts: object) -> int:
    """64 bits of BLAKE2b over ``parts`` (as text): the same on every run and machine."""
    text = "\x00".join(map(str, parts)).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def epoch_seed(seed: int, epoch: int) -> int:
    return stable_hash("epoch", seed, epoch)


def mixing_rng(seed: int, epoch: int, writer: int) -> random.Random:
    """The generator a writer uses to pick which open object gives the next record."""
    return random.Random(stable_hash("mix", seed, epoch, writer))


def object_rng(seed: int, epoch: int, key: str) -> random.Random:
    """The generator that shuffles the records inside one object in one epoch."""
    return random.Random(stable_hash("records", seed, epoch, key))
