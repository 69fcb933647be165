"""``prefetchd.keras``: ``model.fit`` over prefetchd epochs, resumable after a crash.

One prefetchd epoch per Keras epoch: ``PositionCheckpoint.dataset()`` is iterated once per
Keras epoch and reads the epoch Keras is in, so ``model.fit(ds, epochs=N)`` trains prefetchd
epochs 0..N-1 (``epochs.count`` must be at least N, or null). The callback counts the records
each step trained and saves the consumer position beside the model's checkpoint; a trainer
restarted after SIGKILL, with ``BackupAndRestore`` (or ``ModelCheckpoint`` + its own restore)
and the same callback, continues the epoch where the saved model left it.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

import keras

from prefetchd.config import Config, load_config
from prefetchd.consume.position import TrainingPosition
from prefetchd.consume.tf import resumable_dataset

log = logging.getLogger(__name__)


class PositionCheckpoint(keras.callbacks.Callback):  # type: ignore[misc]
    """Saves the consumer position to ``path`` whenever the model checkpoint is saved.

    ``batch_size`` is the batch size of the dataset given to ``fit`` (every batch but an
    epoch's last must be full: batch the records of ``dataset()`` without filtering them).
    ``save_freq`` must equal the model checkpoint's (``"epoch"`` or every N batches), and this
    callback must come after ``BackupAndRestore``/``ModelCheckpoint`` in ``callbacks=[...]``,
    so the position is never newer than the weights: after a crash between the two saves the
    records of at most ``save_freq`` batches are trained again, none is lost.
    """

    def __init__(
        self,
        config: str | os.PathLike[str] | Config,
        path: str | os.PathLike[str],
        *,
        batch_size: int,
        save_freq: int | str = "epoch",
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size: {batch_size} is not a positive number")
        if save_freq != "epoch" and (not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f'save_freq: {save_freq!r} is not "epoch" or a positive number')
        self.config = config if isinstance(config, Config) else load_config(config, trainer=True)
        self.path = path
        self.batch_size = batch_size
        self.save_freq = save_freq
        self.timeout = timeout
        self.position = TrainingPosition.load(path)
        self.position.check(self.config)  # a position of another job: one line, before fit
        self._epoch = self.position.epoch
        self._batches = 0  # batches of this epoch reported so far
        self._unsaved = 0  # batches since the last save

    def dataset(self, *, buffer_size: int | None = None) -> Any:
        """The records of the prefetchd epoch Keras is in, resuming from the saved position;
        map and batch them (``batch_size``) and pass the result to ``fit``."""
        cfg, timeout = self.config, self.timeout
        return resumable_dataset(
            cfg,
            lambda: self.position.files(cfg, self._epoch, timeout=timeout),
            buffer_size=buffer_size,
        )

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch
        self._batches = 0
        _forget_inferred_epoch_length()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        # With steps_per_execution > 1 Keras reports only every few batches.
        done = batch + 1 - self._batches
        self._batches = batch + 1
        self.position.trained(done * self.batch_size)
        if isinstance(self.save_freq, int):
            self._unsaved += done
            if self._unsaved >= self.save_freq:
                self._unsaved = 0
                self.position.save(self.path)

    def on_train_end(self, logs: Any = None) -> None:
        # fit returned normally: every record it was given was trained on.
        self.position.finish()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.position.reading and getattr(self.model, "stop_training", False):
            return  # a callback stopped training mid-epoch: the epoch is not done
        self.position.epoch_done(epoch)
        # Like BackupAndRestore and ModelCheckpoint: with a number of batches as save_freq,
        # the end of an epoch is no checkpoint (and the batch count runs on across epochs).
        if self.save_freq == "epoch":
            self.position.save(self.path)


def _forget_inferred_epoch_length() -> None:
    """Make Keras run this epoch to the dataset's end instead of the first epoch's length.

    For a dataset of unknown length, Keras 3's ``fit`` takes the number of batches of the first
    epoch it ran as every later epoch's length and stops them there. After a resume the first
    epoch is the rest of an interrupted one, so every later epoch would stop short and its
    other records would never be trained (seen with Keras 3.15). ``fit`` keeps that length on
    its local ``epoch_iterator`` and offers no public way to reset it, so it is reset here,
    before the epoch's iteration starts. If Keras changes, ``TrainingPosition.epoch_done``
    still refuses an epoch that ended early, so records are never lost silently.
    """
    frame = inspect.currentframe()
    for _ in range(8):  # on_epoch_begin <- CallbackList.on_epoch_begin <- fit
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return
        epoch_iterator = frame.f_locals.get("epoch_iterator")
        adapter = getattr(epoch_iterator, "data_adapter", None)
        if epoch_iterator is not None and adapter is not None:
            if adapter.num_batches is None:  # unknown length: the count was inferred
                epoch_iterator._num_batches = None
            return
