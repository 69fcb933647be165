"""Keras integration, the public name for ``prefetchd.consume.keras``:
``prefetchd.keras.PositionCheckpoint`` feeds ``model.fit`` one prefetchd epoch per Keras epoch
and saves the consumer position with the model's checkpoints (docs/keras.md).
Importing it imports Keras and TensorFlow; the daemon never does."""

from prefetchd.consume.keras import PositionCheckpoint

__all__ = ["PositionCheckpoint"]
