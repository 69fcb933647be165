"""What the downloader and its transfer clients exchange: one ``Job`` per object being fetched,
and the ``Done`` callback a client calls when it is settled. A leaf: the clients, the verifier and
the downloader import it; it imports none of them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefetchd.download.checksums import Expected, StoredChecksum
from prefetchd.download.order import SourceObject


@dataclass
class Job:
    """One object being fetched into ``tmp``."""

    epoch: int
    seq: int
    obj: SourceObject
    name: str
    tmp: Path
    source: int = 0  # index into config.sources
    bucket: str | None = None  # its source's bucket, if not the transfer's (several sources)
    format: str | None = None  # its source's format, if not the verifier's (several sources)
    attempt: int = 0
    corrupt: int = 0  # fetches that failed verification (``retries.Retries.failed``)
    # Transient failures of this object, counted only when the store demonstrably worked
    # meanwhile (another object downloaded, or the bucket lists): past ``download.retries``
    # the store works and this object does not, so it is skipped.
    faults: int = 0
    published_at_fault: int = -1  # objects_downloaded at its last transient failure
    part_size: int | None = None  # instead of download.part_size (classic client only)
    ranges: list[tuple[int, int]] = field(default_factory=list)
    next_part: int = 0
    # Filled in by the transfer threads:
    lock: threading.Lock = field(default_factory=threading.Lock)
    parts_left: int = 0
    fd: int = -1
    error: BaseException | None = None
    retries: int = 0
    md5: Any = None
    # The whole object's checksum its GET answered with (crt, objects fetched in one request):
    # verification checks it, a CRC, instead of the MD5 an ETag would take (``verify``).
    answered: StoredChecksum | None = None
    # The CRC of the body as it arrived (native, objects fetched in one request): (algorithm,
    # digest). When it is the algorithm ``answered`` names, verification compares the two with
    # no read-back of the file.
    received: tuple[str, bytes] | None = None
    lookups: int = 0  # HEAD requests this fetch made to learn how to verify it
    # What verifying it takes, learnt once and kept across re-fetches (``verify.Verifier``):
    looked_up: bool = False
    expected: Expected | None = None
    unverified: str | None = None  # why only the size can be checked
    bad_digest: bytes | None = None  # what the last fetch that failed verification hashed to
    bad_frames: str | None = None  # where the last fetch's TFRecord CRCs failed, and how
    # Every TFRecord frame of the file passed its CRCs (uncompressed ``tfrecord`` input): the
    # meta says so, and the writer need not read the object through before taking records.
    records_ok: bool = False
    # Resumed on another number of hosts: the records trained before (``rehost.py``).
    skip: list[list[int]] | None = None

    @property
    def all_submitted(self) -> bool:
        return self.next_part >= len(self.ranges)


Done = Callable[[Job], None]
