"""prefetchd: feed TensorFlow from S3 at full speed.

The trainer side is one import: ``from prefetchd import ready_files``.
"""

from prefetchd.config import Config, load_config
from prefetchd.consume.ready import ready_files
from prefetchd.errors import DaemonFailed

__version__ = "0.1.0"
__all__ = ["Config", "DaemonFailed", "__version__", "load_config", "ready_files"]
