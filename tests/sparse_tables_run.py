"""One worker of the 2-worker sparse-table run of tests/test_sparse_tables.py.

Trains that test's model (a keras.layers.Embedding, Adagrad, batches with repeated ids and
partial batches that leave a worker empty) through loops.Update under
MultiWorkerMirroredStrategy; the chief writes the weights and the table's accumulator
to the .npz file named by argv[1].
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import test_sparse_tables as tables  # noqa: E402

import loops  # noqa: E402
from loops import topology  # noqa: E402
from loops.tables import row_updates  # noqa: E402

strategy = loops.make_strategy("multi_worker_mirrored")
model, update = tables.make_update(strategy, lambda: keras.optimizers.Adagrad(tables.RATE))
tables.train(strategy, update, model, list(zip(tables.IDS, tables.TARGETS)))
(accumulator,) = row_updates.slots_of(update.optimizer, model.trainable_variables[0])
if topology.is_chief(strategy):
    np.savez(sys.argv[1], *model.get_weights(), accumulator=np.asarray(accumulator))
print("sparse tables trained", int(update.optimizer.iterations.numpy()), "steps", flush=True)
