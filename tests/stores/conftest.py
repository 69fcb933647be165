"""Real object stores for tests/stores: Ceph RGW and the JuiceFS S3 gateway, one server per
store for the module (``store``), started by ``testkit.ceph`` / ``testkit.juicefs`` with the
session's fake credentials as their S3 user's keys.

``s3_endpoint``, ``s3_client`` and ``bucket`` are overridden here, so the shared fixtures
(``upload``, ``write_config``, ``run_daemon``) work against the store unchanged. A store that
cannot start is an error naming the reason (the server's log tail), never a skip.
"""

from __future__ import annotations

import os
import socket
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testkit import ceph, juicefs, sample_data
from testkit.s3server import HOST

STORES = ("ceph", "juicefs")


@dataclass
class Store:
    kind: str
    endpoint: str
    version: str


def free_block(size: int, start: int) -> int:
    """The first port from ``start`` that begins ``size`` ports free right now, outside the
    kernel's ephemeral range: a port in it may be any client connection's, and the connections
    earlier tests closed hold thousands of them for a minute (TIME_WAIT), so a block of 40
    inside it can be found nowhere (a full run, 2026-12-05: none free in 43000-53000)."""
    low, high = _ephemeral_range()
    for base in range(start, 65536 - size, size):
        if base <= high and base + size > low:
            continue
        if all(_free(port) for port in range(base, base + size)):
            return base
    raise RuntimeError(f"no {size} free ports from {start} outside {low}-{high}")


def _ephemeral_range() -> tuple[int, int]:
    """``net.ipv4.ip_local_port_range`` (Linux's default where it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return 32768, 60999
    return int(low), int(high)


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module", params=STORES)
def store(request: pytest.FixtureRequest, aws_env: None) -> Iterator[Store]:
    key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
    server: Any
    if request.param == "ceph":
        server = ceph.start_ceph(free_block(ceph.PORTS, 23000), key, secret)
        version = ceph.version()
    else:
        server = juicefs.start_juicefs(free_block(2, 24000), key, secret)
        version = juicefs.version()
    try:
        yield Store(request.param, server.endpoint, version)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3_endpoint(store: Store) -> str:
    return store.endpoint


@pytest.fixture(scope="module")
def s3_client(s3_endpoint: str) -> Any:
    return sample_data.make_client(s3_endpoint)


@pytest.fixture
def bucket(s3_client: Any) -> Iterator[str]:
    """A fresh bucket, emptied and deleted afterwards one object at a time: Ceph 16 and the
    JuiceFS gateway refuse DeleteObjects without a Content-MD5 header, which botocore no longer
    sends (it sends a CRC32)."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    try:
        pages = s3_client.get_paginator("list_objects_v2").paginate(Bucket=name)
        keys = [o["Key"] for page in pages for o in page.get("Contents", ())]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda key: s3_client.delete_object(Bucket=name, Key=key), keys))
        s3_client.delete_bucket(Bucket=name)
    except Exception as exc:  # the test's own failure matters more than the clean-up's
        warnings.warn(f"could not delete bucket {name}: {exc}", stacklevel=1)
