"""What the crt client reports when the store refuses: the same code boto3 would show."""

from __future__ import annotations

import pytest

pytest.importorskip("awscrt")

import awscrt.exceptions
import awscrt.s3

from prefetchd.download.crt import store_error
from prefetchd.download.store import Fault, classify, describe


@pytest.mark.parametrize(
    ("name", "status", "body", "code"),
    [
        ("AWS_ERROR_S3_SLOW_DOWN", 503, b"<Error><Code>SlowDown</Code></Error>", "SlowDown"),
        ("AWS_ERROR_S3_SLOW_DOWN", 503, None, "SlowDown"),
        ("AWS_ERROR_S3_SLOW_DOWN", None, None, "SlowDown"),  # the CRT often gives no status
        ("AWS_ERROR_S3_INTERNAL_ERROR", None, None, "InternalError"),
    ],
)
def test_throttling_past_the_retries_names_the_store_code_like_boto3(
    name: str, status: int | None, body: bytes | None, code: str
) -> None:
    """Regression: with crt, status said "AwsCrtError: AWS_ERROR_S3_SLOW_DOWN ..." where the
    classic client says "SlowDown (HTTP 503)"; both are paused and retried (transient)."""
    error = store_error(awscrt.exceptions.AwsCrtError(0, name, "throttled"), status, body)
    assert classify(error) is Fault.TRANSIENT
    assert describe(error).startswith(f"{code} (HTTP {status or ''}")


def test_a_connection_failure_stays_what_it_is() -> None:
    error = awscrt.exceptions.AwsCrtError(0, "AWS_IO_SOCKET_CONNECTION_REFUSED", "refused")
    assert store_error(error, None, None) is error
    assert classify(error) is Fault.TRANSIENT


@pytest.mark.parametrize(
    ("status", "body", "fault"),
    [
        (416, None, Fault.PERMANENT),
        (416, b"<Error><Code>InvalidRange</Code></Error>", Fault.PERMANENT),
        (400, b"<Error><Code>InvalidArgument</Code></Error>", Fault.PERMANENT),
        (403, None, Fault.FORBIDDEN),
    ],
)
def test_refusals_no_retry_can_fix_are_permanent_with_crt_too(
    status: int, body: bytes | None, fault: Fault
) -> None:
    """Regression: a 416 was a transient error that paused downloads for ever."""
    error = awscrt.s3.S3ResponseError(
        code=0, name="AWS_ERROR_S3_INVALID_RESPONSE_STATUS", message="refused", body=body
    )
    assert classify(store_error(error, status, body)) is fault
