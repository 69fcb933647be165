"""The transfer clients' contract (``Transfer``) and the factory that picks one by
``download.client``: ``classic.ClassicTransfer`` (boto3), ``crt.CrtTransfer`` (awscrt) or
``native.NativeTransfer`` (the C engine ``prefetchd.kernel._http``). All keep the same
contract and verify through the same ``verify.Verifier``.
"""

from __future__ import annotations

from typing import Protocol

from prefetchd.config import NATIVE_MISSING, Config
from prefetchd.download.jobs import Done, Job
from prefetchd.download.signals import Signals
from prefetchd.errors import ConfigError


class Transfer(Protocol):
    """What the downloader needs of a backend. ``done(job)`` is called exactly once per prepared
    job, after ``job.fd`` is closed and set to -1, with ``job.error`` set if the object could
    not be fetched or failed verification: from a thread other than the caller's, or, made
    ``on_caller`` (native), mostly on the caller's, inside ``poll`` and ``submit_parts``."""

    def prepare(self, job: Job) -> None: ...

    def submit_parts(self, job: Job, timeout: float) -> bool: ...

    def poll(self, timeout: float) -> bool:
        """Settle finished requests on this thread, waiting up to ``timeout`` seconds for one;
        False at once where the client's own threads settle them."""
        ...

    def shutdown(self) -> None: ...

    def refresh_credentials(self) -> None: ...


def make_transfer(
    config: Config, done: Done, signals: Signals | None = None, *, on_caller: bool = False
) -> Transfer:
    """The backend ``download.client`` names; raises ``ConfigError`` if it is not installed.
    ``on_caller``: a client that can settle its requests on the caller's thread (native) does,
    in ``poll`` — one Python thread does the whole work of an object, with no hand-over of the
    GIL between two threads per object (issue 28)."""
    if config.download.client == "native":
        try:  # the optional C extension: built by setup.py where a compiler is
            from prefetchd.download.native import NativeTransfer
        except ImportError as exc:
            if exc.name != "prefetchd.kernel._http":
                raise
            raise ConfigError(NATIVE_MISSING) from None
        return NativeTransfer(config, done, signals, on_caller=on_caller)
    if config.download.client != "crt":
        from prefetchd.download.classic import ClassicTransfer

        return ClassicTransfer(config, done, signals)
    try:  # imported here so the classic path never loads awscrt
        from prefetchd.download.crt import CrtTransfer
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "awscrt":
            raise
        raise ConfigError(
            "download.client: 'crt' needs the crt extra: pip install 'prefetchd[crt]'"
        ) from None
    return CrtTransfer(config, done, signals)
