"""The contenders (``--loaders``): what each one is and how a run of it is made.

Two roles:

- ``ceiling``: a copy tool moving the dataset's objects to tmpfs, nothing parsed
  (``command`` builds its command line; ``bench.ceilings``); ratios use the fastest ceiling.
- ``trainer``: a ``bench.trainer`` process reading records with ``reader`` (a name in
  ``bench.readers.READERS``); with ``daemon_client`` set, the harness also starts a prefetchd
  daemon with that ``download.client`` for the run.

Adding a contender is one row here (plus a reader in ``bench.readers`` or a command in
``bench.ceilings`` if it needs a new one). The order of ``CONTENDERS`` is the order of the
report's rows and bars. Pure: nothing here starts anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bench import ceilings

Role = Literal["ceiling", "trainer"]


@dataclass(frozen=True)
class Contender:
    name: str
    role: Role
    doc: str
    reader: str | None = None  # trainer: the bench.readers pipeline
    daemon_client: str | None = None  # trainer: start prefetchd with this download.client
    command: Callable[[ceilings.CopyJob], list[str]] | None = None  # ceiling: its command line


CONTENDERS: tuple[Contender, ...] = (
    Contender(
        "ceiling",
        "ceiling",
        "s5cmd copying the objects to tmpfs (nothing parsed, nothing written twice)",
        command=ceilings.s5cmd_command,
    ),
    Contender(
        "ceiling-crt",
        "ceiling",
        "awscrt.s3.S3Client doing the same (ratios use the faster ceiling)",
        command=ceilings.crt_command,
    ),
    Contender(
        "baseline",
        "trainer",
        "boto3 inside tf.py_function, map(num_parallel_calls=AUTOTUNE)",
        reader="baseline",
    ),
    Contender("s3fs", "trainer", "s3fs.cat_file inside tf.py_function, the same pipeline", "s3fs"),
    Contender(
        "prefetchd",
        "trainer",
        "the daemon (download.client: classic) read through prefetchd.tf.dataset",
        reader="prefetchd",
        daemon_client="classic",
    ),
    Contender(
        "prefetchd-crt",
        "trainer",
        "the same with download.client: crt",
        reader="prefetchd",
        daemon_client="crt",
    ),
    Contender(
        "floor",
        "trainer",
        "the same records pre-staged on tmpfs, read by TFRecordDataset",
        reader="floor",
    ),
)
BY_NAME = {c.name: c for c in CONTENDERS}
LOADERS = tuple(c.name for c in CONTENDERS)
CEILINGS = tuple(c.name for c in CONTENDERS if c.role == "ceiling")
PREFETCHD = tuple(c.name for c in CONTENDERS if c.daemon_client is not None)


def describe() -> str:
    """One line per contender, for ``--help`` and the package docstring."""
    width = max(len(c.name) for c in CONTENDERS)
    return "\n".join(f"    {c.name:<{width}}  {c.doc}" for c in CONTENDERS)
