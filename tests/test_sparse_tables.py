"""A plain keras.layers.Embedding trained through loops.Update: sparse, exact row updates.

The model looks up 3 ids an example (repeats within an example and across the
batch), averages them and scores them with a Dense layer; the reference is the
same training in float64 numpy, Keras' own update rules written out.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from loops.core import row_updates, table_rows
from loops.topology import replica_bounds

ROWS, DIM, LOOKUPS = 20, 4, 3
RATE = 0.1
# Two full global batches of 8, then a partial one of 3: on 4 replicas one is empty.
IDS = [
    np.array(
        [[1, 1, 2], [3, 1, 5], [2, 2, 2], [7, 1, 3], [5, 6, 7], [1, 9, 9], [2, 3, 4], [1, 1, 1]]
    ),
    np.array(
        [[4, 4, 8], [1, 2, 3], [8, 8, 8], [9, 1, 1], [0, 2, 4], [6, 6, 1], [3, 3, 3], [2, 4, 6]]
    ),
    np.array([[1, 4, 4], [4, 1, 1], [9, 9, 2]]),
]
TARGETS = [np.linspace(-1.0, 1.0, len(ids)).astype(np.float32) for ids in IDS]
UNTOUCHED = sorted(set(range(ROWS)) - set(np.concatenate([i.ravel() for i in IDS])))


def initial_weights():
    rng = np.random.default_rng(4)
    table = rng.normal(0, 0.5, (ROWS, DIM)).astype(np.float32)
    kernel = rng.normal(0, 0.5, (DIM, 1)).astype(np.float32)
    return table, kernel, np.array([0.1], np.float32)


def make_model():
    ids = keras.Input((LOOKUPS,), dtype="int32")
    vectors = keras.layers.Embedding(ROWS, DIM)(ids)
    outputs = keras.layers.Dense(1)(keras.ops.mean(vectors, axis=1))
    model = keras.Model(ids, outputs)
    model.set_weights(list(initial_weights()))
    return model


def numpy_gradients(weights, ids, targets):
    """float64 gradients of sum((y - t)**2) / batch, the table's dense (repeats summed)."""
    table, kernel, bias = weights
    hidden = table[ids].mean(axis=1)
    errors = hidden @ kernel[:, 0] + bias[0] - targets
    d_out = 2 * errors / len(targets)
    d_table = np.zeros_like(table)
    np.add.at(d_table, ids.ravel(), np.repeat(np.outer(d_out, kernel[:, 0]) / LOOKUPS, LOOKUPS, 0))
    return [d_table, np.outer(hidden.T @ d_out, [1.0]), np.array([d_out.sum()])]


def numpy_adagrad(steps, initial_accumulator=0.1, epsilon=1e-7):
    weights = [w.astype(np.float64) for w in initial_weights()]
    accumulators = [np.full_like(w, initial_accumulator) for w in weights]
    for ids, targets in steps:
        for w, a, g in zip(weights, accumulators, numpy_gradients(weights, ids, targets)):
            a += g * g
            w -= RATE * g / np.sqrt(a + epsilon)
    return weights, accumulators


def numpy_sgd(steps):
    weights = [w.astype(np.float64) for w in initial_weights()]
    for ids, targets in steps:
        for w, g in zip(weights, numpy_gradients(weights, ids, targets)):
            w -= RATE * g
    return weights


def replica_slices(strategy, values):
    """Each replica's contiguous share of `values`' rows, as loops' input splits a batch."""
    replicas = strategy.num_replicas_in_sync

    def share(context):
        start, stop = replica_bounds(
            tf.constant(len(values)), context.replica_id_in_sync_group, replicas
        )
        return tf.constant(values)[start:stop]

    return strategy.experimental_distribute_values_from_function(share)


def make_update(strategy, optimizer_fn, table_optimizer_fn=None, **options):
    with strategy.scope():
        context = loops.UpdateContext(
            strategy=strategy,
            global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
            nonfinite=loops.NonFiniteUpdates(strategy, skips=options.pop("skips", False)),
            options=loops.UpdateOptions(**options),
        )
        model = make_model()
        optimizer = optimizer_fn()
        optimizer.build(model.trainable_variables)
        table_optimizer = None
        if table_optimizer_fn is not None:
            table_optimizer = table_optimizer_fn()
            table_optimizer.build(model.trainable_variables[:1])
        update = loops.Update(
            context, optimizer, model, table_optimizer=table_optimizer, clip_norm=None
        )
    return model, update


def train(strategy, update, model, steps):
    def replica_loss(ids, targets):
        count = loops.global_count(tf.shape(targets)[0])
        errors = tf.squeeze(model(ids, training=True), -1) - targets
        return loops.scale_to_global_batch(errors**2, count), {}

    step = tf.function(lambda *args: update(replica_loss, args=args))
    for ids, targets in steps:
        step(replica_slices(strategy, ids.astype(np.int32)), replica_slices(strategy, targets))


def local_values(strategy, variable):
    return [np.asarray(v) for v in strategy.experimental_local_results(variable.value)]


@pytest.mark.parametrize(
    "num_replicas,strategy_name",
    [(1, "mirrored"), (2, "mirrored"), (4, "mirrored"), (2, "central_storage")],
)
def test_adagrad_rows_equal_a_float64_reference_on_every_replica_count(num_replicas, strategy_name):
    strategy = loops.testing.replica_strategy(num_replicas, strategy_name)
    model, update = make_update(strategy, lambda: keras.optimizers.Adagrad(RATE))
    steps = list(zip(IDS, TARGETS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no note: the table takes the sparse path
        train(strategy, update, model, steps)
    assert update.tables.indices == {0}

    expected_weights, expected_accumulators = numpy_adagrad(steps)
    accumulators = [row_updates.slots_of(update.optimizer, v)[0] for v in model.trainable_variables]
    for variable, accumulator, want, want_accumulator in zip(
        model.trainable_variables, accumulators, expected_weights, expected_accumulators
    ):
        for copy in local_values(strategy, variable):
            np.testing.assert_allclose(copy, want, rtol=1e-5, atol=1e-6, err_msg=variable.path)
        for copy in strategy.experimental_local_results(accumulator):
            np.testing.assert_allclose(np.asarray(copy), want_accumulator, rtol=1e-5, atol=1e-6)
    # Rows no batch touched: bit for bit their initial values, and their accumulators.
    for copy in local_values(strategy, model.trainable_variables[0]):
        np.testing.assert_array_equal(copy[UNTOUCHED], initial_weights()[0][UNTOUCHED])
    for copy in strategy.experimental_local_results(accumulators[0]):
        np.testing.assert_array_equal(np.asarray(copy)[UNTOUCHED], np.float32(0.1))
    assert int(update.optimizer.iterations.numpy()) == len(steps)


def test_unique_rows_sum_repeats_and_their_norm_is_the_dense_norm():
    slices = tf.IndexedSlices(
        tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [0.5, 0.5]]),
        tf.constant([3, 0, 3, 3]),
        tf.constant([5, 2]),
    )
    rows = table_rows.unique_rows(slices)
    assert rows.indices.numpy().tolist() == [3, 0]
    np.testing.assert_array_equal(rows.values.numpy(), [[6.5, 8.5], [3.0, 4.0]])
    dense = tf.convert_to_tensor(slices)
    assert float(tf.linalg.global_norm([rows])) == pytest.approx(float(tf.norm(dense)), rel=1e-7)
    assert float(tf.linalg.global_norm([slices])) != pytest.approx(float(tf.norm(dense)))
