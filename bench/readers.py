"""Trainer-side readers: the tf.data pipeline each contender's trainer reads records with.

``READERS`` maps a reader name (``Contender.reader``) to a function ``(spec, tf) -> Dataset`` of
serialized records; ``spec`` is the run's JSON spec (``bench.trainer``). All deliver the same
records: the objects' TFRecord records, or for ``raw`` data one record per object.

- ``baseline``: what seed users did, done as well as a competent user does it: the key list,
  shuffled, then ``map(tf.py_function(get_object), num_parallel_calls=AUTOTUNE,
  deterministic=False)`` with one boto3 client whose pool allows 64 connections; TFRecord
  objects are split into records with a memoryview walk over the frames (no copy but the
  records themselves), then ``unbatch``.
- ``s3fs``: the same pipeline with ``s3fs.S3FileSystem.cat_file`` instead of boto3.
- ``prefetchd``: ``prefetchd.tf.dataset(config)``.
- ``floor``: TFRecord files already on tmpfs, read the way ``prefetchd.tf.dataset`` reads
  shards (interleave of ``TFRecordDataset``, cycle 4, then prefetch).

Adding a reader: a function here and an entry in ``READERS``.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable
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


def floor(spec: dict[str, Any], tf: Any) -> Any:
    """The pre-staged TFRecord files, shuffled, interleaved as prefetchd.tf.dataset does."""
    files = sorted(
        os.path.join(spec["floor_dir"], n)
        for n in os.listdir(spec["floor_dir"])
        if n.endswith(".tfrecord")
    )
    random.Random(0).shuffle(files)
    ds = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda p: tf.data.TFRecordDataset(p, buffer_size=8 * 1024 * 1024), cycle_length=4
    )
    return ds.prefetch(tf.data.AUTOTUNE)


def prefetchd_dataset(spec: dict[str, Any], tf: Any) -> Any:
    """The daemon's shards through ``prefetchd.tf.dataset`` (the harness starts the daemon)."""
    import prefetchd.tf

    return prefetchd.tf.dataset(spec["config"], cycle_length=int(spec.get("cycle_length", 4)))


def baseline(spec: dict[str, Any], tf: Any) -> Any:
    """boto3's ``get_object`` inside ``tf.py_function``."""
    return object_pipeline(spec, tf, _boto3_fetcher(spec))


def s3fs_cat(spec: dict[str, Any], tf: Any) -> Any:
    """s3fs's ``cat_file`` inside ``tf.py_function``."""
    return object_pipeline(spec, tf, _s3fs_fetcher(spec))


def object_pipeline(spec: dict[str, Any], tf: Any, fetch_bytes: Callable[[str], bytes]) -> Any:
    """Keys listed (lazily, inside the timed part), shuffled, fetched in parallel in Python;
    the fetcher put its lister in ``spec["list_keys"]``."""
    tfrecord = spec["kind"] == "tfrecord"

    def fetch(key: Any) -> Any:
        blob = fetch_bytes(key.numpy().decode())
        return tf.constant(split_tfrecords(blob) if tfrecord else [blob], dtype=tf.string)

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
    "floor": floor,
}
