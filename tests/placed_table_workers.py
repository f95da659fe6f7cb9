"""One worker of the 2-worker placed-table runs of tests/test_placed_tables.py.

    python tests/placed_table_workers.py OUT_DIR CHECKPOINT

Under MultiWorkerMirroredStrategy (one replica a worker), makes test_placed_tables'
Adagrad table split over the 2 replicas, so each worker holds one block;
restores CHECKPOINT (saved by 4 replicas after the first step of STEPS_OF_4),
trains the second step dealt to 2 replicas, and saves OUT_DIR/table-1 (every
worker saves: the chief there, the other into OUT_DIR/worker_1). Each worker
writes OUT_DIR/<task>.npz: the table and its slot read whole (a gather every
worker runs) as made and after the step, its own block, that block's rows and
device, the sizes of the variables it holds, what its replica looked up, and an SGD
and a row-wise Adagrad table trained on every step from their start; then
test_table_plan's model of plain Embeddings trained by a Trainer under a
`loops.TablePlan` (`plan_*`: its placed table split over the 2 workers).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import test_placed_tables as case  # noqa: E402
import test_table_plan  # noqa: E402

import loops  # noqa: E402
from loops import topology  # noqa: E402


def main(out_dir, checkpoint):
    strategy = loops.make_strategy("multi_worker_mirrored")
    with strategy.scope():
        table = loops.EmbeddingTable(
            case.ROWS, case.DIM, keras.optimizers.Adagrad(case.RATE), seed=7, name="items"
        )
        table.build()
    initial = table.whole().numpy(), table.whole("accumulator").numpy()
    tf.train.Checkpoint(table=table).restore(checkpoint).assert_consumed()
    ((looked_up,),) = case.trained(strategy, table, case.steps_of(2)[1:2])
    is_chief = topology.is_chief(strategy)
    saved_to = out_dir if is_chief else os.path.join(out_dir, topology.task_name(strategy))
    tf.train.Checkpoint(table=table).save(os.path.join(saved_to, "table"))
    (block,) = table.shards
    (bounds,) = table.embeddings.own_bounds
    np.savez(
        os.path.join(out_dir, f"{topology.task_name(strategy)}.npz"),
        initial_table=initial[0],
        initial_slot=initial[1],
        table=table.whole().numpy(),
        slot=table.whole("accumulator").numpy(),
        block=np.asarray(block),
        block_rows=np.array(bounds),
        block_device=np.array(block.device),
        held=np.array(
            [int(np.prod(p.shape)) for p in [*table.shards, *table.slot_shards("accumulator")]]
        ),
        looked_up=looked_up,
        **other_optimizers(strategy),
        **test_table_plan.planned_figures(strategy),
    )
    print("placed table restored, trained and saved", flush=True)


def other_optimizers(strategy):
    """SGD's and row-wise Adagrad's tables trained from their start on every step of
    STEPS_OF_4 dealt to the 2 workers' replicas, read whole (with the slot, if any)."""
    trained = {}
    for name in ("sgd", "rowwise_adagrad"):
        with strategy.scope():
            table = loops.EmbeddingTable(
                case.ROWS, case.DIM, case.OPTIMIZERS[name](), seed=7, name=name
            )
            table.build()
        case.trained(strategy, table, case.steps_of(2))
        trained[f"{name}_table"] = table.whole().numpy()
        for slot in table.slot_names:
            trained[f"{name}_{slot}"] = table.whole(slot).numpy()
    return trained


if __name__ == "__main__":
    main(*sys.argv[1:])
