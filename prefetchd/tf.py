"""TensorFlow integration, the public name for ``prefetchd.consume.tf``:
``prefetchd.tf.dataset(config, ...)`` is a ready ``tf.data.Dataset`` of serialized records.
Importing it imports TensorFlow; the daemon never does."""

from prefetchd.consume.position import TrainingPosition
from prefetchd.consume.tf import dataset, safe_cycle_length

__all__ = ["TrainingPosition", "dataset", "safe_cycle_length"]
