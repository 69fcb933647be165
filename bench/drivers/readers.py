"""Trainer-side readers: the tf.data pipeline each contender's trainer reads records with.

``READERS`` maps a reader name (``Contender.reader``) to a function ``(spec, tf) -> Dataset`` of
serialized records; ``spec`` is the run's JSON spec (``bench.drivers.trainer``). All deliver the
same number of records: the objects' TFRecord records, for ``raw`` data one record per object, for
``lines`` one per non-blank line, for ``tar`` one per sample.

- ``baseline``: what seed users did, done as well as a competent user does it: the key list,
  shuffled, then ``map(tf.py_function(get_object), num_parallel_calls=AUTOTUNE,
  deterministic=False)`` with one boto3 client whose pool allows 64 connections; each object
  is split in Python as its user would (``SPLITTERS``): TFRecord files with a memoryview walk
  over the frames (no copy but the records themselves), JSONL by lines, WebDataset tars with
  ``tarfile`` into samples (label and JSON decoded, the image bytes delivered), then
  ``unbatch``.
- ``s3fs``: the same pipeline with ``s3fs.S3FileSystem.cat_file`` instead of boto3.
- ``prefetchd``: ``prefetchd.tf.dataset(config)``.
- ``lean``: the lean design limit: files that ``bench.drivers.crt lean`` (awscrt, started by the
  harness) downloaded straight to tmpfs, each read as soon as its path arrives on a FIFO, with the
  same interleave of ``TFRecordDataset`` (no cache copy, no re-framing, no mixing).
- ``floor``: TFRecord files already on tmpfs, read the way ``prefetchd.tf.dataset`` reads
  shards (interleave of ``TFRecordDataset``, cycle 4, then prefetch).
- ``files``: the same files in name order, as plainly as TensorFlow reads them: one
  ``TFRecordDataset`` over all, or ``spec["cycle_length"]`` of them interleaved, TensorFlow's
  default buffers (``bench.profile.trainer``'s floor and lean trainers).

Adding a reader: a function here and an entry in ``READERS``.
"""

from __future__ import annotations

import io
import json
import os
import random
import struct
import tarfile
from collections.abc import Callable, Iterator
from typing import Any

_HEADER = struct.Struct("<QI")


def split_tfrecords(blob: bytes) -> list[bytes]:
    """The records of a TFRecord file held in memory (frames walked, CRCs not checked)."""
    view = memoryview(blob)
    out: list[bytes] = []
    pos, end = 0, len(blob)
    while pos < end:
        length, _ = _HEADER.unpack_from(view, pos)
        start = pos + 12
        out.append(bytes(view[start : start + length]))
        pos = start + length + 4
    return out


def split_lines(blob: bytes) -> list[bytes]:
    """The non-blank lines of a text object, without their line endings."""
    return [line.rstrip(b"\r") for line in blob.split(b"\n") if line.strip(b"\r")]


def split_tar(blob: bytes) -> list[bytes]:
    """The image bytes (a small sample's caption) of each WebDataset sample of a tar held in
    memory, the way a user reading one by hand does it: members grouped by basename, ``.cls``
    and ``.json`` decoded (a trainer needs the label), one record per sample."""
    out: list[bytes] = []
    sample: dict[str, bytes] = {}
    current = None
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r|") as tar:
        for member in tar:
            base, _, ext = member.name.partition(".")
            if base != current and sample:
                out.append(_tar_record(sample))
                sample = {}
            current = base
            data = tar.extractfile(member)
            if data is not None:
                sample[ext] = data.read()
    if sample:
        out.append(_tar_record(sample))
    return out


def _tar_record(sample: dict[str, bytes]) -> bytes:
    int(sample.get("cls", b"0"))  # what the model would get as its label
    json.loads(sample.get("json", b"{}"))
    return sample.get("jpg", sample.get("txt", b""))


SPLITTERS: dict[str, Callable[[bytes], list[bytes]]] = {
    "tfrecord": split_tfrecords,
    "raw": lambda blob: [blob],
    "lines": split_lines,
    "tar": split_tar,
}


def interleaved_files(files: Any, tf: Any) -> Any:
    """TFRecord files read as ``prefetchd.tf.dataset`` reads shards: interleave, cycle 4."""
    ds = files.interleave(
        lambda p: tf.data.TFRecordDataset(p, buffer_size=8 * 1024 * 1024), cycle_length=4
    )
    return ds.prefetch(tf.data.AUTOTUNE)


def floor(spec: dict[str, Any], tf: Any) -> Any:
    """The pre-staged TFRecord files, shuffled, interleaved as prefetchd.tf.dataset does."""
    files = sorted(
        os.path.join(spec["floor_dir"], n)
        for n in os.listdir(spec["floor_dir"])
        if n.endswith(".tfrecord")
    )
    random.Random(0).shuffle(files)
    return interleaved_files(tf.data.Dataset.from_tensor_slices(files), tf)


def files(spec: dict[str, Any], tf: Any) -> Any:
    """Every file of ``spec["floor_dir"]`` in name order: one ``TFRecordDataset``, or with
    ``spec["cycle_length"]`` > 0 that many files read at once (``interleave``)."""
    folder = spec["floor_dir"]
    paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))
    cycle = int(spec.get("cycle_length", 0))
    if cycle <= 0:
        return tf.data.TFRecordDataset(paths)
    return tf.data.Dataset.from_tensor_slices(paths).interleave(
        tf.data.TFRecordDataset, cycle_length=cycle
    )


def lean(spec: dict[str, Any], tf: Any) -> Any:
    """The files ``bench.drivers.crt lean`` announces on the FIFO ``spec["lean_fifo"]``, one path a
    line, read as they complete; the FIFO's end (the downloader closed it) ends the dataset."""

    def paths() -> Iterator[str]:
        with open(spec["lean_fifo"], encoding="utf-8") as fifo:
            for line in fifo:
                yield line.rstrip("\n")

    files = tf.data.Dataset.from_generator(
        paths, output_signature=tf.TensorSpec(shape=(), dtype=tf.string)
    )
    return interleaved_files(files, tf)


def prefetchd_dataset(spec: dict[str, Any], tf: Any) -> Any:
    """The daemon's shards through ``prefetchd.tf.dataset`` (the harness starts the daemon);
    ``spec["dataset_kwargs"]``, if any, are passed to it as well."""
    import prefetchd.tf

    kwargs = {"cycle_length": int(spec.get("cycle_length", 4)), **spec.get("dataset_kwargs", {})}
    return prefetchd.tf.dataset(spec["config"], **kwargs)


def baseline(spec: dict[str, Any], tf: Any) -> Any:
    """boto3's ``get_object`` inside ``tf.py_function``."""
    return object_pipeline(spec, tf, _boto3_fetcher(spec))


def s3fs_cat(spec: dict[str, Any], tf: Any) -> Any:
    """s3fs's ``cat_file`` inside ``tf.py_function``."""
    return object_pipeline(spec, tf, _s3fs_fetcher(spec))


def object_pipeline(spec: dict[str, Any], tf: Any, fetch_bytes: Callable[[str], bytes]) -> Any:
    """Keys listed (lazily, inside the timed part), shuffled, fetched in parallel in Python;
    the fetcher put its lister in ``spec["list_keys"]``."""
    split = SPLITTERS[spec["kind"]]

    def fetch(key: Any) -> Any:
        blob = fetch_bytes(key.numpy().decode())
        return tf.constant(split(blob), dtype=tf.string)

    def keys() -> Any:
        listed = spec["list_keys"]()
        random.Random(0).shuffle(listed)
        yield from listed

    ds = tf.data.Dataset.from_generator(
        keys, output_signature=tf.TensorSpec(shape=(), dtype=tf.string)
    )
    ds = ds.map(
        lambda k: tf.ensure_shape(tf.py_function(fetch, [k], Tout=tf.string), [None]),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    return ds.unbatch()


def _boto3_fetcher(spec: dict[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=spec["endpoint"],
        config=Config(
            max_pool_connections=64,
            retries={"mode": "standard"},
            s3={"addressing_style": "path"},
        ),
    )
    bucket, prefix = spec["bucket"], spec["prefix"]

    def list_keys() -> list[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    spec["list_keys"] = list_keys

    def get(key: str) -> bytes:
        body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    return get


def _s3fs_fetcher(spec: dict[str, Any]) -> Any:
    import s3fs

    fs = s3fs.S3FileSystem(
        endpoint_url=spec["endpoint"],
        key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        config_kwargs={"max_pool_connections": 64},
    )
    root = f"{spec['bucket']}/{spec['prefix']}"

    def list_keys() -> list[str]:
        return sorted(fs.find(root))

    spec["list_keys"] = list_keys

    def get(path: str) -> bytes:
        body: bytes = fs.cat_file(path)
        return body

    return get


READERS: dict[str, Callable[[dict[str, Any], Any], Any]] = {
    "baseline": baseline,
    "s3fs": s3fs_cat,
    "prefetchd": prefetchd_dataset,
    "lean": lean,
    "floor": floor,
    "files": files,
}
