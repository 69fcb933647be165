"""The lean design limit's downloader: awscrt writing objects straight into tmpfs files.

    python -m bench.lean ENDPOINT BUCKET PREFIX TARGET_DIR FIFO [--in-flight N] [--seed S]

What the daemon's data path would cost with nothing but the transfer: the objects, listed and
shuffled (seeded), are fetched ``--in-flight`` at a time (default 16) by one
``awscrt.s3.S3Client`` into ``TARGET_DIR/.tmp/<n>.part`` on its native threads
(``recv_filepath``: no Python touches the bytes); each one is renamed to ``TARGET_DIR/<n>``
when complete and its path written, one line, to ``FIFO``, where the trainer
(``bench.readers.lean``) reads it with ``TFRecordDataset``: no cache copy, no re-framing, no
mixing. Files stay until the harness removes ``TARGET_DIR`` (no RAM budget: the dataset fits in
RAM here, as the ceiling's copy does).

Closing the FIFO ends the trainer's dataset. On success the last stdout line is JSON:
``{"objects": n, "bytes": b, "startup_cpu_s": c}``, where ``startup_cpu_s`` is this process's
CPU from its start to its first GET (interpreter, imports, listing). Exit 1 if any object
failed. Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
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
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

IN_FLIGHT = 16
CONNECTIONS = 32
PART_SIZE = 8 * 1024**2


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def list_objects(endpoint: str, bucket: str, prefix: str, seed: int) -> list[tuple[str, int]]:
    """``(key, size)`` of every object under ``prefix``, in a seeded shuffled order."""
    import boto3

    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=region)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    objects = [(o["Key"], o["Size"]) for page in pages for o in page.get("Contents", [])]
    random.Random(seed).shuffle(objects)
    return objects


def crt_client(connections: int) -> Any:
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
        part_size=PART_SIZE,
        max_active_connections_override=connections,
        memory_limit=max(1024**3, 2 * connections * PART_SIZE),
    )


class Announcer:
    """Publishes finished downloads: rename into place, then one line on the FIFO. Called on
    awscrt's threads, so it holds a lock; each completion frees one in-flight slot."""

    def __init__(self, fifo: Any, slots: threading.Semaphore) -> None:
        self.fifo, self.slots = fifo, slots
        self.errors: list[str] = []
        self.done = 0
        self._lock = threading.Lock()
        self.all_done = threading.Event()
        self.expected = -1

    def finished(
        self, key: str, part: Path, final: Path, *, error: BaseException | None = None, **_: Any
    ) -> None:
        with self._lock:
            if error is not None:
                self.errors.append(f"{key}: {error}")
            else:
                os.rename(part, final)
                self.fifo.write(f"{final}\n")
                self.fifo.flush()
            self.done += 1
            if self.done == self.expected:
                self.all_done.set()
        self.slots.release()


def download_all(args: argparse.Namespace, objects: list[tuple[str, int]], fifo: Any) -> Any:
    """Every object through one client, ``args.in_flight`` at a time, announced on ``fifo``
    as each completes. Returns, once all have completed or failed, the announcer (its
    ``errors``) and this process's CPU at its first GET."""
    import awscrt.http
    import awscrt.s3

    client = crt_client(args.connections)
    host = urlsplit(args.endpoint).netloc
    target = Path(args.target)
    (target / ".tmp").mkdir(parents=True, exist_ok=True)
    slots = threading.Semaphore(args.in_flight)
    announcer = Announcer(fifo, slots)
    announcer.expected = len(objects)
    requests, first_get_cpu = [], None
    for i, (key, _) in enumerate(objects):
        slots.acquire()
        part, final = target / ".tmp" / f"{i:07d}.part", target / f"{i:07d}.tfrecord"
        headers = awscrt.http.HttpHeaders([("Host", host)])
        path = f"/{args.bucket}/{quote(key, safe='/~')}"
        first_get_cpu = cpu_self() if first_get_cpu is None else first_get_cpu
        requests.append(
            client.make_request(
                type=awscrt.s3.S3RequestType.GET_OBJECT,
                request=awscrt.http.HttpRequest("GET", path, headers),
                recv_filepath=str(part),
                on_done=functools.partial(announcer.finished, key, part, final),
            )
        )
    if objects:
        announcer.all_done.wait()
    return announcer, first_get_cpu


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    for name in ("endpoint", "bucket", "prefix", "target", "fifo"):
        p.add_argument(name)
    p.add_argument("--in-flight", type=int, default=IN_FLIGHT, help="objects at once")
    p.add_argument("--connections", type=int, default=CONNECTIONS)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    objects = list_objects(args.endpoint, args.bucket, args.prefix, args.seed)
    # Opening a FIFO for writing waits for its reader: the trainer, once the harness says go.
    with open(args.fifo, "w", encoding="utf-8") as fifo:
        announcer, first_get_cpu = download_all(args, objects, fifo)
    if announcer.errors:
        print("\n".join(announcer.errors[:5]), file=sys.stderr)
        return 1
    size = sum(s for _, s in objects)
    print(json.dumps({"objects": len(objects), "bytes": size, "startup_cpu_s": first_get_cpu}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
