"""The bench's one awscrt driver: ``awscrt.s3.S3Client`` writing objects straight into tmpfs
files on its native threads (``recv_filepath``: no Python touches the bytes). Two modes:

    python -m bench.drivers.crt ceiling ENDPOINT BUCKET PREFIX TARGET_DIR
        [--connections N] [--part-size MiB]
    python -m bench.drivers.crt lean ENDPOINT BUCKET PREFIX TARGET_DIR FIFO
        [--in-flight N] [--connections N] [--seed S]

**ceiling** (the second ceiling, ``ceiling-crt``): every object requested at once, in listing
order, to ``TARGET_DIR/<n>``; the client's connection limit (default 64) bounds what is in
flight. Prints ``objects bytes seconds startup_cpu_s transfer_cpu_s transfer_s`` on success:
``startup_cpu_s`` is this process's CPU from its start to its first GET (interpreter, imports,
listing), so the harness can tell the transfer's CPU from the start-up's; the last two are its
CPU and wall time from the first GET to the last object (neither listing nor exit counted:
``bench.profile.download``'s ceiling).

**lean** (the lean design limit's downloader): what the daemon's data path would cost with
nothing but the transfer. The objects, listed and shuffled (seeded), are fetched
``--in-flight`` at a time (default 16, 32 connections) into ``TARGET_DIR/.tmp/<n>.part``; each
one is renamed to ``TARGET_DIR/<n>.tfrecord`` when complete and its path written, one line, to
``FIFO``, where the trainer (``bench.drivers.readers.lean``) reads it with ``TFRecordDataset``:
no cache copy, no re-framing, no mixing. Files stay until the harness removes ``TARGET_DIR``
(no RAM budget: the dataset fits in RAM here, as the ceiling's copy does). Closing the FIFO ends
the trainer's dataset. On success the last stdout line is JSON: ``{"objects": n, "bytes": b,
"startup_cpu_s": c}``, ``startup_cpu_s`` as above.

Both exit 1 (the first errors on stderr) if any object failed. Credentials come from
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlsplit

MiB = 1024**2
PART_SIZE_MIB = 8
CEILING_CONNECTIONS = 64
LEAN_CONNECTIONS = 32
LEAN_IN_FLIGHT = 16
# The client's memory limit is at least this (ceiling: 256 MiB, lean: 1 GiB; as before the merge)
# and at least two parts per connection.
CEILING_MEMORY_FLOOR = 256 * MiB
LEAN_MEMORY_FLOOR = 1024 * MiB


def cpu_now() -> float:
    """CPU seconds (user + system) of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def list_objects(
    endpoint: str, bucket: str, prefix: str, seed: int | None = None
) -> list[tuple[str, int]]:
    """``(key, size)`` of every object under ``prefix``: in listing order, or shuffled with
    ``seed``."""
    import boto3

    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=region)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    objects = [(o["Key"], o["Size"]) for page in pages for o in page.get("Contents", [])]
    if seed is not None:
        random.Random(seed).shuffle(objects)
    return objects


def crt_client(connections: int, part_size: int, memory_floor: int) -> Any:
    """An awscrt S3 client without TLS (the store is on loopback), static credentials."""
    import awscrt.auth
    import awscrt.s3

    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    provider = awscrt.auth.AwsCredentialsProvider.new_static(
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    )
    return awscrt.s3.S3Client(
        region=region,
        signing_config=awscrt.s3.create_default_s3_signing_config(
            region=region, credential_provider=provider
        ),
        tls_mode=awscrt.s3.S3RequestTlsMode.DISABLED,
        part_size=part_size,
        max_active_connections_override=connections,
        memory_limit=max(memory_floor, 2 * connections * part_size),
    )


class Completions:
    """The finished GETs: counts them and keeps their errors, frees one in-flight slot for
    each, and with a FIFO publishes each file (rename into place, then one line on the FIFO).
    Called on awscrt's threads, so it holds a lock."""

    def __init__(self, expected: int, slots: threading.Semaphore, fifo: IO[str] | None) -> None:
        self.expected, self.slots, self.fifo = expected, slots, fifo
        self.errors: list[str] = []
        self.done = 0
        self._lock = threading.Lock()
        self.all_done = threading.Event()
        if expected == 0:
            self.all_done.set()

    def finished(
        self, key: str, part: Path, final: Path, *, error: BaseException | None = None, **_: Any
    ) -> None:
        with self._lock:
            if error is not None:
                self.errors.append(f"{key}: {error}")
            elif self.fifo is not None:
                os.rename(part, final)
                self.fifo.write(f"{final}\n")
                self.fifo.flush()
            self.done += 1
            if self.done == self.expected:
                self.all_done.set()
        self.slots.release()


def download_all(
    client: Any,
    endpoint: str,
    bucket: str,
    objects: list[tuple[str, int]],
    files: list[tuple[Path, Path]],
    in_flight: int,
    fifo: IO[str] | None,
) -> tuple[Completions, float | None]:
    """Every object through ``client``, ``in_flight`` at a time, object ``i`` into
    ``files[i]`` (the file it is written to, the name it is published under). Returns, once
    all have completed or failed, the completions (their ``errors``) and this process's CPU at
    its first GET (None without objects)."""
    import awscrt.http
    import awscrt.s3

    host = urlsplit(endpoint).netloc
    slots = threading.Semaphore(in_flight)
    completions = Completions(len(objects), slots, fifo)
    requests, first_get_cpu = [], None
    for (key, _), (part, final) in zip(objects, files, strict=True):
        slots.acquire()
        headers = awscrt.http.HttpHeaders([("Host", host)])
        path = f"/{bucket}/{quote(key, safe='/~')}"
        first_get_cpu = cpu_now() if first_get_cpu is None else first_get_cpu
        requests.append(
            client.make_request(
                type=awscrt.s3.S3RequestType.GET_OBJECT,
                request=awscrt.http.HttpRequest("GET", path, headers),
                recv_filepath=str(part),
                on_done=functools.partial(completions.finished, key, part, final),
            )
        )
    completions.all_done.wait()
    return completions, first_get_cpu


def failed(completions: Completions) -> bool:
    if completions.errors:
        print("\n".join(completions.errors[:5]), file=sys.stderr)
    return bool(completions.errors)


def ceiling(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    objects = list_objects(args.endpoint, args.bucket, args.prefix)
    part_size = args.part_size * MiB
    client = crt_client(args.connections, part_size, CEILING_MEMORY_FLOOR)
    files = [(Path(args.target, f"{i:07d}"),) * 2 for i in range(len(objects))]
    first_get = time.perf_counter()
    # All at once: the connection limit bounds what is in flight.
    completions, startup_cpu = download_all(
        client, args.endpoint, args.bucket, objects, files, max(1, len(objects)), None
    )
    startup_cpu = cpu_now() if startup_cpu is None else startup_cpu
    transfer_cpu, transfer_s = cpu_now() - startup_cpu, time.perf_counter() - first_get
    elapsed = time.perf_counter() - started
    if failed(completions):
        return 1
    print(
        len(objects),
        sum(size for _, size in objects),
        f"{elapsed:.3f}",
        f"{startup_cpu:.3f}",
        f"{transfer_cpu:.3f}",
        f"{transfer_s:.3f}",
    )
    return 0


def lean(args: argparse.Namespace) -> int:
    objects = list_objects(args.endpoint, args.bucket, args.prefix, args.seed)
    target = Path(args.target)
    files = [
        (target / ".tmp" / f"{i:07d}.part", target / f"{i:07d}.tfrecord")
        for i in range(len(objects))
    ]
    # Opening a FIFO for writing waits for its reader: the trainer, once the harness says go.
    with open(args.fifo, "w", encoding="utf-8") as fifo:
        client = crt_client(args.connections, PART_SIZE_MIB * MiB, LEAN_MEMORY_FLOOR)
        (target / ".tmp").mkdir(parents=True, exist_ok=True)
        completions, first_get_cpu = download_all(
            client, args.endpoint, args.bucket, objects, files, args.in_flight, fifo
        )
    if failed(completions):
        return 1
    size = sum(s for _, s in objects)
    print(json.dumps({"objects": len(objects), "bytes": size, "startup_cpu_s": first_get_cpu}))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    modes = p.add_subparsers(dest="mode", required=True)
    c = modes.add_parser("ceiling", help="every object at once, listing order, to TARGET_DIR")
    lean_mode = modes.add_parser("lean", help="the lean design limit's downloader")
    for mode in (c, lean_mode):
        for name in ("endpoint", "bucket", "prefix", "target"):
            mode.add_argument(name)
    c.add_argument("--connections", type=int, default=CEILING_CONNECTIONS)
    c.add_argument("--part-size", type=int, default=PART_SIZE_MIB, help="MiB")
    lean_mode.add_argument("fifo")
    lean_mode.add_argument("--in-flight", type=int, default=LEAN_IN_FLIGHT, help="objects at once")
    lean_mode.add_argument("--connections", type=int, default=LEAN_CONNECTIONS)
    lean_mode.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    return ceiling(args) if args.mode == "ceiling" else lean(args)


if __name__ == "__main__":
    sys.exit(main())
