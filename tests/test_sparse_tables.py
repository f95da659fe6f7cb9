"""A plain keras.layers.Embedding trained through loops.Update: sparse, exact row updates.

The model looks up 3 ids an example (repeats within an example and across the
batch), averages them and scores them with a Dense layer; the reference is the
same training in float64 numpy, Keras' own update rules written out.
"""

import functools
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import table_batches
import tensorflow as tf
from table_batches import DIM, IDS, LOOKUPS, RATE, ROWS, TARGETS, UNTOUCHED

import loops
from loops.core import table_updates
from loops.tables import row_updates, table_rows
from loops.topology import replica_bounds

# The shared batches and weights (table_batches); this file's weights drawn from seed 4.
initial_weights = functools.partial(table_batches.initial_weights, 4)


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


def make_update(
    strategy, optimizer_fn, table_optimizer_fn=None, clip_norm=None, policy="none", **options
):
    """(model, update) in `strategy`'s scope; with a table optimizer, `optimizer` is built
    on the rest only, the table optimizer on the table."""
    with strategy.scope():
        context = loops.UpdateContext(
            strategy=strategy,
            global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
            nonfinite=loops.NonFiniteUpdates(strategy, skips=options.pop("skips", False)),
            options=loops.UpdateOptions(**options),
        )
        with loops.mixed_precision.dtype_policy_scope(policy):
            model = make_model()
        table, *rest = model.trainable_variables
        optimizer = optimizer_fn()
        optimizer.build(rest if table_optimizer_fn else model.trainable_variables)
        table_optimizer = None
        if table_optimizer_fn is not None:
            table_optimizer = table_optimizer_fn()
            table_optimizer.build([table])
        update = loops.Update(
            context, optimizer, model, table_optimizer=table_optimizer, clip_norm=clip_norm
        )
    return model, update


def train(strategy, update, model, steps):
    """Runs one Update a step; returns the last step's result."""

    def replica_loss(ids, targets):
        count = loops.global_count(tf.shape(targets)[0])
        scores = tf.cast(tf.squeeze(model(ids, training=True), -1), tf.float32)
        return loops.scale_to_global_batch((scores - targets) ** 2, count), {}

    step = tf.function(lambda *args: update(replica_loss, args=args))
    result = None
    for ids, targets in steps:
        result = step(
            replica_slices(strategy, ids.astype(np.int32)), replica_slices(strategy, targets)
        )
    return result


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


def plain_keras_training(optimizer, steps):
    """The model trained on one device by Keras' own optimizer, the table's gradient dense."""
    model = make_model()
    optimizer.build(model.trainable_variables)

    @tf.function(reduce_retracing=True)
    def step(ids, targets):
        with tf.GradientTape() as tape:
            errors = tf.squeeze(model(ids), -1) - targets
            count = loops.global_count(tf.shape(targets)[0])
            loss = loops.scale_to_global_batch(errors**2, count)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(
            zip([tf.convert_to_tensor(g) for g in gradients], model.trainable_variables)
        )

    for ids, targets in steps:
        step(tf.constant(ids.astype(np.int32)), tf.constant(targets))
    return model.get_weights()


@pytest.mark.parametrize(
    "optimizer_fn", [lambda: keras.optimizers.Adagrad(RATE), lambda: keras.optimizers.SGD(RATE)]
)
def test_sparse_rows_equal_keras_dense_update_to_rounding_on_one_device(optimizer_fn):
    """The same operations on the touched rows: equal to float32 rounding (a kernel of
    another shape may round one element differently), untouched rows bit for bit."""
    strategy = loops.testing.replica_strategy(1)
    model, update = make_update(strategy, optimizer_fn)
    steps = list(zip(IDS, TARGETS))
    train(strategy, update, model, steps)
    assert update.tables.sparse and update.tables.indices == {0}
    for got, want in zip(model.get_weights(), plain_keras_training(optimizer_fn(), steps)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_sgd_rows_equal_a_float64_reference_on_four_replicas_one_empty():
    strategy = loops.testing.replica_strategy(4)
    model, update = make_update(strategy, lambda: keras.optimizers.SGD(RATE))
    steps = list(zip(IDS, TARGETS))
    train(strategy, update, model, steps)
    for variable, want in zip(model.trainable_variables, numpy_sgd(steps)):
        for copy in local_values(strategy, variable):
            np.testing.assert_allclose(copy, want, rtol=1e-5, atol=1e-6)
        assert np.asarray(variable.value).dtype == np.float32
    np.testing.assert_array_equal(
        model.get_weights()[0][UNTOUCHED], initial_weights()[0][UNTOUCHED]
    )


def test_adam_keeps_its_dense_update_and_says_so_once(monkeypatch):
    monkeypatch.setattr(table_updates, "NOTE_FROM_ROWS", ROWS)  # this small table is noted
    strategy = loops.testing.replica_strategy(2)
    model, update = make_update(strategy, lambda: keras.optimizers.Adam(RATE))
    steps = list(zip(IDS, TARGETS))
    with pytest.warns(UserWarning) as notes:
        train(strategy, update, model, steps)
    texts = [str(note.message) for note in notes if "embedding table" in str(note.message)]
    table = model.trainable_variables[0].path
    assert texts == [
        f"note: loops.Update trains the embedding table {table} ({ROWS} rows) densely, every "
        "row each step: Adam has no sparse update equal to its dense one (only SGD without "
        "momentum, Adagrad, loops.RowwiseAdagrad and loops.LazyAdam have: Keras' Adam moves "
        "the moments of rows a step does not touch). For a step whose cost follows the "
        "batch, train the tables with keras.optimizers.Adagrad (or SGD without momentum, or "
        "loops.LazyAdam, Adam on the rows a step touches): loops.Update(..., "
        "table_optimizer=keras.optimizers.Adagrad(...))."
    ]
    assert not update.tables.sparse
    expected = plain_keras_training(keras.optimizers.Adam(RATE), steps)
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Its last step moved rows that step did not touch (by their moments): why no
    # sparse update equals dense Adam.
    before = plain_keras_training(keras.optimizers.Adam(RATE), steps[:-1])
    earlier = sorted(set(np.concatenate([i.ravel() for i in IDS[:-1]])) - set(IDS[-1].ravel()))
    assert np.abs(expected[0][earlier] - before[0][earlier]).min() > 1e-4


def numpy_adagrad_table_adam_rest(steps, beta_1=0.9, beta_2=0.999, epsilon=1e-3):
    """Adagrad on the table, Keras' Adam on the kernel and bias, in float64."""
    weights = [w.astype(np.float64) for w in initial_weights()]
    accumulator = np.full_like(weights[0], 0.1)
    moments = [[np.zeros_like(w), np.zeros_like(w)] for w in weights[1:]]
    for step, (ids, targets) in enumerate(steps, start=1):
        table_gradient, *gradients = numpy_gradients(weights, ids, targets)
        accumulator += table_gradient**2
        weights[0] -= RATE * table_gradient / np.sqrt(accumulator + 1e-7)
        alpha = RATE * np.sqrt(1 - beta_2**step) / (1 - beta_1**step)
        for w, (m, v), g in zip(weights[1:], moments, gradients):
            m += (1 - beta_1) * (g - m)
            v += (1 - beta_2) * (g * g - v)
            w -= alpha * m / (np.sqrt(v) + epsilon)
    return weights


def test_a_table_optimizer_trains_the_tables_and_is_checkpointed(tmp_path):
    strategy = loops.testing.replica_strategy(2)
    steps = list(zip(IDS, TARGETS))

    def made():
        model, update = make_update(
            # Adam's epsilon 1e-3: its update of a near-zero gradient is rounding noise
            # otherwise (tests/conftest.py, adam_eps3).
            strategy,
            lambda: keras.optimizers.Adam(RATE, epsilon=1e-3),
            lambda: keras.optimizers.Adagrad(RATE),
        )
        checkpoint = tf.train.Checkpoint(
            model=model, optimizer=update.optimizer, table_optimizer=update.table_optimizer
        )
        return model, update, checkpoint

    model, update, checkpoint = made()
    train(strategy, update, model, steps[:2])
    path = checkpoint.save(str(tmp_path / "ckpt"))
    train(strategy, update, model, steps[2:])
    for got, want in zip(model.get_weights(), numpy_adagrad_table_adam_rest(steps)):
        # Per tensor, as loops.testing compares: Adam divides by sqrt(v) of small
        # gradients, where float32 rounding shows in single elements.
        assert loops.testing.relative_error(got, want) <= 1e-5
    assert int(update.optimizer.iterations.numpy()) == len(steps)
    assert int(update.table_optimizer.iterations.numpy()) == len(steps)

    resumed_model, resumed, resumed_checkpoint = made()
    resumed_checkpoint.restore(path).assert_consumed()
    train(strategy, resumed, resumed_model, steps[2:])
    for got, want in zip(resumed_model.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)
    accumulators = [
        row_updates.slots_of(u.table_optimizer, m.trainable_variables[0])[0]
        for u, m in ((update, model), (resumed, resumed_model))
    ]
    np.testing.assert_array_equal(np.asarray(accumulators[1]), np.asarray(accumulators[0]))


def numpy_clipped_adagrad(steps, clip_norm):
    """Adagrad on the gradient clipped to `clip_norm` by its global norm; and the norms."""
    weights = [w.astype(np.float64) for w in initial_weights()]
    accumulators = [np.full_like(w, 0.1) for w in weights]
    norms = []
    for ids, targets in steps:
        gradients = numpy_gradients(weights, ids, targets)
        norm = np.sqrt(sum(np.sum(g * g) for g in gradients))
        norms.append(norm)
        for w, a, g in zip(weights, accumulators, gradients):
            g = g * clip_norm / max(norm, clip_norm)
            a += g * g
            w -= RATE * g / np.sqrt(a + 1e-7)
    return weights, norms


def test_clipping_and_the_health_norm_see_the_dense_gradients_global_norm():
    strategy = loops.testing.replica_strategy(4)
    clip_norm = 0.05
    model, update = make_update(
        strategy, lambda: keras.optimizers.Adagrad(RATE), clip_norm=clip_norm, health_every=1
    )
    steps = list(zip(IDS, TARGETS))
    for index in range(len(steps)):
        result = train(strategy, update, model, steps[index : index + 1])
        _, norms = numpy_clipped_adagrad(steps[: index + 1], clip_norm)
        assert float(result.health.grad_norm) == pytest.approx(norms[-1], rel=1e-5)
        assert float(result.health.clipped) == 1.0
    want, _ = numpy_clipped_adagrad(steps, clip_norm)
    for got, expected in zip(model.get_weights(), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_moving_average_of_a_sparse_table_is_refused_with_the_fix():
    strategy = loops.testing.replica_strategy(1)
    model, update = make_update(strategy, lambda: keras.optimizers.Adagrad(RATE), ema_decay=0.9)
    with pytest.raises(ValueError) as raised:
        train(strategy, update, model, list(zip(IDS, TARGETS))[:1])
    table = model.trainable_variables[0].path
    assert (
        f"ema_decay keeps a moving average of every weight of this loops.Update, and {table} "
        f"is an embedding table trained sparsely: averaging it would read and write all its "
        f"{ROWS} rows each step, the cost the sparse update avoids. Make this Update with "
        "average=False (train the tables in an Update of their own to average the rest), or "
        "set ema_decay=None."
    ) in str(raised.value)


def graph_ops(concrete):
    """Every op type in a traced function and the functions it calls."""
    graph = concrete.graph.as_graph_def()
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops |= {node.op for node in function.node_def}
    return ops


def test_the_step_reads_the_tables_rows_sparsely_on_every_replica():
    strategy = loops.testing.replica_strategy(2)
    model, update = make_update(strategy, lambda: keras.optimizers.Adagrad(RATE))

    def replica_loss(ids, targets):
        errors = tf.squeeze(model(ids, training=True), -1) - targets
        return loops.scale_to_global_batch(errors**2, loops.global_count(tf.shape(targets)[0])), {}

    step = tf.function(lambda *args: update(replica_loss, args=args))
    args = (replica_slices(strategy, IDS[0].astype(np.int32)), replica_slices(strategy, TARGETS[0]))
    ops = graph_ops(step.get_concrete_function(*args))
    assert {"ResourceGather", "ResourceScatterSub", "ResourceScatterUpdate"} <= ops
    # No dense all-reduce of a table's gradient, and no dense update of it.
    assert "UnsortedSegmentSum" in ops and "ResourceApplyAdagrad" not in ops


def test_float16_rows_are_unscaled_before_the_update():
    strategy = loops.testing.replica_strategy(2)
    model, update = make_update(
        strategy,
        lambda: keras.optimizers.Adagrad(RATE),
        policy="mixed_float16",
        mixed_precision="mixed_float16",
        skips=True,
    )
    steps = list(zip(IDS, TARGETS))
    result = train(strategy, update, model, steps)
    assert float(result.loss_scale) == 2.0**15 and float(result.skipped) == 0.0
    expected, _ = numpy_adagrad(steps)
    # float16 activations: the reference's numbers to float16's precision.
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(
        model.get_weights()[0][UNTOUCHED], initial_weights()[0][UNTOUCHED]
    )


def test_two_workers_equal_the_float64_reference_with_a_partial_batch_that_empties_one(
    tmp_path,
):
    from conftest import ROOT, SUBPROCESS_ENV

    output = str(tmp_path / "weights.npz")
    environment = {name: value for name, value in SUBPROCESS_ENV.items() if name != "TF_CONFIG"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loops.cluster.launch",
            "--num_workers=2",
            "--",
            sys.executable,
            os.path.join(ROOT, "tests", "sparse_tables_run.py"),
            output,
        ],
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for worker in ("worker_0", "worker_1"):
        assert f"[{worker}] sparse tables trained {len(IDS)} steps" in done.stdout
    saved = np.load(output)
    expected_weights, expected_accumulators = numpy_adagrad(list(zip(IDS, TARGETS)))
    for index, want in enumerate(expected_weights):
        np.testing.assert_allclose(saved[f"arr_{index}"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(saved["accumulator"], expected_accumulators[0], rtol=1e-5)
    np.testing.assert_array_equal(saved["arr_0"][UNTOUCHED], initial_weights()[0][UNTOUCHED])


def test_a_step_compiled_with_xla_keeps_the_sparse_rows_exact():
    strategy = loops.testing.replica_strategy(2)
    model, update = make_update(strategy, lambda: keras.optimizers.Adagrad(RATE), jit_compile=True)
    steps = list(zip(IDS, TARGETS))
    train(strategy, update, model, steps)
    assert update.tables.indices == {0}
    expected, _ = numpy_adagrad(steps)
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_gathered_capacity_is_the_static_lookups_or_the_bound_at_most_the_table():
    def capacities(lookups, table, bound):
        @tf.function(input_signature=[tf.TensorSpec([lookups], tf.int32)])
        def traced(ids):
            slices = tf.IndexedSlices(tf.zeros([tf.shape(ids)[0], DIM]), ids)
            found.append(table_rows.capacity(slices, table, bound))
            return ids

        found = []
        traced.get_concrete_function()
        return found[0]

    assert capacities(1024, 10**6, None) == 1024  # static lookups
    assert capacities(1024, 300, None) == 300  # at most the table
    assert capacities(None, 10**6, 2048) == 2048  # the given bound
    assert capacities(None, table_rows.SMALL_TABLE_ROWS, None) == table_rows.SMALL_TABLE_ROWS
    assert capacities(None, table_rows.SMALL_TABLE_ROWS + 1, None) is None  # refused
