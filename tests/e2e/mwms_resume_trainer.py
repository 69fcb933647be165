"""A ``MultiWorkerMirroredStrategy`` custom loop that resumes after every worker was killed, as
docs/multi-worker.md writes it, with a journal of what each step trained.

    python -m tests.e2e.mwms_resume_trainer CONFIG OUT.jsonl CHECKPOINT_DIR
        [--epochs N] [--save-every K] [--die-at STEP] [--die-saving STEP|endE]

TF_CONFIG (from the environment) names this worker; its own daemon serves CONFIG. Each worker
keeps its own checkpoints and positions in ``CHECKPOINT_DIR/worker<i>`` (its own host's disk),
saved every K steps and at the end of each epoch, numbered by save; at start the workers agree
on the last save every one of them finished and restore that one.

``--die-at STEP``: SIGKILL this worker right after training step STEP. ``--die-saving STEP``:
SIGKILL it at step STEP's checkpoint, after the model was saved and before the position was (the
other workers then wait in the next step's all-reduce until the test kills them too);
``--die-saving endE``: the same at the checkpoint after epoch E's last step.

Appends to OUT.jsonl one line per step, ``{"step": s, "epoch": e, "ids": [...]}`` (the ids this
worker's replica trained), a line ``{"restored": s}`` at start (the steps the restored
model had trained) and ``{"finished": true}`` at
the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

import prefetchd.tf
from prefetchd import load_config

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64)}
BATCH = 8  # per worker
KEEP = 3  # checkpoints and positions each worker keeps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument("checkpoints")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--die-at", type=int, default=None)
    parser.add_argument("--die-saving", default=None, metavar="STEP|endE")
    args = parser.parse_args()
    config = args.config
    journal = open(args.out, "a", encoding="utf-8")  # noqa: SIM115 (open until the end)

    def note(**line: Any) -> None:
        journal.write(json.dumps(line) + "\n")
        journal.flush()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync  # one replica per worker (CPU)
    worker = strategy.cluster_resolver.task_id
    directory = os.path.join(args.checkpoints, f"worker{worker}")

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(1e-6)
        optimizer.build(model.trainable_variables)  # its step count is restored too
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=KEEP)

    def position_file(save: int) -> str:
        return os.path.join(directory, f"prefetchd-position-{save}.json")

    def saved() -> set[int]:
        """The saves (numbered 1, 2, ... on every worker alike) of which this worker wrote
        both the model and the position."""
        models = {int(path.rsplit("-", 1)[1]) for path in manager.checkpoints}
        names = os.listdir(directory) if os.path.isdir(directory) else []
        found = (re.fullmatch(r"prefetchd-position-(\d+)\.json", name) for name in names)
        return models & {int(m.group(1)) for m in found if m}

    @tf.function
    def gather(mine: tf.Tensor) -> Any:
        def share() -> tf.Tensor:
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce("SUM", tf.one_hot(ctx.replica_id_in_sync_group, workers) * mine)

        return strategy.run(share)

    def every_worker(value: int) -> list[int]:
        """``value`` of every worker, in worker order (an all-reduce: also a barrier)."""
        total = strategy.experimental_local_results(gather(tf.constant(float(value))))[0]
        return [int(v) for v in total.numpy()]

    # The last save every worker finished: a worker killed between its model and its position
    # has not finished that save, and the others go back to the one before with it.
    mine = saved()
    save = min(every_worker(max(mine, default=0)))
    if save:
        if save not in mine:
            sys.exit(f"worker {worker}: no checkpoint {save} in {directory}")
        checkpoint.restore(os.path.join(directory, f"ckpt-{save}")).expect_partial()
        position = prefetchd.tf.TrainingPosition.load(position_file(save))
    else:
        position = prefetchd.tf.TrainingPosition()
    step = int(optimizer.iterations.numpy())  # steps the restored model trained
    note(restored=step)

    def checkpoint_now(label: str) -> None:
        nonlocal save
        save += 1
        manager.save(checkpoint_number=save)
        if args.die_saving == label:
            os.kill(os.getpid(), signal.SIGKILL)
        # Kept until every worker finished this save too: one may resume from the last one.
        position.save(position_file(save), free_past_epochs=False)
        kept = min(saved())  # the oldest model checkpoint the manager kept
        for name in os.listdir(directory):
            found = re.fullmatch(r"prefetchd-position-(\d+)\.json", name)
            if found and int(found.group(1)) < kept:
                os.remove(os.path.join(directory, name))

    def parse(record: tf.Tensor) -> tf.Tensor:
        return tf.io.parse_single_example(record, FEATURES)["id"]

    def replica_step(ids: tf.Tensor) -> tf.Tensor:
        x = tf.reshape(tf.cast(ids, tf.float32), (-1, 1))
        with tf.GradientTape() as tape:
            per_example = tf.square(model(x) - x)[:, 0]
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH * workers)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return ids

    @tf.function
    def train_step(batch: Any) -> Any:
        return strategy.run(replica_step, args=(batch,))

    epochs = load_config(config, trainer=True).epochs.count or 2
    epochs = min(epochs, args.epochs)
    # A worker whose share of an epoch ran out before the save is past it; the others may not
    # be, and every worker steps through each epoch's end together.
    for epoch in range(min(every_worker(position.epoch)), epochs):
        records = prefetchd.tf.dataset(config, epoch=epoch, position=position, timeout=120)
        batches = records.map(parse).batch(BATCH * workers)
        for batch in strategy.experimental_distribute_dataset(batches):
            trained = strategy.experimental_local_results(train_step(batch))
            ids = [int(i) for part in trained for i in part.numpy()]
            position.trained(len(ids))  # this worker's replica's records
            step += 1
            note(step=step, epoch=epoch, ids=ids)
            if args.die_at == step:
                os.kill(os.getpid(), signal.SIGKILL)
            if step % args.save_every == 0:
                # every worker finished the last save: each step since was an all-reduce
                position.free_past_epochs()
                checkpoint_now(str(step))
        position.epoch_done(epoch)
        position.free_past_epochs()  # the iterator's end was agreed on by every worker
        checkpoint_now(f"end{epoch}")
    every_worker(0)  # every worker saved its last position: nobody goes back any more
    position.finish()
    note(finished=True)
    journal.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
