"""The exact parameter-server mode sends a table's rows, not the table: each slice's closure
returns its table gradients as unique ids and their rows, the chief sums the slices' rows and
applies them through the Update's sparse path, to the weights of one process."""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from loops.run.parameter_servers import exact_parameter_server

DIM = 4
LOOKUPS = 3
# Steps of 5, 4, 3 and 1 examples: split [3, 2], [2, 2], [2, 1] and [1, 0] over 2 workers
# (the last slice empty); ids repeat within and across slices.
IDS = [
    np.array([[1, 2, 1], [3, 4, 5], [1, 1, 6], [7, 2, 3], [8, 9, 1]], np.int32),
    np.array([[2, 2, 2], [5, 6, 7], [9, 0, 1], [4, 4, 3]], np.int32),
    np.array([[0, 1, 2], [3, 0, 1], [6, 6, 6]], np.int32),
    np.array([[9, 8, 7]], np.int32),
]
TARGETS = [np.linspace(-1.0, 1.0, len(ids)).astype(np.float32) for ids in IDS]


class InProcessCoordinator:
    """Runs each closure `WorkerGradients` schedules at once, in this process, and keeps what
    each returned: 2 workers without a cluster."""

    def __init__(self, strategy):
        strategy._num_workers = 2  # what a ParameterServerStrategy counts when it connects
        self.strategy = strategy
        self.returned = []

    def schedule(self, function, args):
        value = tf.nest.map_structure(np.asarray, function(*args))
        self.returned.append(value)
        return types.SimpleNamespace(fetch=lambda: value)


def initial_weights(rows):
    rng = np.random.default_rng(7)
    return [
        rng.normal(size=(rows, DIM)).astype(np.float32),
        rng.normal(size=(DIM, 1)).astype(np.float32),
        np.array([0.25], np.float32),
    ]


def keras_table_model(rows):
    ids = keras.Input((LOOKUPS,), dtype="int32")
    vectors = keras.layers.Embedding(rows, DIM)(ids)
    model = keras.Model(ids, keras.layers.Dense(1)(keras.ops.mean(vectors, axis=1)))
    model.set_weights(initial_weights(rows))
    return model


def trained(table_optimizer_fn, rows, *, workers):
    """The weights after the steps, and the WorkerGradients and coordinator (None on one
    process), trained by an Update whose tables use `table_optimizer_fn()`, the rest SGD."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    coordinator = InProcessCoordinator(strategy) if workers else None
    with strategy.scope():
        context = loops.UpdateContext(
            strategy=strategy,
            global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
            nonfinite=loops.NonFiniteUpdates(strategy, skips=False),
            slice_gradients=(
                exact_parameter_server.WorkerGradients(coordinator) if coordinator else None
            ),
        )
        model = keras_table_model(rows)
        table, *rest = model.trainable_variables
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(rest)
        table_optimizer = table_optimizer_fn()
        table_optimizer.build([table])
        update = loops.Update(context, optimizer, model, table_optimizer=table_optimizer)

    def replica_loss(ids, targets):
        count = loops.global_count(tf.shape(targets)[0])
        scores = tf.squeeze(model(ids, training=True), -1)
        examples = tf.cast(tf.shape(targets)[0], tf.float32)
        return loops.scale_to_global_batch((scores - targets) ** 2, count), {"examples": examples}

    sent = []
    for ids, targets in zip(IDS, TARGETS):
        before = context.slice_gradients.fetched_bytes if workers else 0
        result = update(replica_loss, args=(tf.constant(ids), tf.constant(targets)))
        assert float(result.sums["examples"]) == len(targets)
        if workers:
            sent.append(context.slice_gradients.fetched_bytes - before)
    assert int(table_optimizer.iterations.numpy()) == len(IDS)
    return model.get_weights(), sent, coordinator


@pytest.mark.parametrize(
    "table_optimizer_fn",
    [lambda: keras.optimizers.SGD(0.5), lambda: keras.optimizers.Adagrad(0.5)],
    ids=["sgd", "adagrad"],
)
def test_a_keras_embedding_trains_as_on_one_process_from_the_slices_rows(table_optimizer_fn):
    want, _, _ = trained(table_optimizer_fn, rows=10, workers=0)
    got, sent, coordinator = trained(table_optimizer_fn, rows=10, workers=2)
    for mine, one_process in zip(got, want, strict=True):
        assert loops.testing.relative_error(mine, one_process) <= 1e-5
    assert np.abs(got[0] - initial_weights(10)[0]).max() > 1e-3  # the table did train
    # Each closure returned one tensor per dtype and the shapes of its parts: loss, count,
    # the "examples" log, the table's rows, ids and shape, the kernel and the bias.
    packs, shapes = coordinator.returned[0]
    assert sorted(packs) == ["float32", "int32"]
    assert packs["int32"].tolist() == [1, 2, 3, 4, 5, 6, 10, DIM]  # unique ids, the shape
    assert shapes.tolist() == [6, DIM, 6, 2, DIM, 1, 1]
    assert packs["float32"].shape == (3 + 6 * DIM + DIM + 1,)
    packs, shapes = coordinator.returned[-1]  # the empty slice of the step of 1 example
    assert packs["int32"].tolist() == [10, DIM] and shapes.tolist() == [0, DIM, 0, 2, DIM, 1, 1]
    assert len(sent) == len(IDS)


def test_the_bytes_a_step_fetches_follow_its_ids_not_the_table():
    _, small, _ = trained(lambda: keras.optimizers.Adagrad(0.5), rows=10, workers=2)
    _, large, _ = trained(lambda: keras.optimizers.Adagrad(0.5), rows=100_000, workers=2)
    assert small == large
    # Per slice: loss, the "examples" log, the count (4 bytes each), the kernel and bias
    # (20), the table's shape (2 ids), the 7 dimensions of the parts' shapes; per unique
    # id of the slice its row (16) and id (4).
    unique = [
        len(np.unique(ids[start:end]))
        for ids in IDS
        for start, end in ((0, (len(ids) + 1) // 2), ((len(ids) + 1) // 2, len(ids)))
    ]
    per_slice = 4 + 4 + 4 + 20 + 2 * 4 + 7 * 8
    per_step = [
        2 * per_slice + 20 * (first + second)
        for first, second in zip(unique[::2], unique[1::2], strict=True)
    ]
    assert small == per_step
    # Sent dense, one slice's table gradient alone would be 100,000 x 4 floats (1.6 MB).
    assert max(large) < 1000
