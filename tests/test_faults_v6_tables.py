"""Issue 64's table faults: a placed Embedding's rows in get_weights/set_weights, a checkpoint
whose TablePlan changed named as such, and an EmbeddingTable's lookups on several replicas
sized by the Update's max_table_lookups= when its batches have no static size."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import test_table_plan
from test_table_plan import BIG, DIM, MIN_ROWS
from test_table_training import TableModel

import loops
from loops.tables import table_blocks
from loops.tables.table_plan import PlacedEmbedding, TableRows

# The big table's rows, set from outside (a plan draws its own): distinct, row-ordered values.
SET_ROWS = (np.arange(BIG * DIM, dtype=np.float32).reshape(BIG, DIM) - 60.0) / 200.0


def test_get_and_set_weights_copy_a_placed_tables_rows_whole_to_and_from_plain_embeddings():
    plain, _, _ = test_table_plan.make_model(seed_rows=SET_ROWS)
    strategy = loops.testing.replica_strategy(2)
    with strategy.scope(), loops.TablePlan(min_rows=MIN_ROWS).placing():
        planned, big, small = test_table_plan.make_model()
    assert isinstance(big, PlacedEmbedding) and type(small) is keras.layers.Embedding
    planned.set_weights(plain.get_weights())
    # Set back split: each replica's block took its own rows.
    assert [tuple(shard.shape) for shard in big.table.shards] == [(BIG // 2, DIM)] * 2
    np.testing.assert_array_equal(np.asarray(big.table.shards[1]), SET_ROWS[BIG // 2 :])
    got = planned.get_weights()
    assert [weight.shape for weight in got] == [(BIG, DIM), (test_table_plan.SMALL, DIM),
                                                (2 * DIM, 1), (1,)]  # fmt: skip
    for mine, theirs in zip(got, plain.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    ids = [test_table_plan.BIG_IDS[0], test_table_plan.SMALL_IDS[0]]
    np.testing.assert_allclose(planned(ids).numpy(), plain(ids).numpy(), rtol=1e-6)
    # And back: a model of plain Embeddings takes the placed model's weights.
    copy, copy_big, _ = test_table_plan.make_model()
    copy.set_weights(planned.get_weights())
    np.testing.assert_array_equal(copy_big.embeddings.numpy(), SET_ROWS)
    (rows,) = big.weights
    assert isinstance(rows, TableRows) and rows.path == f"{big.name}/embeddings"
    assert planned.count_params() == plain.count_params() == BIG * DIM + 6 * DIM + 2 * DIM + 1
    # The optimizer's variables leave the rows out: the Update trains them by rows.
    assert len(planned.trainable_variables) == len(plain.trainable_variables) - 1 == 3
    assert len(planned.trainable_weights) == 3
    assert [weight.path for weight in planned.non_trainable_weights] == [rows.path]
    with pytest.raises(
        ValueError,
        match=r"EmbeddingTable 'embedding\w*' holds its embeddings as one \(40, 3\) array, one "
        r"row a table row, and was given one of shape \(39, 3\)",
    ):
        big.table.set_whole(np.zeros((BIG - 1, DIM), np.float32))


def test_a_checkpoint_written_without_the_plan_and_resumed_with_it_names_the_table_and_plan(
    tmp_path,
):
    test_table_plan.run(1, 1, None, model_dir=str(tmp_path))
    with pytest.raises(
        ValueError,
        match=r"ckpt-1 holds no placed table of Embedding 'embedding\w*' \(40 x 3\), which this "
        r"loop's loops.TablePlan\(min_rows=16\) places as a loops.EmbeddingTable: .* the plan "
        r"changed the checkpoint's layout. Resume it as it was written \(no table_plan=, or "
        r"TablePlan\(min_rows=41\) to keep this Embedding replicated\)",
    ):
        test_table_plan.run(1, 2, loops.TablePlan(min_rows=MIN_ROWS), model_dir=str(tmp_path))


def test_a_checkpoint_written_with_the_plan_and_resumed_without_it_says_which_plan_to_give(
    tmp_path,
):
    test_table_plan.run(2, 1, loops.TablePlan(min_rows=MIN_ROWS), model_dir=str(tmp_path))
    with pytest.raises(
        ValueError,
        match=r"ckpt-1 holds the rows of a placed table of shape \(40, 3\) under "
        r"'model/.*table/embeddings', as a loops.TablePlan places an Embedding, and this "
        r"loop's Embedding 'embedding\w*' of that shape is a plain keras.layers.Embedding: "
        r"the plan changed the checkpoint's layout. Resume it with the plan it was written "
        r"with \(loops.Trainer\(..., table_plan=loops.TablePlan\(min_rows=N\)\), N at most 40\)",
    ):
        test_table_plan.run(1, 2, None, model_dir=str(tmp_path))
    # A plan that now places the small table too: that one is named.
    with pytest.raises(ValueError, match=r"holds no placed table of Embedding .*\(6 x 3\)"):
        test_table_plan.run(1, 2, loops.TablePlan(min_rows=2), model_dir=str(tmp_path))


LARGE = 70_000  # more rows than a table whose lookups are sized by its rows (65,536)
# 10 examples of 2 ids, in batches of 4, 4 and 2: no static batch size.
LARGE_IDS = np.array([[0, 69_999], [5, 5], [12, 40_000], [7, 3], [3, 0], [69_999, 8],
                      [1, 2], [2, 1], [9, 9], [35_000, 4]], np.int32)  # fmt: skip
LARGE_TARGETS = np.linspace(-1.0, 1.0, len(LARGE_IDS)).astype(np.float32)


class LargeTableModel(TableModel):
    """ids -> a 70,000-row EmbeddingTable (own Adagrad) -> mean -> Dense(1); the steps of
    test_table_training's TableModel."""

    def __init__(self, *, max_table_lookups, **loop_args):
        super().__init__(own_table=True, **loop_args)
        self.max_table_lookups = max_table_lookups

    def build(self):
        ids = keras.Input((2,), dtype="int32")
        self.table = loops.EmbeddingTable(
            LARGE, DIM, keras.optimizers.Adagrad(0.1), seed=3, name="items"
        )
        head = keras.layers.Dense(1, kernel_initializer="ones")
        self.model = keras.Model(ids, head(keras.ops.mean(self.table(ids), axis=1)))
        self.optimizer = keras.optimizers.Adagrad(0.1)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(
            self, self.optimizer, self.model, max_table_lookups=self.max_table_lookups
        )


def large_table_run(replicas, max_table_lookups):
    trainer = loops.Trainer(
        LargeTableModel(max_table_lookups=max_table_lookups),
        strategy=loops.testing.replica_strategy(replicas),
        train_data=lambda: tf.data.Dataset.from_tensor_slices((LARGE_IDS, LARGE_TARGETS)).batch(4),
        steps_per_loop=1,
        progress=loops.testing.quiet_progress(),
    )
    try:
        losses = [float(np.ravel(trainer.train(step)["loss"])[-1]) for step in (1, 2, 3)]
        table = trainer.definition.table
        return losses, table.whole().numpy(), table.split_over_replicas
    finally:
        trainer.close()


def test_an_embedding_tables_split_lookup_is_sized_by_the_updates_max_table_lookups():
    one_losses, one_rows, one_split = large_table_run(1, None)
    # 2 replicas, batches of 4, 4 and 2 split [2, 2], [2, 2], [1, 1]: at most 4 ids a replica.
    losses, rows, split = large_table_run(2, 4)
    assert (one_split, split) == (False, True)
    np.testing.assert_allclose(losses, one_losses, rtol=1e-6)
    np.testing.assert_allclose(rows, one_rows, rtol=0, atol=1e-7)
    assert np.abs(rows[[0, 69_999, 40_000]] - large_initial_rows()[[0, 69_999, 40_000]]).min() > 0
    # Without it (nor global_batch_size=, nor batches of one size): refused, naming it.
    with pytest.raises(
        ValueError,
        match=r"EmbeddingTable 'items' \(70000 rows\) is split over the replicas .* or the "
        r"loops.Update that trains it max_table_lookups=N \(the most ids one replica looks up",
    ):
        large_table_run(2, None)


def large_initial_rows():
    return table_blocks.uniform_rows(3, 0, (LARGE, DIM), -0.05, 0.05).numpy()
