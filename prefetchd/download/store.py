"""Talking to the object store: clients, listings, and what an error means for us.

Clients are created inside each child process (never pickled across processes). Throttling and
5xx responses are retried by botocore's "standard" retry mode with ``download.retries``; this
module only classifies what is left after botocore gave up.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import logging
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import botocore.config
import botocore.exceptions
import botocore.session

from prefetchd.config import Config, SourceConfig, split_s3_url
from prefetchd.download.hooks import observe
from prefetchd.download.listing import list_objects
from prefetchd.download.order import SourceObject, in_share, matcher
from prefetchd.download.signals import Signals
from prefetchd.errors import RuntimeFailure
from prefetchd.logs import escape_key, redact

log = logging.getLogger(__name__)

S3Client = Any  # botocore's client class is generated at run time
HEAD_CONCURRENCY = 8  # HEAD requests in flight for manifest keys given without a size
LISTED_EVERY = 1000  # objects between two ``listed`` calls of list_share: one per full page


# What a session reads its credentials and settings from, besides profile and region.
_SESSION_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)


def session(profile: str | None, region: str | None) -> botocore.session.Session:
    """A botocore session for ``profile`` and ``region``, reused by the process's clients and
    by the crt transfer's signer: a client costs ~7 ms of CPU from a session that has made one
    before and ~110 ms from a new one (each session parses the S3 service model), most of the
    downloader's start-up. A session keeps the credentials it resolved, so a changed
    environment gets a new one. Created inside the process that uses it; never pickled across
    processes. botocore's, not boto3's: the daemon makes only clients, and importing boto3
    also imports s3transfer, which nothing here uses (start-up CPU, docs/benchmarks.md)."""
    env = hashlib.sha256(repr([os.environ.get(k) for k in _SESSION_ENV]).encode()).digest()
    return _session(profile, region, env)


def forget_credentials() -> None:
    """Make the next ``session()`` resolve the credential chain again, re-reading its files
    (``~/.aws/credentials`` or ``AWS_SHARED_CREDENTIALS_FILE``, ``~/.aws/config``, a web
    identity token file): the store refused the credentials a session holds (rotated by a
    sidecar, expired). Costs the next client a new session (~110 ms of CPU)."""
    _session.cache_clear()


@functools.lru_cache(maxsize=4)
def _session(profile: str | None, region: str | None, env: bytes) -> botocore.session.Session:
    # What boto3.session.Session(profile_name=, region_name=) sets on its botocore session.
    made = botocore.session.Session(profile=profile)
    if region is not None:
        made.set_config_variable("region", region)
    return made


def make_client(
    config: Config,
    *,
    pool: int | None = None,
    attempts: int | None = None,
    timeout: float = 60,
    signals: Signals | None = None,
) -> S3Client:
    """An S3 client with botocore's "standard" retries (``attempts`` tries in all, default
    ``download.retries`` + 1), ``pool`` connections (default ``download.concurrency`` + 4)
    and ``timeout`` seconds to wait for a response; with ``signals``, its requests keep the
    host's budgets and report to them (``hooks.observe``)."""
    attempts = attempts or config.download.retries + 1
    client = _new_client(config, pool, attempts, timeout)
    return client if signals is None else observe(client, signals, attempts)


def _new_client(config: Config, pool: int | None, attempts: int, timeout: float) -> S3Client:
    src = config.source
    return session(src.profile, src.region).create_client(
        "s3",
        endpoint_url=src.endpoint_url,
        config=botocore.config.Config(
            retries={
                "mode": "standard",
                "total_max_attempts": attempts,
            },
            max_pool_connections=pool or config.download.concurrency + 4,
            connect_timeout=min(10, timeout),
            read_timeout=timeout,
            tcp_keepalive=True,
            s3={"addressing_style": _style(src.addressing_style)},
        ),
    )


def _style(style: str) -> Literal["auto", "virtual", "path"]:
    """``source.addressing_style``, already one of these (config.ADDRESSING_STYLES)."""
    styles: dict[str, Literal["auto", "virtual", "path"]] = {"virtual": "virtual", "path": "path"}
    return styles.get(style, "auto")


class Fault(enum.Enum):
    """What an error that survived botocore's retries means for one object."""

    GONE = "gone"  # 404: deleted after listing -> skipped, counted
    CHANGED = "changed"  # 412: overwritten after listing -> skipped, counted
    # 403 AccessDenied: this object's policy, or everyone's credentials? The downloader asks
    # the bucket (``bucket_readable``): readable -> skipped like PERMANENT; else as DENIED.
    FORBIDDEN = "forbidden"
    DENIED = "denied"  # bad or expired credentials -> pause, retry slowly
    # 416, 400 (but RequestTimeout), any other 4xx: the same request can never succeed ->
    # skipped, counted, logged once; never an endless pause
    PERMANENT = "permanent"
    TRANSIENT = "transient"  # 5xx, throttling, connection trouble -> retry later


_GONE = {"NoSuchKey", "404", "NotFound"}
_CHANGED = {"PreconditionFailed", "412"}
_FORBIDDEN = {"AccessDenied", "403", "Forbidden"}
# Codes that name the caller's credentials, never one object: a pause, whatever the bucket says.
_DENIED = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "TokenRefreshRequired",
    "InvalidToken",
}
# 4xx answers a retry can fix: the store timed out or throttled us (botocore retries these).
_RETRYABLE_4XX = {
    "RequestTimeout",
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "RequestTimeTooSkewed",  # our clock: botocore corrects its skew and retries
}


def classify(exc: BaseException) -> Fault:
    """What ``exc`` (a GET that botocore or the CRT gave up on) means for its object."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return _classify_code(
            str(exc.response.get("Error", {}).get("Code", "")), http_status(exc) or 0
        )
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return Fault.DENIED
    return Fault.TRANSIENT


def _classify_code(code: str, status: int) -> Fault:
    if code in _GONE:
        return Fault.GONE
    if code in _CHANGED:
        return Fault.CHANGED
    if code in _DENIED:
        return Fault.DENIED
    if code in _FORBIDDEN:
        return Fault.FORBIDDEN
    if code in _RETRYABLE_4XX or status in (408, 429) or not 400 <= status < 500:
        return Fault.TRANSIENT
    return Fault.PERMANENT  # 416 InvalidRange, 400 InvalidArgument, 403 InvalidObjectState...


_THROTTLING = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded"}


def is_throttling(exc: BaseException) -> bool:
    """Whether the store asked us to slow down (or is unavailable for everyone: 503, 429):
    never a sign that one object is broken."""
    if not isinstance(exc, botocore.exceptions.ClientError):
        return False
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return code in _THROTTLING or http_status(exc) in (429, 503)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a store error, if it came with one."""
    if not isinstance(exc, botocore.exceptions.ClientError):
        return None
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def bucket_readable(client: S3Client, config: Config) -> bool:
    """Whether this process's credentials can still list the source (one request, never
    raises): tells a 403 on one object (its own policy, KMS key, archive tier) from credentials
    that no longer work anywhere."""
    try:
        client.list_objects_v2(Bucket=config.source.bucket, Prefix=config.source.prefix, MaxKeys=1)
    except Exception:  # any failure means "not known to be readable": pause, do not skip
        return False
    return True


def describe(exc: BaseException) -> str:
    """A one-line description of an S3 error that never includes credentials (botocore and
    awscrt messages quote endpoint and proxy URLs: their user-info is masked)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        text = f"{err.get('Code', 'error')} (HTTP {status}): {err.get('Message', '')}".strip()
    else:
        text = f"{type(exc).__name__}: {exc}"
    return escape_key(redact(text))


def boot_failure(
    config: Config, exc: BaseException, source: SourceConfig | None = None
) -> RuntimeFailure:
    """Turn an error while first reaching the bucket of ``source`` (the config's first) into
    the one line the user sees."""
    src = source or config.source
    bucket = src.bucket
    if isinstance(exc, botocore.exceptions.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchBucket", "404"):
            return RuntimeFailure(f"bucket {bucket!r} does not exist ({src.url})")
        if code in _DENIED or code in _FORBIDDEN:
            return RuntimeFailure(f"access to bucket {bucket!r} denied: {describe(exc)}")
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return RuntimeFailure("no AWS credentials found (environment, profile or instance role)")
    if isinstance(exc, botocore.exceptions.EndpointConnectionError):
        return RuntimeFailure(f"cannot reach the object store: {redact(str(exc))}")
    return RuntimeFailure(f"cannot list {src.url}: {describe(exc)}")


def list_share(
    client: S3Client,
    config: Config,
    *,
    listed: Callable[[int], None] | None = None,
    source: SourceConfig | None = None,
) -> Iterator[SourceObject]:
    """This host's objects of ``source`` (the config's first), streamed page by page from
    ListObjectsV2 or from the manifest. ``listed(n)``, if given, hears how many objects the
    source has given so far, before ``source.include`` and sharding pick this host's: every
    ``LISTED_EVERY`` and at the end. Each source is split between hosts by the same hash."""
    src, shard = source or config.source, config.sharding
    prefix = src.prefix
    included = matcher(src.include)
    seen = 0
    for obj in _manifest_objects(client, src) if src.manifest else _listing(client, src):
        seen += 1
        if listed is not None and seen % LISTED_EVERY == 0:
            listed(seen)
        relative = obj.key[len(prefix) :] if obj.key.startswith(prefix) else obj.key
        if obj.key.endswith("/") and obj.size == 0:
            continue  # a "directory" placeholder, not data
        if included(relative) and in_share(obj.key, shard.num_workers, shard.worker_index):
            yield obj
    if listed is not None:
        listed(seen)


def _listing(client: S3Client, src: SourceConfig) -> Iterator[SourceObject]:
    """ListObjectsV2 pages read from their XML, not through botocore's parser (listing.py)."""
    return list_objects(client, src.bucket, src.prefix)


def _manifest_objects(client: S3Client, src: SourceConfig) -> Iterator[SourceObject]:
    """Manifest lines are ``key`` or ``key<TAB>size``; keys without a size are HEADed,
    ``HEAD_CONCURRENCY`` at a time (a manifest with sizes needs no request per key)."""
    manifest = src.manifest
    assert manifest is not None
    bucket = src.bucket

    def head(key: str) -> SourceObject | None:
        try:
            reply = client.head_object(Bucket=bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            if classify(exc) is not Fault.GONE:
                raise
            log.error("skipping s3://%s/%s: in source.manifest but not in the bucket", bucket, key)
            return None
        return SourceObject(key, int(reply["ContentLength"]), _etag(reply.get("ETag")))

    for obj in _headed(_manifest_lines(client, manifest), head):
        if obj is not None:
            yield obj


def _headed(
    lines: Iterator[str], head: Callable[[str], SourceObject | None]
) -> Iterator[SourceObject | None]:
    """Each manifest line as an object; a bounded number of HEADs run ahead of the reader."""
    with ThreadPoolExecutor(HEAD_CONCURRENCY) as pool:
        pending: deque[Future[SourceObject | None]] = deque()
        for line in lines:
            key, _, size = line.partition("\t")
            if not key:
                continue
            if size.strip().isdigit():
                while pending:  # keep the manifest's order
                    yield pending.popleft().result()
                yield SourceObject(key, int(size), None)
                continue
            pending.append(pool.submit(head, key))
            if len(pending) >= 4 * HEAD_CONCURRENCY:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _manifest_lines(client: S3Client, manifest: str) -> Iterator[str]:
    if manifest.startswith("s3://"):
        bucket, key = split_s3_url(manifest)
        try:
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
        except botocore.exceptions.ClientError as exc:
            raise RuntimeFailure(
                f"cannot read source.manifest {manifest}: {describe(exc)}"
            ) from None
        for raw in body.iter_lines(chunk_size=1024 * 1024):
            yield raw.decode("utf-8").rstrip("\r")
        return
    try:
        with Path(manifest).open(encoding="utf-8") as f:
            for line in f:
                yield line.rstrip("\r\n")
    except OSError as exc:
        raise RuntimeFailure(f"cannot read source.manifest {manifest}: {exc.strerror}") from None


def _etag(raw: str | None) -> str | None:
    return raw.strip('"') if raw else None
