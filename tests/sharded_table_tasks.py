"""Every task of a parameter-server cluster (or one process) for tests/test_sharded_tables.py.

    python tests/sharded_table_tasks.py train|continue FROM_DIR TO_DIR OUT.npz

`train` sets a small EmbeddingTable (uneven shards) and trains it for the
batches of TRAIN_STEPS (duplicate ids, untouched rows); `continue` restores the
newest checkpoint of FROM_DIR and trains on MORE_STEPS. Both save into TO_DIR
and write the restored and the final table and accumulator, the losses, a
lookup and where each shard lived into OUT.npz. Under loops-launch with
parameter servers the workers and servers serve and the chief does this;
without TF_CONFIG one process does it on no strategy.
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import loops
from loops.cluster import parameter_server

ROWS, DIM = 11, 3
TRAIN_STEPS = (
    [0, 3, 3, 10, 5],
    [10, 10, 10, 1],
    [4, 7, 0, 6, 6, 9],
)
MORE_STEPS = ([2, 8, 8, 5, 10],)
LOOKED_UP = [0, 5, 6, 10, 3]


def initial_table():
    return (np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM) - 16.0) / 40.0


def step_weights():
    return tf.constant([[1.0, -2.0, 0.5]], tf.float32)


def main(mode, from_dir, to_dir, out):
    clustered = "TF_CONFIG" in os.environ
    if clustered:
        parameter_server.serve_unless_chief()
        strategy = loops.make_strategy("parameter_server")
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    else:
        strategy = tf.distribute.get_strategy()
    with strategy.scope():
        table = loops.EmbeddingTable(ROWS, DIM, keras.optimizers.Adagrad(0.1), name="table")
        table.build()
    checkpoint = tf.train.Checkpoint(table=table)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(table(ids) ** 2 * step_weights())
        table.apply_gradients(tape.gradient(loss, table.shards))
        return loss

    @tf.function
    def look_up(ids):
        return table(ids)

    def run(function, ids):
        if not clustered:
            return function(tf.constant(ids, tf.int64)).numpy()
        result = coordinator.schedule(function, args=(tf.constant(ids, tf.int64),))
        coordinator.join()
        return result.fetch()

    if mode == "train":
        starts = np.cumsum([0] + [shard.shape[0] for shard in table.shards])
        for shard, start in zip(table.shards, starts):
            shard.assign(initial_table()[start : start + shard.shape[0]])
    else:
        checkpoint.restore(tf.train.latest_checkpoint(from_dir)).assert_consumed()
    restored = values(table)
    losses = [run(step, ids) for ids in (TRAIN_STEPS if mode == "train" else MORE_STEPS)]
    checkpoint.save(os.path.join(to_dir, "ckpt"))
    np.savez(
        out,
        losses=np.array(losses, np.float32),
        restored_table=restored[0],
        restored_accumulator=restored[1],
        table=values(table)[0],
        accumulator=values(table)[1],
        looked_up=run(look_up, LOOKED_UP),
        shard_rows=np.array([shard.shape[0] for shard in table.shards]),
        devices=np.array([shard.device for shard in table.shards]),
    )
    print(f"wrote {out}", flush=True)


def values(table):
    """The table's and its accumulator's values, read shard by shard."""
    return (
        tf.concat(table.shards, 0).numpy(),
        tf.concat(table.slot_shards("accumulator"), 0).numpy(),
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
