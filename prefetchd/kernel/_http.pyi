# Type stub of the native GET client's engine (prefetchd/kernel/_http.c).
from typing import Any

from typing_extensions import Buffer

# (tag, HTTP status or 0, errno or 0, bytes written, kept response headers by lower-case name,
#  (algorithm, digest) of the 2xx body or None, the non-2xx body (at most MAX_ERROR_BODY) or None)
Completion = tuple[Any, int, int, int, dict[str, str], tuple[str, bytes] | None, bytes | None]

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
    def wait(self, timeout: float, /) -> list[Completion]: ...
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
