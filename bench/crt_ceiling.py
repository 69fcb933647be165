"""The second ceiling: ``awscrt.s3.S3Client`` downloading every object straight to files on tmpfs.

    python -m bench.crt_ceiling ENDPOINT BUCKET PREFIX TARGET_DIR
        [--connections N] [--part-size MiB]

The CRT runs HTTP, signing and file writes on its own native threads (``recv_filepath``), so
no Python touches the bytes. All objects are requested at once; the client's connection limit
bounds what is in flight. Prints ``objects bytes seconds startup_cpu_s transfer_cpu_s
transfer_s`` on success: ``startup_cpu_s`` is this process's CPU from its start to its first GET
(interpreter, imports, listing), so the harness can tell the transfer's CPU from the
start-up's; the last two are its CPU and wall time from the first GET to the last object
(neither listing nor exit counted: ``bench.profile_download``'s ceiling). Credentials come from
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from urllib.parse import quote, urlsplit

import awscrt.auth
import awscrt.http
import awscrt.s3
import boto3


def cpu_now() -> float:
    """CPU seconds (user + system) of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("endpoint")
    p.add_argument("bucket")
    p.add_argument("prefix")
    p.add_argument("target")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--part-size", type=int, default=8, help="MiB")
    args = p.parse_args()
    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", endpoint_url=args.endpoint, region_name=region)
    started = time.perf_counter()
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=args.bucket, Prefix=args.prefix)
    objects = [(o["Key"], o["Size"]) for page in pages for o in page.get("Contents", [])]
    host = urlsplit(args.endpoint).netloc
    provider = awscrt.auth.AwsCredentialsProvider.new_static(
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    )
    client = awscrt.s3.S3Client(
        region=region,
        signing_config=awscrt.s3.create_default_s3_signing_config(
            region=region, credential_provider=provider
        ),
        tls_mode=awscrt.s3.S3RequestTlsMode.DISABLED,
        part_size=args.part_size * 1024 * 1024,
        max_active_connections_override=args.connections,
        memory_limit=max(256, 2 * args.connections * args.part_size) * 1024 * 1024,
    )
    errors: list[str] = []
    left = threading.Semaphore(0)

    def on_done(key: str, *, error: BaseException | None = None, **_: object) -> None:
        if error is not None:
            errors.append(f"{key}: {error}")
        left.release()

    startup_cpu = cpu_now()
    first_get = time.perf_counter()
    requests = []
    for i, (key, _) in enumerate(objects):
        headers = awscrt.http.HttpHeaders([("Host", host)])
        path = f"/{args.bucket}/{quote(key, safe='/~')}"
        requests.append(
            client.make_request(
                type=awscrt.s3.S3RequestType.GET_OBJECT,
                request=awscrt.http.HttpRequest("GET", path, headers),
                recv_filepath=os.path.join(args.target, f"{i:07d}"),
                on_done=lambda key=key, **kw: on_done(key, **kw),
            )
        )
    for _ in requests:
        left.acquire()
    transfer_cpu, transfer_s = cpu_now() - startup_cpu, time.perf_counter() - first_get
    elapsed = time.perf_counter() - started
    if errors:
        print("\n".join(errors[:5]), file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
