"""Both download backends (``download.client`` classic and crt) against a real S3 endpoint: a
moto server on 127.0.0.1 started by this module. Each case drives the transfer the way the
downloader does (prepare, submit_parts until True, wait for done) and checks what a user relies
on: the bytes on disk, exactly one done() per object, and errors that ``store.classify()`` sorts
the same way for both backends.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import ipaddress
import queue
import random
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest

from prefetchd.config import Config, config_from_dict
from prefetchd.download.classic import ClassicTransfer
from prefetchd.download.endpoint import endpoint_for
from prefetchd.download.jobs import Job
from prefetchd.download.native import NativeTransfer
from prefetchd.download.order import SourceObject
from prefetchd.download.store import Fault, classify
from prefetchd.download.transfer import make_transfer
from prefetchd.download.verify import IntegrityError, SizeChanged
from prefetchd.errors import ConfigError
from testkit import s3server

pytest.importorskip("awscrt")

import awscrt.s3

from prefetchd.download.crt import CrtTransfer, store_error

BUCKET = "prefetchd-transfer-test"
PART = 64 * 1024  # the smallest download.part_size allowed
CLIENTS = ("classic", "crt", "native")
BACKENDS = {"classic": ClassicTransfer, "crt": CrtTransfer, "native": NativeTransfer}

# Settings from the machine that could point boto3 or the CRT somewhere else.
_AWS_UNSET = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CA_BUNDLE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


@dataclass(frozen=True)
class Stored:
    obj: SourceObject  # as a listing reports it
    data: bytes


# --- the S3 server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def aws_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fake credentials, no profile files, no instance metadata, for this module only."""
    nowhere = tmp_path_factory.mktemp("aws") / "missing"
    with pytest.MonkeyPatch.context() as mp:
        for name in _AWS_UNSET:
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_CONFIG_FILE", str(nowhere))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(nowhere))
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        yield


@pytest.fixture(scope="module")
def endpoint(aws_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A plain-HTTP moto server on 127.0.0.1, for the whole module."""
    with moto_server(tmp_path_factory.mktemp("moto")) as url:
        yield url


@contextlib.contextmanager
def moto_server(directory: Path, *tls: str) -> Iterator[str]:
    """testkit's moto server on a free port of 127.0.0.1 (``tls``: ``-c cert -k key``), logging
    into ``directory``; stopped by its PID on exit."""
    with s3server.moto_server(log_path=directory / "moto.log", tls=tls) as url:
        yield url


@pytest.fixture(scope="module")
def objects(endpoint: str) -> dict[str, Stored]:
    """The test objects, uploaded once: name -> (listing entry, bytes)."""
    return upload_objects(endpoint)


def upload_objects(
    endpoint: str, *, multipart: bool = True, verify: str | None = None
) -> dict[str, Stored]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", verify=verify)
    s3.create_bucket(Bucket=BUCKET)
    rng = random.Random(7)
    bodies = {
        "small": ("data/small.bin", rng.randbytes(1024)),
        "large": ("data/large.bin", rng.randbytes(3 * PART + 1234)),  # 4 parts
        "empty": ("data/empty.bin", b""),
        "hostile": ("data/a b+ü%?#&=;../x.bin", rng.randbytes(2000)),
    }
    stored: dict[str, Stored] = {}
    for name, (key, data) in bodies.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=data)
        stored[name] = Stored(_listed(s3, key), data)
    if not multipart:
        return stored
    # A multipart upload: its ETag is not an MD5, so only the size can be verified.
    key, data = "data/multipart.bin", rng.randbytes(5 * 1024**2 + 100)
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    etags = [
        s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=n, Body=chunk)["ETag"]
        for n, chunk in ((1, data[: 5 * 1024**2]), (2, data[5 * 1024**2 :]))
    ]
    s3.complete_multipart_upload(
        Bucket=BUCKET,
        Key=key,
        UploadId=upload,
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n + 1} for n, e in enumerate(etags)]},
    )
    stored["multipart"] = Stored(_listed(s3, key), data)
    assert stored["multipart"].obj.etag and stored["multipart"].obj.etag.endswith("-2")
    return stored


@dataclass(frozen=True)
class TlsServer:
    url: str
    ca_bundle: str  # its self-signed certificate
    objects: dict[str, Stored]


@pytest.fixture(scope="module")
def tls_server(aws_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    """A moto server speaking HTTPS with a self-signed certificate for 127.0.0.1."""
    directory = tmp_path_factory.mktemp("moto-tls")
    cert, key = _self_signed(directory)
    with moto_server(directory, "-c", cert, "-k", key) as url:
        yield TlsServer(url, cert, upload_objects(url, multipart=False, verify=cert))


def _self_signed(directory: Path) -> tuple[str, str]:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


def _listed(s3: Any, key: str) -> SourceObject:
    head = s3.head_object(Bucket=BUCKET, Key=key)
    return SourceObject(key, int(head["ContentLength"]), head["ETag"].strip('"'))


# --- driving a transfer like the downloader does ----------------------------------------------


def make_config(tmp_path: Path, endpoint: str, client: str, concurrency: int = 4) -> Config:
    return config_from_dict(
        {
            "source": {
                "url": f"s3://{BUCKET}/data/",
                "endpoint_url": endpoint,
                "format": "raw",  # the objects are random bytes
            },
            "download": {
                "cache_dir": str(tmp_path / "cache"),
                "part_size": PART,
                "concurrency": concurrency,
                "client": client,
                "retries": 2,
            },
            "output": {"ram_dir": str(tmp_path / "ram")},
            "status": {"state_dir": str(tmp_path / "state")},
        }
    )


@dataclass
class Outcome:
    jobs: list[Job]
    calls: collections.Counter[int]  # done() calls per job
    main_thread_calls: int


def fetch(config: Config, objs: list[SourceObject], tmp_path: Path) -> Outcome:
    """Prepare and submit every object, wait for every done(), shut the transfer down."""
    results: queue.Queue[Job] = queue.Queue()
    calls: collections.Counter[int] = collections.Counter()
    on_main = 0

    def done(job: Job) -> None:
        nonlocal on_main
        calls[id(job)] += 1
        on_main += threading.current_thread() is threading.main_thread()
        results.put(job)

    transfer = make_transfer(config, done)
    assert isinstance(transfer, BACKENDS[config.download.client])
    jobs = [Job(0, i, obj, f"o{i}", tmp_path / f"o{i}.part") for i, obj in enumerate(objs)]
    try:
        deadline = time.monotonic() + 60
        for job in jobs:
            transfer.prepare(job)
            assert job.tmp.exists()  # created by prepare(), where the start-up sweep finds it
            while not transfer.submit_parts(job, timeout=0.1):
                assert time.monotonic() < deadline, "no free slot for 60 s: slots leaked"
        for _ in jobs:
            results.get(timeout=60)
    finally:
        transfer.shutdown()
    return Outcome(jobs, calls, on_main)


def check_done_once(out: Outcome) -> None:
    assert [out.calls[id(job)] for job in out.jobs] == [1] * len(out.jobs)
    assert out.main_thread_calls == 0
    assert all(job.fd == -1 for job in out.jobs)


# --- the cases ----------------------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("name", ["small", "large", "empty", "hostile", "multipart"])
def test_object_arrives_byte_for_byte(
    client: str, name: str, endpoint: str, objects: dict[str, Stored], tmp_path: Path
) -> None:
    stored = objects[name]
    out = fetch(make_config(tmp_path, endpoint, client), [stored.obj], tmp_path)
    check_done_once(out)
    (job,) = out.jobs
    assert job.error is None
    assert job.tmp.read_bytes() == stored.data


@pytest.mark.parametrize("client", CLIENTS)
def test_many_objects_share_the_slots(
    client: str, endpoint: str, objects: dict[str, Stored], tmp_path: Path
) -> None:
    """More objects than slots, large ones taking every slot: all arrive, none twice, so the
    slots taken for each object are given back."""
    names = ["small", "large", "empty", "hostile"] * 4 + ["multipart"]
    config = make_config(tmp_path, endpoint, client, concurrency=4)
    out = fetch(config, [objects[n].obj for n in names], tmp_path)
    check_done_once(out)
    for job, name in zip(out.jobs, names, strict=True):
        assert job.error is None, (name, job.error)
        assert job.tmp.read_bytes() == objects[name].data


@pytest.mark.parametrize("client", CLIENTS)
def test_https_endpoint_with_ca_bundle(
    client: str, tls_server: TlsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """source.endpoint_url over TLS, the certificate trusted through AWS_CA_BUNDLE only (both
    backends read it through botocore's config); native speaks plain HTTP and says so."""
    monkeypatch.setenv("AWS_CA_BUNDLE", tls_server.ca_bundle)
    if client == "native":  # plain HTTP only: refused when the config is read, naming the key
        with pytest.raises(ConfigError, match=r"^download.client: 'native' .* use crt for https$"):
            make_config(tmp_path, tls_server.url, client)
        return
    names = ["small", "large", "empty"]
    objs = [tls_server.objects[n].obj for n in names]
    out = fetch(make_config(tmp_path, tls_server.url, client), objs, tmp_path)
    check_done_once(out)
    for job, name in zip(out.jobs, names, strict=True):
        assert job.error is None, (name, job.error)
        assert job.tmp.read_bytes() == tls_server.objects[name].data


@pytest.mark.parametrize("client", CLIENTS)
def test_missing_key_is_gone(client: str, endpoint: str, tmp_path: Path) -> None:
    obj = SourceObject("data/deleted-after-listing.bin", 1024, "0" * 32)
    out = fetch(make_config(tmp_path, endpoint, client), [obj], tmp_path)
    check_done_once(out)
    error = out.jobs[0].error
    assert isinstance(error, botocore.exceptions.ClientError)
    assert error.response["Error"]["Code"] == "NoSuchKey"
    assert classify(error) is Fault.GONE


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("name", ["small", "large", "empty"])
def test_changed_etag_is_changed(
    client: str, name: str, endpoint: str, objects: dict[str, Stored], tmp_path: Path
) -> None:
    """The listing's ETag no longer matches: moto honours If-Match and answers 412, so both
    backends report PreconditionFailed (Fault.CHANGED) before any byte is written. (A store that
    ignored If-Match would send the new bytes, and verification would raise IntegrityError
    because the MD5 differs from the listed ETag.)"""
    obj = objects[name].obj
    changed = SourceObject(obj.key, obj.size, "0" * 32)
    out = fetch(make_config(tmp_path, endpoint, client), [changed], tmp_path)
    check_done_once(out)
    error = out.jobs[0].error
    assert isinstance(error, botocore.exceptions.ClientError), repr(error)
    assert error.response["Error"]["Code"] == "PreconditionFailed"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert classify(error) is Fault.CHANGED


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("name", ["small", "large"])
def test_size_unlike_listing_is_integrity_error(
    client: str, name: str, endpoint: str, objects: dict[str, Stored], tmp_path: Path
) -> None:
    """A manifest size that is wrong (no ETag to send): the object is re-fetched, not published."""
    obj = objects[name].obj
    out = fetch(
        make_config(tmp_path, endpoint, client),
        [SourceObject(obj.key, obj.size + 1, None)],
        tmp_path,
    )
    check_done_once(out)
    assert isinstance(out.jobs[0].error, IntegrityError)
    assert isinstance(out.jobs[0].error, SizeChanged) and out.jobs[0].error.actual == obj.size


@pytest.mark.parametrize("client", CLIENTS)
def test_no_credentials_is_denied(
    client: str,
    endpoint: str,
    objects: dict[str, Stored],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    out = fetch(make_config(tmp_path, endpoint, client), [objects["small"].obj], tmp_path)
    check_done_once(out)
    error = out.jobs[0].error
    assert isinstance(error, botocore.exceptions.NoCredentialsError), repr(error)
    assert classify(error) is Fault.DENIED


def test_crt_missing_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "prefetchd.download.crt")
    monkeypatch.setitem(sys.modules, "awscrt", None)  # import awscrt -> ImportError
    config = make_config(tmp_path, "http://127.0.0.1:9", "crt")
    with pytest.raises(ConfigError, match=r"pip install 'prefetchd\[crt\]'"):
        make_transfer(config, lambda job: None)


# --- pure parts of the CRT backend ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host", "tls", "path"),
    [
        ("http://127.0.0.1:9000", "127.0.0.1:9000", False, "/b/k%20y"),
        ("https://minio.example.com", "minio.example.com", True, "/b/k%20y"),
        ("https://[::1]:8443/s3", "[::1]:8443", True, "/s3/b/k%20y"),
    ],
)
def test_endpoint_url_is_honoured(url: str, host: str, tls: bool, path: str) -> None:
    endpoint = endpoint_for("b", url, "")
    assert (endpoint.host, endpoint.tls, endpoint.path("k y")) == (host, tls, path)


def test_aws_buckets_are_virtual_hosted_unless_dotted() -> None:
    aws = "https://s3.eu-west-1.amazonaws.com"
    assert endpoint_for("b", None, aws).host == "b.s3.eu-west-1.amazonaws.com"
    assert endpoint_for("b", None, aws).path("k") == "/k"
    assert endpoint_for("b.c", None, aws).host == "s3.eu-west-1.amazonaws.com"
    assert endpoint_for("b.c", None, aws).path("k") == "/b.c/k"


@pytest.mark.parametrize(
    ("status", "body", "fault"),
    [
        (404, None, Fault.GONE),
        (412, None, Fault.CHANGED),
        (403, None, Fault.FORBIDDEN),  # the downloader asks the bucket: skip or pause
        (416, None, Fault.PERMANENT),
        (503, b"<Error><Code>SlowDown</Code><Message>Reduce</Message></Error>", Fault.TRANSIENT),
        (500, None, Fault.TRANSIENT),
        (403, b"<Error><Code>SignatureDoesNotMatch</Code></Error>", Fault.DENIED),
    ],
)
def test_http_errors_classify_like_boto3(status: int, body: bytes | None, fault: Fault) -> None:
    crt = awscrt.s3.S3ResponseError(
        code=14343,
        name="AWS_ERROR_S3_INVALID_RESPONSE_STATUS",
        message="Invalid response status from request",
        status_code=status,
        headers=[],
        body=body,
    )
    assert classify(store_error(crt, status, body)) is fault


def test_native_missing_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the built C extension, the config names the key and the fix, on one line."""
    monkeypatch.setitem(sys.modules, "prefetchd.kernel._http", None)  # import -> ImportError
    with pytest.raises(ConfigError, match=r"^download.client: 'native' needs .*build_ext"):
        make_config(tmp_path, "http://127.0.0.1:9", "native")
