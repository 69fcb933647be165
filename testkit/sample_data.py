"""Seeded synthetic datasets in an S3 bucket, with ids to check exactly-once delivery.

Four kinds, matching prefetchd's formats:

- ``tfrecord``: each object is a TFRecord file; each record is a ``tf.train.Example`` with
  ``id`` (int64, unique across the dataset) and ``payload`` (random, incompressible bytes).
  Encoded without TensorFlow (``prefetchd.kernel.example_encode`` and
  ``prefetchd.kernel.framing``). Record sizes follow the object size (``plan_records``) unless
  ``record_size`` fixes them.
- ``raw``: each object is random bytes; prefetchd turns it into one Example whose ``key`` is
  the object key, so the keys are the sample ids.
- ``lines``: each object is JSONL (``.jsonl``), one ~``LINE_BYTES`` line per record:
  ``{"id":N,"label":L,"text":"<hex>"}``; the ids are the records' ids.
- ``tar``: each object is a WebDataset tar (``.tar``, ustar, fixed metadata) of samples named
  by their id, each with the members of ``TAR_MEMBERS``: a random ``.jpg``-like blob of
  ``TAR_BLOB_MIN``..``TAR_BLOB_MAX`` bytes, a ``.cls`` label and a ``.json`` description.
  With ``tar_style="caption"`` the samples are small, as in captioned-text datasets: the
  members of ``TAR_CAPTION_MEMBERS``, a ``.cls`` label, a ~100-byte ``.json`` and a
  ``CAPTION_MIN``..``CAPTION_MAX``-byte ``.txt`` caption (the per-file costs dominate).

The same seed and arguments always produce the same keys and bytes. Object sizes are drawn
log-uniformly between the minimum and maximum, so small and large objects are both common.

Command line (creates the bucket if missing)::

    python -m testkit.sample_data --endpoint http://127.0.0.1:PORT --bucket B --prefix train/ \
        --kind tfrecord --objects 64 --min-size 1KiB --max-size 4MiB --seed 0
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import random
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from prefetchd.kernel.example_encode import encode_example
from prefetchd.kernel.framing import frame, read_records
from prefetchd.sizes import format_size, parse_size

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

Kind = Literal["tfrecord", "raw", "lines", "tar"]
KINDS: tuple[Kind, ...] = ("tfrecord", "raw", "lines", "tar")
SUFFIXES: dict[Kind, str] = {
    "tfrecord": ".tfrecord",
    "raw": ".bin",
    "lines": ".jsonl",
    "tar": ".tar",
}

MIN_PAYLOAD = 64  # so the demo's "first 64 bytes" model input is always real data
MAX_RECORDS_PER_OBJECT = 64
UPLOAD_THREADS = 4
LINE_BYTES = 120  # a lines record is LINE_BYTES +- LINE_SPREAD bytes, newline included
LINE_SPREAD = 20
LABELS = 1000
TAR_MEMBERS = ("jpg", "cls", "json")  # the files of one tar sample, in their order in the tar
TAR_BLOB_MIN, TAR_BLOB_MAX = 10 * 1024, 60 * 1024
TarStyle = Literal["image", "caption"]  # which samples a tar holds (see the module docstring)
TAR_CAPTION_MEMBERS = ("cls", "json", "txt")  # tar_style="caption", in their order in the tar
CAPTION_MIN, CAPTION_MAX = 100, 200
CAPTION_WORDS = (
    "a", "the", "small", "large", "red", "blue", "dog", "cat", "bird", "car", "on", "in",
    "near", "street", "field", "table", "photo", "of", "with", "two", "old", "new", "sunny",
)  # fmt: skip


class Dataset(TypedDict):
    """What ``upload_dataset`` put in the bucket: everything a test needs to check delivery."""

    kind: Kind
    bucket: str
    prefix: str
    keys: list[str]  # every object key, in upload order (raw: these are the samples' ids)
    sizes: dict[str, int]  # key -> object size in bytes
    sha256: dict[str, str]  # key -> hex digest of the object's bytes
    ids: list[int]  # every record id (a line's, a tar sample's), each unique; raw: empty
    records: int  # records one epoch delivers (raw: len(keys); every other kind: len(ids))
    bytes: int  # total object bytes


# --- pure: sizes and encoding ----------------------------------------------------------------


def object_sizes(count: int, min_size: int, max_size: int, seed: int) -> list[int]:
    """``count`` sizes, log-uniform in ``[min_size, max_size]``, determined by ``seed``."""
    if not 0 < min_size <= max_size:
        raise ValueError(f"need 0 < min_size <= max_size, got {min_size} and {max_size}")
    rng = random.Random(f"sizes/{seed}")
    lo, hi = math.log(min_size), math.log(max_size)
    return [
        min(max_size, max(min_size, round(math.exp(rng.uniform(lo, hi))))) for _ in range(count)
    ]


def record(record_id: int, payload: bytes) -> bytes:
    """One framed TFRecord holding the Example ``{id: record_id, payload: payload}``."""
    return frame(encode_example({"id": record_id, "payload": payload}))


def record_overhead(record_id: int, payload_size: int) -> int:
    """Bytes a framed record adds around its payload (Example fields, varints, TFRecord frame)."""
    return len(record(record_id, bytes(payload_size))) - payload_size


def plan_records(object_size: int, max_id: int) -> tuple[int, int]:
    """``(count, payload_size)`` so ``count`` records of that payload land near ``object_size``.

    Objects get between 1 and ``MAX_RECORDS_PER_OBJECT`` records with payloads of at least
    ``MIN_PAYLOAD`` bytes: small objects hold a few small records, large ones many large ones.
    ``max_id`` (the largest id the object may hold) sizes the varint of the id field. The
    object comes out within a few bytes per record of ``object_size``, or larger if that is
    below one minimal record.
    """
    smallest = MIN_PAYLOAD + record_overhead(max_id, MIN_PAYLOAD)
    count = max(1, min(MAX_RECORDS_PER_OBJECT, object_size // smallest))
    share = object_size // count
    payload = share - record_overhead(max_id, share)
    return count, max(MIN_PAYLOAD, payload)


def plan_fixed_records(object_size: int, record_size: int, max_id: int) -> tuple[int, int]:
    """``(count, payload_size)`` for records of ``record_size`` framed bytes each (at least
    one record, and at least ``MIN_PAYLOAD`` bytes of payload), filling ``object_size``."""
    payload = max(MIN_PAYLOAD, record_size - record_overhead(max_id, record_size))
    return max(1, object_size // record_size), payload


def tfrecord_object(ids: Sequence[int], record_size: int, rng: random.Random) -> bytes:
    """A TFRecord file with one record per id, each with ``record_size`` random payload bytes."""
    return b"".join(record(i, rng.randbytes(record_size)) for i in ids)


def raw_object(size: int, rng: random.Random) -> bytes:
    return rng.randbytes(size)


def json_line(record_id: int, rng: random.Random) -> bytes:
    """One JSONL record of ``LINE_BYTES`` +- ``LINE_SPREAD`` bytes, its newline included."""
    head = f'{{"id":{record_id},"label":{rng.randrange(LABELS)},"text":"'.encode()
    length = LINE_BYTES + rng.randint(-LINE_SPREAD, LINE_SPREAD) - len(head) - 3
    text = rng.randbytes((max(1, length) + 1) // 2).hex()[: max(1, length)]
    return head + text.encode() + b'"}\n'


def lines_object(first_id: int, size: int, rng: random.Random) -> tuple[bytes, list[int]]:
    """A JSONL object of at least one line and about ``size`` bytes; its lines' ids."""
    lines: list[bytes] = []
    total = 0
    while not lines or total < size:
        lines.append(json_line(first_id + len(lines), rng))
        total += len(lines[-1])
    return b"".join(lines), list(range(first_id, first_id + len(lines)))


def tar_sample(
    sample_id: int, rng: random.Random, members: Sequence[str] = TAR_MEMBERS
) -> list[tuple[str, bytes]]:
    """The member files of one WebDataset sample, named ``<id>.<ext>``, in the order of
    ``members`` (a subset of ``TAR_MEMBERS``; the random draws are the same either way)."""
    label = rng.randrange(LABELS)
    blob = rng.randbytes(rng.randint(TAR_BLOB_MIN, TAR_BLOB_MAX))
    meta = {"id": sample_id, "label": label, "width": 224, "height": 224, "bytes": len(blob)}
    name = f"{sample_id:09d}"
    contents = {"jpg": blob, "cls": str(label).encode(), "json": json.dumps(meta).encode()}
    return [(f"{name}.{ext}", contents[ext]) for ext in members]


def caption_sample(sample_id: int, rng: random.Random) -> list[tuple[str, bytes]]:
    """The member files of one small sample (``TAR_CAPTION_MEMBERS``), named ``<id>.<ext>``:
    a label, a ~100-byte JSON description and a caption of ``CAPTION_MIN``..``CAPTION_MAX``
    bytes."""
    label = rng.randrange(LABELS)
    length = rng.randint(CAPTION_MIN, CAPTION_MAX)
    words: list[str] = []
    while len(" ".join(words)) < length:
        words.append(rng.choice(CAPTION_WORDS))
    caption = " ".join(words)[:length].encode()
    meta = {"id": sample_id, "label": label, "lang": "en", "split": "train", "chars": length,
            "source": "testkit.sample_data"}  # fmt: skip
    contents = {"cls": str(label).encode(), "json": json.dumps(meta).encode(), "txt": caption}
    return [(f"{sample_id:09d}.{ext}", contents[ext]) for ext in TAR_CAPTION_MEMBERS]


def tar_object(
    first_id: int,
    size: int,
    rng: random.Random,
    members: Sequence[str] = TAR_MEMBERS,
    style: TarStyle = "image",
) -> tuple[bytes, list[int]]:
    """A tar of at least one sample and about ``size`` bytes (ustar, mtime 0, mode 0644, no
    owner: the same bytes every time); its samples' ids. ``style`` picks the samples:
    ``tar_sample``'s (with its ``members``) or ``caption_sample``'s."""
    out = io.BytesIO()
    ids: list[int] = []
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        while not ids or out.tell() < size:
            ids.append(first_id + len(ids))
            if style == "caption":
                files = caption_sample(ids[-1], rng)
            else:
                files = tar_sample(ids[-1], rng, members)
            for name, data in files:
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue(), ids


def member_files(kind: Kind, records: int, tar_style: TarStyle = "image") -> int:
    """The files inside a dataset's objects: a tar sample's members, or one per record."""
    if kind != "tar":
        return records
    return records * len(TAR_CAPTION_MEMBERS if tar_style == "caption" else TAR_MEMBERS)


def object_key(prefix: str, kind: Kind, index: int) -> str:
    return f"{prefix}{index:06d}{SUFFIXES[kind]}"


def normalize_prefix(prefix: str) -> str:
    """``"train"`` and ``"/train/"`` -> ``"train/"``; ``""`` stays (the bucket's root)."""
    prefix = prefix.strip("/")
    return prefix + "/" if prefix else ""


def generate(
    prefix: str,
    *,
    kind: Kind,
    sizes: Sequence[int],
    seed: int,
    first_id: int = 0,
    record_size: int | None = None,
    tar_members: Sequence[str] = TAR_MEMBERS,
    tar_style: TarStyle = "image",
) -> Iterator[tuple[str, bytes, list[int]]]:
    """Yield ``(key, body, record_ids)`` for each object, deterministically from ``seed``;
    ``record_size`` (tfrecord only) fixes the framed size of every record, ``tar_members``
    (tar only) which files each image sample holds (e.g. ``("json", "cls")``), ``tar_style``
    (tar only) image or caption samples (``tar_object``)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    prefix = normalize_prefix(prefix)
    next_id = first_id
    for index, size in enumerate(sizes):
        rng = random.Random(f"object/{seed}/{index}")
        key = object_key(prefix, kind, index)
        if kind == "raw":
            yield key, raw_object(size, rng), []
            continue
        if kind in ("lines", "tar"):
            if kind == "lines":
                body, ids = lines_object(next_id, size, rng)
            else:
                body, ids = tar_object(next_id, size, rng, tar_members, tar_style)
            next_id += len(ids)
            yield key, body, ids
            continue
        count, payload = _tfrecord_plan(size, next_id, record_size)
        ids = list(range(next_id, next_id + count))
        next_id += count
        yield key, tfrecord_object(ids, payload, rng), ids


def _tfrecord_plan(size: int, next_id: int, record_size: int | None) -> tuple[int, int]:
    if record_size is None:
        return plan_records(size, next_id + MAX_RECORDS_PER_OBJECT)
    # The largest id this object can hold sizes the varint: at most one record per byte.
    return plan_fixed_records(size, record_size, next_id + max(1, size // record_size))


# --- reading back without TensorFlow -------------------------------------------------------


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """``(field_number, wire_type, value)`` of a protobuf message (varint and bytes only)."""
    pos = 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            yield number, wire, buf[pos : pos + length]
            pos += length
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def decode_example(data: bytes) -> dict[str, bytes | int]:
    """The single-valued bytes/int64 features of a serialized ``tf.train.Example``."""
    out: dict[str, bytes | int] = {}
    for _, _, features in _fields(data):
        assert isinstance(features, bytes)
        for _, _, entry in _fields(features):
            assert isinstance(entry, bytes)
            name, feature = b"", b""
            for number, _, value in _fields(entry):
                assert isinstance(value, bytes)
                if number == 1:
                    name = value
                else:
                    feature = value
            out[name.decode()] = _feature_value(feature)
    return out


def _feature_value(feature: bytes) -> bytes | int:
    for kind, _, lst in _fields(feature):
        assert isinstance(lst, bytes)
        for _, wire, value in _fields(lst):
            if kind == 1 and isinstance(value, bytes):
                return value
            if kind == 3 and wire == 0 and isinstance(value, int):
                return _int64(value)
            if kind == 3 and isinstance(value, bytes):  # packed
                return _int64(_read_varint(value, 0)[0])
    raise ValueError("empty or unsupported feature")


def read_ids(path: str | os.PathLike[str]) -> list[int]:
    """The ``id`` of every record of a (non-compressed) TFRecord file, CRCs checked."""
    with open(path, "rb") as f:
        return [int(decode_example(r)["id"]) for r in read_records(f)]


# --- S3 ------------------------------------------------------------------------------------


def make_client(endpoint_url: str | None, region: str | None = None) -> S3Client:
    """A boto3 S3 client for ``endpoint_url`` (path-style addressing, credentials from the env
    as it is now: a session of its own, not boto3's default one, which keeps the credentials it
    first resolved — moto takes any, SeaweedFS only those it started with)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard"}),
    )


def ensure_bucket(client: S3Client, bucket: str) -> None:
    """Create ``bucket`` unless it exists."""
    from botocore.exceptions import ClientError

    try:
        client.head_bucket(Bucket=bucket)
        return
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise
    region = client.meta.region_name
    if region and region != "us-east-1":
        client.create_bucket(
            Bucket=bucket,
            CreateBucketConfiguration={"LocationConstraint": region},  # type: ignore[typeddict-item]
        )
    else:
        client.create_bucket(Bucket=bucket)


def upload_dataset(
    client: S3Client,
    bucket: str,
    prefix: str,
    *,
    kind: Kind,
    sizes: Sequence[int],
    seed: int,
    first_id: int = 0,
    record_size: int | None = None,
    tar_style: TarStyle = "image",
) -> Dataset:
    """Generate one object per entry of ``sizes`` (bytes) and put them under ``prefix``.

    Returns what was uploaded (keys, sizes, digests, record ids). Record ids run from
    ``first_id`` upwards, so two datasets with disjoint id ranges can share a bucket;
    ``record_size`` and ``tar_style`` are ``generate``'s.
    """
    dataset: Dataset = {
        "kind": kind,
        "bucket": bucket,
        "prefix": normalize_prefix(prefix),
        "keys": [],
        "sizes": {},
        "sha256": {},
        "ids": [],
        "records": 0,
        "bytes": 0,
    }

    def put(item: tuple[str, bytes, list[int]]) -> None:
        key, body, _ = item
        client.put_object(Bucket=bucket, Key=key, Body=body)

    # Generation stays in this thread (deterministic, CPU-bound); a few threads overlap the
    # puts. The executor's map is lazy only in results, so bound the bodies held in memory.
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        pending: list[Any] = []
        items = generate(
            prefix,
            kind=kind,
            sizes=sizes,
            seed=seed,
            first_id=first_id,
            record_size=record_size,
            tar_style=tar_style,
        )
        for item in items:
            key, body, ids = item
            dataset["keys"].append(key)
            dataset["sizes"][key] = len(body)
            dataset["sha256"][key] = hashlib.sha256(body).hexdigest()
            dataset["ids"].extend(ids)
            dataset["bytes"] += len(body)
            pending.append(pool.submit(put, item))
            if len(pending) >= 2 * UPLOAD_THREADS:
                pending.pop(0).result()
        for future in pending:
            future.result()
    dataset["records"] = len(dataset["keys"]) if kind == "raw" else len(dataset["ids"])
    return dataset


# --- command line --------------------------------------------------------------------------


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--endpoint", required=True, help="S3 endpoint URL, e.g. http://127.0.0.1:5000"
    )
    parser.add_argument("--region", default=None, help="default: $AWS_DEFAULT_REGION or us-east-1")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--prefix", default="", help="key prefix, e.g. train/")
    parser.add_argument("--kind", choices=KINDS, default="tfrecord")
    parser.add_argument("--objects", type=int, default=16, help="number of objects")
    parser.add_argument("--min-size", type=_size_arg, default=1024, help="e.g. 1KiB")
    parser.add_argument("--max-size", type=_size_arg, default=4 * 1024**2, help="e.g. 4MiB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-id", type=int, default=0, help="first record id")
    parser.add_argument(
        "--record-size", type=_size_arg, default=None, help="tfrecord: every record this size"
    )
    parser.add_argument(
        "--tar-style",
        choices=("image", "caption"),
        default="image",
        help="tar: samples with a 10-60 KiB image, or small ones (.cls, .json, .txt caption)",
    )
    parser.add_argument("--summary-json", help="also write the full dataset description here")
    args = parser.parse_args(argv)
    if args.objects < 1:
        parser.error("--objects must be at least 1")
    if not 0 < args.min_size <= args.max_size:
        parser.error("need 0 < --min-size <= --max-size")

    client = make_client(args.endpoint, args.region)
    ensure_bucket(client, args.bucket)
    sizes = object_sizes(args.objects, args.min_size, args.max_size, args.seed)
    started = time.monotonic()
    dataset = upload_dataset(
        client,
        args.bucket,
        args.prefix,
        kind=args.kind,
        sizes=sizes,
        seed=args.seed,
        first_id=args.first_id,
        record_size=args.record_size,
        tar_style=args.tar_style,
    )
    elapsed = time.monotonic() - started
    print(
        f"uploaded {len(dataset['keys'])} {args.kind} objects, {dataset['records']} records, "
        f"{format_size(dataset['bytes'])} to s3://{args.bucket}/{dataset['prefix']} "
        f"in {elapsed:.1f} s"
    )
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(dataset, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
