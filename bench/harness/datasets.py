"""The benchmark's datasets (``--datasets``): seeded, uploaded to the store, and staged on tmpfs
as the floor's TFRecord files.

Each entry of ``DATASETS`` is one dataset: its format (the daemon's ``source.format``), its
object sizes, its record size if fixed, how many objects by default and with ``--quick``, and
whether the paced network phase reads it; ``--<name>-objects N`` overrides the count. Adding a
dataset is one row here (the generator, ``testkit.sample_data``, makes ``tfrecord``, ``raw``,
``lines`` and ``tar`` objects; ``tar`` with image samples or small caption ones: ``tar_style``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from testkit import sample_data

KiB, MiB = 1024, 1024**2
FLOOR_FILE_BYTES = 32 * MiB


@dataclass(frozen=True)
class DatasetDef:
    """A dataset the bench knows: what ``--datasets NAME`` uploads."""

    name: str
    kind: sample_data.Kind
    min_size: int
    max_size: int
    objects: int  # by default
    quick_objects: int  # with --quick
    sizes_help: str  # for --<name>-objects
    paced: bool = False  # also read in the paced network phase (bar 7 names it)
    record_size: int | None = None  # tfrecord: every record this many framed bytes
    tar_style: sample_data.TarStyle = "image"  # tar: which samples (sample_data.tar_object)

    def spec(self, objects: int) -> DatasetSpec:
        return DatasetSpec(
            self.name,
            self.kind,
            objects,
            self.min_size,
            self.max_size,
            self.record_size,
            self.tar_style,
        )


DATASETS: tuple[DatasetDef, ...] = (
    DatasetDef("large", "tfrecord", 64 * MiB, 64 * MiB, 32, 2, "64 MiB each", paced=True),
    DatasetDef("medium", "tfrecord", 1 * MiB, 8 * MiB, 300, 24, "1-8 MiB", paced=True),
    # issue 28's small objects (bars 2 and 7): 3,000 of 96-160 KiB (5,000 of 64-200 KiB before)
    DatasetDef("small", "raw", 96 * KiB, 160 * KiB, 3000, 240, "96-160 KiB", paced=True),
    # issue 28's 96 x 16 MiB TFRecords (bars 1, 4, 5 and, paced, 7; 64 objects before)
    DatasetDef(
        "tfrecord16",
        "tfrecord",
        16 * MiB,
        16 * MiB,
        96,
        6,
        "16 MiB each, 64 KiB records",
        paced=True,
        record_size=64 * KiB,
    ),
    DatasetDef("lines", "lines", 1 * MiB, 4 * MiB, 100, 4, "1-4 MiB of ~120-byte JSONL lines"),
    DatasetDef("tar", "tar", 2 * MiB, 8 * MiB, 100, 6, "2-8 MiB WebDataset tars"),
    # bar 3 per sample file: small members, so the cost per file is not the cost of the bytes
    DatasetDef(
        "tarsmall",
        "tar",
        2 * MiB,
        8 * MiB,
        60,
        4,
        "2-8 MiB WebDataset tars of small .cls/.json/.txt samples",
        tar_style="caption",
    ),
)
BY_NAME = {d.name: d for d in DATASETS}
NAMES = tuple(BY_NAME)
PACED = tuple(d.name for d in DATASETS if d.paced)


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of one run: its definition with the object count chosen."""

    name: str
    kind: sample_data.Kind
    objects: int
    min_size: int
    max_size: int
    record_size: int | None = None
    tar_style: sample_data.TarStyle = "image"


@dataclass
class Uploaded:
    """A dataset in the store, and where the floor's copy of its records is."""

    spec: DatasetSpec
    prefix: str
    objects: int
    bytes: int
    records: int
    floor_dir: Path
    files: int = 0  # files inside the objects: tar members; else one per record


def option(name: str) -> str:
    """The attribute of ``--<name>-objects`` on the parsed arguments."""
    return f"{name}_objects"


def upload_and_stage(
    endpoint: str, bucket: str, spec: DatasetSpec, seed: int, floor_root: Path
) -> Uploaded:
    """Put the dataset in the store and write the same records as TFRecord files on tmpfs."""
    client = sample_data.make_client(endpoint)
    sample_data.ensure_bucket(client, bucket)
    sizes = sample_data.object_sizes(spec.objects, spec.min_size, spec.max_size, seed)
    prefix = f"{spec.name}/"
    kind, record_size, style = spec.kind, spec.record_size, spec.tar_style
    uploaded = sample_data.upload_dataset(
        client,
        bucket,
        prefix,
        kind=kind,
        sizes=sizes,
        seed=seed,
        record_size=record_size,
        tar_style=style,
    )
    floor = floor_root / spec.name
    floor.mkdir(parents=True)
    objects = sample_data.generate(
        prefix, kind=kind, sizes=sizes, seed=seed, record_size=record_size, tar_style=style
    )
    stage_floor(floor, kind, objects)
    records = uploaded["records"]
    return Uploaded(
        spec,
        prefix,
        len(uploaded["keys"]),
        uploaded["bytes"],
        records,
        floor,
        sample_data.member_files(spec.kind, records, spec.tar_style),
    )


def floor_record(key: str, body: bytes, kind: sample_data.Kind) -> bytes:
    """The framed records prefetchd delivers for one object: TFRecord objects as they are, raw
    objects as the Example {key, data} the raw format makes, lines and tar objects as
    prefetchd's own format parsers read them (from a temporary file on tmpfs)."""
    from prefetchd.kernel.example_encode import encode_example
    from prefetchd.kernel.framing import frame
    from prefetchd.write.formats import get_format

    if kind == "tfrecord":
        return body
    if kind == "raw":
        return frame(encode_example({"key": key.encode(), "data": body}))
    with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="bench-floor-") as f:
        f.write(body)
        f.flush()
        return b"".join(frame(r) for r in get_format(kind).records(key, f.name))


def stage_floor(
    floor: Path, kind: sample_data.Kind, objects: Iterable[tuple[str, bytes, list[int]]]
) -> None:
    """Write the records of ``objects`` (``(key, body, ids)`` tuples) as 32 MiB TFRecord files."""
    out: BinaryIO | None = None
    written, index = 0, 0
    try:
        for key, body, _ in objects:
            data = floor_record(key, body, kind)
            if out is None or written >= FLOOR_FILE_BYTES:
                if out is not None:
                    out.close()
                out = open(floor / f"floor-{index:05d}.tfrecord", "wb")  # noqa: SIM115
                index, written = index + 1, 0
            out.write(data)
            written += len(data)
    finally:
        if out is not None:
            out.close()
