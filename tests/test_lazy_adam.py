"""`loops.LazyAdam`, the worked example of a table optimizer added as one row rule: Keras'
Adam where every row has a gradient, its row update equal to its dense one, and trained
through `loops.Update` and `loops.EmbeddingTable` by that one entry of `row_updates.RULES`."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import test_sparse_tables as sparse
from table_batches import IDS, RATE, TARGETS, UNTOUCHED

import loops
from loops.tables import row_updates


def gradients(seed, rows=6, dim=3, touched=None):
    """Three steps' dense gradients of a (rows, dim) table; only the `touched` rows of each
    step not zero (None: every row)."""
    rng = np.random.default_rng(seed)
    steps = []
    for step in range(3):
        gradient = rng.normal(0, 1, (rows, dim)).astype(np.float32)
        if touched is not None:
            kept = np.zeros(rows, bool)
            kept[touched[step]] = True
            gradient[~kept] = 0.0
        steps.append(gradient)
    return steps


def test_where_every_row_has_a_gradient_it_is_keras_adam_bit_for_bit():
    start = np.random.default_rng(0).normal(0, 1, (6, 3)).astype(np.float32)
    lazy, adam = tf.Variable(start), tf.Variable(start)
    lazy_optimizer, adam_optimizer = loops.LazyAdam(0.05), keras.optimizers.Adam(0.05)
    for gradient in gradients(1):
        lazy_optimizer.apply_gradients([(tf.constant(gradient), lazy)])
        adam_optimizer.apply_gradients([(tf.constant(gradient), adam)])
    np.testing.assert_array_equal(lazy.numpy(), adam.numpy())
    assert not np.array_equal(lazy.numpy(), start)


def test_its_row_update_equals_its_dense_update_and_leaves_untouched_rows():
    touched = [[1, 4], [4, 5], [1]]
    start = np.random.default_rng(2).normal(0, 1, (6, 3)).astype(np.float32)
    dense, rows = tf.Variable(start), tf.Variable(start)
    dense_optimizer, row_optimizer = loops.LazyAdam(0.05), loops.LazyAdam(0.05)
    row_optimizer.build([rows])
    for ids, gradient in zip(touched, gradients(3, touched=touched)):
        dense_optimizer.apply_gradients([(tf.constant(gradient), dense)])
        row_updates.apply_rows(
            row_optimizer,
            rows,
            tf.constant(ids),
            tf.constant(gradient[ids]),
            learning_rate=row_optimizer.learning_rate,
        )
        row_optimizer.iterations.assign_add(1)  # the Update counts the step after the rows
    np.testing.assert_array_equal(rows.numpy(), dense.numpy())
    for got, want in zip(
        row_updates.slots_of(row_optimizer, rows), row_updates.slots_of(dense_optimizer, dense)
    ):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    never = [0, 2, 3]
    np.testing.assert_array_equal(rows.numpy()[never], start[never])
    momentum, velocity = row_updates.slots_of(row_optimizer, rows)
    assert not momentum.numpy()[never].any() and not velocity.numpy()[never].any()
    # Row 5 was touched at step 2 only: its moments hold one step, not decayed since.
    assert row_optimizer.iterations.numpy() == 3


def test_the_rule_names_its_slots_and_a_table_makes_them_beside_its_rows():
    assert row_updates.why_dense(loops.LazyAdam()) is None
    assert row_updates.slot_values(loops.LazyAdam()) == {
        "momentum": (0.0, None),
        "velocity": (0.0, None),
    }
    assert row_updates.slot_values(loops.RowwiseAdagrad(initial_accumulator_value=0.5)) == {
        "accumulator": (0.5, 1)
    }
    table = loops.EmbeddingTable(10, 3, loops.LazyAdam(0.1), seed=1)
    table.build()
    assert table.slot_names == ("momentum", "velocity")
    start = table.whole().numpy()
    plain = tf.Variable(start)
    reference = loops.LazyAdam(0.1)
    ids = tf.constant([2, 5, 2])
    values = tf.constant(np.arange(9, dtype=np.float32).reshape(3, 3) / 10 - 0.3)
    table.apply_gradients([tf.IndexedSlices(values, ids, tf.constant([10, 3]))])
    reference.apply_gradients([(tf.math.unsorted_segment_sum(values, ids, 10), plain)])
    np.testing.assert_array_equal(table.whole().numpy(), plain.numpy())
    for name, want in zip(table.slot_names, row_updates.slots_of(reference, plain)):
        np.testing.assert_array_equal(table.whole(name).numpy(), want.numpy())
    assert table.where()["optimizer"] == "LazyAdam"
    with pytest.raises(ValueError, match=r"LazyAdam trains tables of rows .* shape \(4,\)"):
        loops.LazyAdam().build([tf.Variable(tf.zeros([4]))])


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_a_keras_embedding_trains_by_rows_through_the_update_as_dense_lazy_adam(num_replicas):
    """The Update's sparse path with LazyAdam as the table optimizer (SGD the rest), on 1 and
    2 replicas, equals the one-device model trained densely by the same optimizers."""
    strategy = loops.testing.replica_strategy(num_replicas)
    model, update = sparse.make_update(
        strategy, lambda: keras.optimizers.SGD(RATE), lambda: loops.LazyAdam(RATE)
    )
    steps = list(zip(IDS, TARGETS))
    sparse.train(strategy, update, model, steps)
    assert update.tables.sparse and update.tables.indices == {0}

    reference = sparse.make_model()
    table, *rest = reference.trainable_variables
    lazy, sgd = loops.LazyAdam(RATE), keras.optimizers.SGD(RATE)
    for ids, targets in steps:
        with tf.GradientTape() as tape:
            errors = tf.squeeze(reference(tf.constant(ids.astype(np.int32))), -1) - targets
            loss = tf.reduce_sum(errors**2) / len(targets)
        table_gradient, *others = tape.gradient(loss, reference.trainable_variables)
        lazy.apply_gradients([(tf.convert_to_tensor(table_gradient), table)])
        sgd.apply_gradients(zip(others, rest))
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        model.get_weights()[0][UNTOUCHED], sparse.initial_weights()[0][UNTOUCHED]
    )
