"""Every task of a parameter-server cluster (or one process) for tests/test_table_training.py.

    python tests/table_training_tasks.py OUT.npz

The chief trains tests/test_table_training.py's model (an EmbeddingTable and a
Dense head) through `loops.Trainer` on its four batches and writes the table
(read shard by shard), the head, each shard's rows and device and the table
optimizer's step count into OUT.npz; then tests/test_table_plan.py's model of plain
Embeddings under a `loops.TablePlan` (its large table placed), whose table, accumulator,
shards' rows and devices and step count it writes beside them (`plan_*`). Under
loops-launch with parameter servers the workers and servers serve; without
TF_CONFIG one process trains on the default strategy.
"""

import os
import sys

import numpy as np
import tensorflow as tf
import test_table_plan as plan_case
import test_table_training as case

import loops
from loops.cluster import parameter_server


def main(out):
    if "TF_CONFIG" in os.environ:
        parameter_server.serve_unless_chief()
        strategy = loops.make_strategy("parameter_server")
    else:
        strategy = tf.distribute.get_strategy()
    loop = loops.Trainer(
        case.TableModel(own_table=True),
        strategy=strategy,
        train_data=case.batches,
        progress=loops.testing.quiet_progress(),
    )
    loop.train(len(case.IDS))
    definition = loop.definition
    np.savez(
        out,
        table=tf.concat(definition.table.shards, 0).numpy(),
        kernel=definition.head.kernel.numpy(),
        bias=definition.head.bias.numpy(),
        shard_rows=np.array([shard.shape[0] for shard in definition.table.shards]),
        devices=np.array([shard.device for shard in definition.table.shards]),
        iterations=int(definition.table.optimizer.iterations.numpy()),
    )
    loop.close()
    np.savez(out, **dict(np.load(out)), **plan_case.planned_figures(strategy))
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
