"""prefetchd: prefetch training data from S3 into TFRecord shards on a RAM disk, beside the trainer.

The trainer side is one import: ``from prefetchd import ready_files`` (shard paths), or
``from prefetchd import records`` (their serialized records, with no framework at all).

The public names are loaded on first use (PEP 562): ``python -m prefetchd`` imports this
package before any command runs, and ``prefetchd status`` must not pay for the trainer side
(inotify, the shard releaser) or the config parser's YAML until it needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefetchd.config import Config, load_config
    from prefetchd.consume.ready import ready_files
    from prefetchd.consume.records import records
    from prefetchd.errors import DaemonFailed, JobChanged

__version__ = "0.1.0"
__all__ = [
    "Config",
    "DaemonFailed",
    "JobChanged",
    "__version__",
    "load_config",
    "ready_files",
    "records",
]

_LAZY = {
    "Config": "prefetchd.config",
    "load_config": "prefetchd.config",
    "ready_files": "prefetchd.consume.ready",
    "records": "prefetchd.consume.records",
    "DaemonFailed": "prefetchd.errors",
    "JobChanged": "prefetchd.errors",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access, then keep the name here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'prefetchd' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
