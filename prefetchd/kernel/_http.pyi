# Type stub of the native GET client's engine (prefetchd/kernel/_http.c).
from typing import Any, NamedTuple

from typing_extensions import Buffer

class Completion(NamedTuple):
    """A finished request (a struct sequence in C: a tuple whose fields have names)."""

    tag: Any  # what submit() was given
    status: int  # the HTTP status, or 0 when no answer came
    err: int  # an errno, or 0
    written: int  # bytes of the body written to the file
    headers: dict[str, str]  # the kept response headers, by lower-case name
    crc: tuple[str, bytes] | None  # (algorithm, digest) of a 2xx body
    body: bytes | None  # a non-2xx answer's body, at most MAX_ERROR_BODY bytes

MAX_HEAD: int
MAX_ERROR_BODY: int

class Engine:
    def __init__(
        self,
        address: str,
        port: int,
        connections: int,
        connect_timeout: float,
        idle_timeout: float,
        region: str,
    ) -> None: ...
    def submit(
        self,
        tag: object,
        host: str,
        path: str,
        fd: int,
        offset: int,
        length: int,
        total: int,
        range: str | None = None,
        if_match: str | None = None,
        checksum_mode: bool = False,
    ) -> None: ...
    def wait(self, timeout: float, least: int = 1, hold: float = 0.0, /) -> list[Completion]: ...
    def set_limit(self, limit: int, /) -> None: ...
    def interrupt(self) -> None: ...
    def set_credentials(self, access: str, secret: str, token: str | None = None, /) -> None: ...
    def cancel_all(self) -> None: ...
    def close(self) -> None: ...
    def stats(self) -> dict[str, int]: ...

def sign(
    host: str,
    path: str,
    headers: list[tuple[str, str]],
    amz_date: str,
    region: str,
    access: str,
    secret: str,
    /,
) -> str: ...
def sha256(data: Buffer, /) -> bytes: ...
def crc32(data: Buffer, crc: int = 0, /) -> int: ...
def parse(
    pieces: list[bytes], length: int, total: int, eof: bool, /
) -> tuple[int, int, int, dict[str, str], bytes]: ...
def set_crc32c(address: int, /) -> None: ...
