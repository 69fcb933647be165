"""Exceptions that carry a user-facing message and the exit code documented in the README
("Exit codes")."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3
EXIT_INCOMPLETE = 4  # run: every epoch consumed, but some objects were quarantined or skipped


class PrefetchdError(Exception):
    """Base class: ``str(err)`` is one line meant for the user; ``exit_code`` is the CLI's."""

    exit_code = EXIT_FAILURE


class ConfigError(PrefetchdError):
    """The config file or a command-line argument is invalid (exit 2)."""

    exit_code = EXIT_USAGE


class RuntimeFailure(PrefetchdError):
    """The daemon cannot do its job: bucket missing, access denied, nothing matches (exit 1)."""

    exit_code = EXIT_FAILURE


class NotRunning(PrefetchdError):
    """No daemon is running for this config (exit 3, like LSB ``status``)."""

    exit_code = EXIT_NOT_RUNNING


class DaemonFailed(RuntimeFailure):
    """Raised in the trainer by ``ready_files()`` when the daemon failed or vanished."""


class JobChanged(RuntimeFailure):
    """Raised in the trainer by ``ready_files()`` when the daemon now runs another job than the
    one this trainer was reading (restarted with a changed config, or its state removed): the
    shards on the RAM disk are that job's, not this trainer's (exit 1)."""


class CorruptObject(Exception):
    """A downloaded object cannot be parsed by its format; it is quarantined, the epoch goes on."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


class PositionError(ValueError):
    """A saved position or torch state cannot be resumed with this config: malformed, of an
    unknown version, or saved by another job (dataset, seed, host) — one line naming which.
    Never answered by a fresh start: that would train the epoch's records twice or never."""
