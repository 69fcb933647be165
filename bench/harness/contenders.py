"""The contenders (``--loaders``): what each one is and how a run of it is made.

Two roles:

- ``ceiling``: a copy tool moving the dataset's objects to tmpfs, nothing parsed
  (``command`` builds its command line; ``bench.harness.ceilings``); ratios use the fastest ceiling.
- ``trainer``: a ``bench.drivers.trainer`` process reading records with ``reader`` (a name in
  ``bench.drivers.readers.READERS``); with ``daemon_client`` set, the harness also starts a
  prefetchd daemon with that ``download.client`` for the run; with ``lean`` set, it starts the lean
  downloader (``bench.drivers.crt``) instead.

``kinds`` limits a contender to datasets of those formats (the lean design reads TFRecord
objects as they are); ``paced`` says whether it runs in the paced network phase (whose bar
compares prefetchd with the in-trainer baseline); ``requires`` names what it cannot run
without (``bench.harness.environment.unavailable`` skips it, with a message, when something is
missing). Adding a contender is one row here (plus a reader in ``bench.drivers.readers`` or a
command in ``bench.harness.ceilings`` if it needs a new one). The order of ``CONTENDERS`` is the
order of the report's rows. Pure: nothing here starts anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bench.harness import ceilings

Role = Literal["ceiling", "trainer"]


@dataclass(frozen=True)
class Contender:
    name: str
    role: Role
    doc: str
    reader: str | None = None  # trainer: the bench.drivers.readers pipeline
    daemon_client: str | None = None  # trainer: start prefetchd with this download.client
    command: Callable[[ceilings.CopyJob], list[str]] | None = None  # ceiling: its command line
    lean: bool = False  # trainer: start the lean downloader (bench.drivers.crt lean) for the run
    kinds: tuple[str, ...] | None = None  # dataset formats it reads (None: every one)
    paced: bool = False  # also runs in the paced network phase
    requires: tuple[str, ...] = ()  # modules or binaries (``bin:NAME``) it needs

    def reads(self, kind: str) -> bool:
        """Whether this contender runs on a dataset of format ``kind``."""
        return self.kinds is None or kind in self.kinds


CONTENDERS: tuple[Contender, ...] = (
    Contender(
        "ceiling",
        "ceiling",
        "s5cmd copying the objects to tmpfs (nothing parsed, nothing written twice)",
        command=ceilings.s5cmd_command,
        requires=("bin:s5cmd",),
    ),
    Contender(
        "ceiling-crt",
        "ceiling",
        "awscrt.s3.S3Client doing the same (ratios use the faster ceiling, CPU bars this one)",
        command=ceilings.crt_command,
        paced=True,
        requires=("awscrt",),
    ),
    Contender(
        "baseline",
        "trainer",
        "boto3 inside tf.py_function, map(num_parallel_calls=AUTOTUNE)",
        reader="baseline",
        paced=True,
    ),
    Contender(
        "s3fs",
        "trainer",
        "s3fs.cat_file inside tf.py_function, the same pipeline",
        reader="s3fs",
        requires=("s3fs",),
    ),
    Contender(
        "prefetchd",
        "trainer",
        "the daemon (download.client: classic) read through prefetchd.tf.dataset",
        reader="prefetchd",
        daemon_client="classic",
        paced=True,
    ),
    Contender(
        "prefetchd-crt",
        "trainer",
        "the same with download.client: crt",
        reader="prefetchd",
        daemon_client="crt",
        paced=True,
        requires=("awscrt",),
    ),
    Contender(
        "prefetchd-native",
        "trainer",
        "the same with download.client: native (the C GET client, prefetchd.kernel._http)",
        reader="prefetchd",
        daemon_client="native",
        paced=True,
        requires=("prefetchd.kernel._http",),
    ),
    Contender(
        "lean",
        "trainer",
        "the lean design limit: awscrt, 16 objects at a time, straight into tmpfs files, each "
        "read by TFRecordDataset once complete (TFRecord datasets)",
        reader="lean",
        lean=True,
        kinds=("tfrecord",),
        requires=("awscrt",),
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
PACED = tuple(c.name for c in CONTENDERS if c.paced)


def describe() -> str:
    """One line per contender, for ``--help`` and the package docstring."""
    width = max(len(c.name) for c in CONTENDERS)
    return "\n".join(f"    {c.name:<{width}}  {c.doc}" for c in CONTENDERS)
