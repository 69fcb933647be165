"""The benchmark's datasets (``--datasets``): seeded, uploaded to the store, and staged on tmpfs
as the floor's TFRecord files.

Each entry of ``DATASETS`` is one dataset: its format, its object sizes, how many objects by
default and with ``--quick``; ``--<name>-objects N`` overrides the count. Adding a dataset is one
row here (the generator, ``testkit.sample_data``, makes ``tfrecord`` and ``raw`` objects).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from testkit import sample_data

MiB = 1024**2
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

    def spec(self, objects: int) -> DatasetSpec:
        return DatasetSpec(self.name, self.kind, objects, self.min_size, self.max_size)


DATASETS: tuple[DatasetDef, ...] = (
    DatasetDef("large", "tfrecord", 64 * MiB, 64 * MiB, 32, 2, "64 MiB each"),
    DatasetDef("medium", "tfrecord", 1 * MiB, 8 * MiB, 300, 24, "1-8 MiB"),
    DatasetDef("small", "raw", 100 * 1024, 200 * 1024, 5000, 240, "100-200 KiB"),
)
BY_NAME = {d.name: d for d in DATASETS}
NAMES = tuple(BY_NAME)


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of one run: its definition with the object count chosen."""

    name: str
    kind: sample_data.Kind
    objects: int
    min_size: int
    max_size: int


@dataclass
class Uploaded:
    """A dataset in the store, and where the floor's copy of its records is."""

    spec: DatasetSpec
    prefix: str
    objects: int
    bytes: int
    records: int
    floor_dir: Path


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
    uploaded = sample_data.upload_dataset(
        client, bucket, prefix, kind=spec.kind, sizes=sizes, seed=seed
    )
    floor = floor_root / spec.name
    floor.mkdir(parents=True)
    stage_floor(
        floor, spec.kind, sample_data.generate(prefix, kind=spec.kind, sizes=sizes, seed=seed)
    )
    return Uploaded(
        spec, prefix, len(uploaded["keys"]), uploaded["bytes"], uploaded["records"], floor
    )


def floor_record(key: str, body: bytes, kind: sample_data.Kind) -> bytes:
    """The framed records prefetchd delivers for one object: TFRecord objects as they are, raw
    objects as the Example {key, data} the raw format makes."""
    from prefetchd.tfrecord import frame
    from prefetchd.write.example import encode_example

    if kind == "tfrecord":
        return body
    return frame(encode_example({"key": key.encode(), "data": body}))


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
