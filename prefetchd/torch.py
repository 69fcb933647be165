"""PyTorch integration, the public name for ``prefetchd.consume.torch``:
``prefetchd.torch.RecordDataset(config, ...)`` is a ``torch.utils.data.IterableDataset`` of
serialized records. Importing it imports PyTorch (never TensorFlow); the daemon never does."""

from prefetchd.consume.torch import RecordDataset

__all__ = ["RecordDataset"]
