"""Which store errors are worth retrying: regressions where HTTP 416 was treated as transient
and paused downloads for ever, and a stale listed size let bytes past the window land."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest

from prefetchd.download.store import Fault, classify, http_status, is_throttling
from prefetchd.download.verify import SizeChanged, stored_size


def client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": "refused"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return botocore.exceptions.ClientError(response, "GetObject")


@pytest.mark.parametrize(
    ("status", "code", "fault"),
    [
        (416, "InvalidRange", Fault.PERMANENT),
        (416, "416", Fault.PERMANENT),  # the crt client's name when the body has none
        (400, "InvalidArgument", Fault.PERMANENT),
        (400, "InvalidRequest", Fault.PERMANENT),
        (403, "InvalidObjectState", Fault.PERMANENT),  # archived (Glacier): no retry helps
        (405, "MethodNotAllowed", Fault.PERMANENT),
        (403, "AccessDenied", Fault.FORBIDDEN),  # this object, or everything: ask the bucket
        (403, "403", Fault.FORBIDDEN),
        (403, "ExpiredToken", Fault.DENIED),  # credentials, never one object: pause
        (400, "ExpiredToken", Fault.DENIED),
        (403, "SignatureDoesNotMatch", Fault.DENIED),
        (404, "NoSuchKey", Fault.GONE),
        (412, "PreconditionFailed", Fault.CHANGED),
        (400, "RequestTimeout", Fault.TRANSIENT),
        (429, "TooManyRequests", Fault.TRANSIENT),
        (503, "SlowDown", Fault.TRANSIENT),
        (500, "InternalError", Fault.TRANSIENT),
    ],
)
def test_store_errors_are_classified_by_what_a_retry_can_fix(
    status: int, code: str, fault: Fault
) -> None:
    error = client_error(status, code)
    assert classify(error) is fault
    assert http_status(error) == status


def test_connection_trouble_is_transient() -> None:
    assert classify(ConnectionResetError("reset")) is Fault.TRANSIENT
    assert http_status(ConnectionResetError("reset")) is None


@pytest.mark.parametrize(
    ("content_range", "length", "size"),
    [
        ("bytes 0-99/1234", 100, 1234),
        ("bytes */1234", None, 1234),  # a 416 answer
        ("bytes 0-99/*", 100, None),  # the store does not say
        (None, 5000, 5000),  # a whole-object GET
        (None, None, None),
    ],
)
def test_stored_size_reads_the_total_from_the_first_response(
    content_range: str | None, length: int | None, size: int | None
) -> None:
    assert stored_size(content_range, length) == size


def test_size_changed_names_both_sizes() -> None:
    error = SizeChanged(2048, 24_117_248)
    assert (error.listed, error.actual) == (2048, 24_117_248)
    assert "24117248" in str(error) and "2048" in str(error)


@pytest.mark.parametrize(
    ("status", "code", "throttled"),
    [
        (503, "SlowDown", True),
        (503, "ServiceUnavailable", True),
        (429, "TooManyRequests", True),
        (400, "ThrottlingException", True),
        (500, "InternalError", False),
        (502, "BadGateway", False),
    ],
)
def test_throttling_never_counts_against_one_object(
    status: int, code: str, throttled: bool
) -> None:
    """An object is given up only for failures of its own, never for the store asking
    everyone to slow down."""
    assert is_throttling(client_error(status, code)) is throttled
