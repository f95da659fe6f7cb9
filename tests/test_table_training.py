"""A model's `loops.EmbeddingTable` trained by `loops.Update` and the Trainer: equal to the
same model with `keras.layers.Embedding`, never silently untrained, refused where it cannot."""

import functools
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import table_batches
import tensorflow as tf
import test_table_plan
from table_batches import DIM, IDS, LOOKUPS, RATE, ROWS, TARGETS, UNTOUCHED

import loops
from conftest import ROOT, SUBPROCESS_ENV
from loops.core import replica_gradients

# The shared batches and weights (table_batches); this file's weights drawn from seed 7.
initial_weights = functools.partial(table_batches.initial_weights, 7)


def make_model(own_table: bool):
    """ids -> table rows -> mean -> Dense(1), the table an EmbeddingTable (own Adagrad) or
    a keras.layers.Embedding, with the same initial weights."""
    table_weights, kernel, bias = initial_weights()
    ids = keras.Input((LOOKUPS,), dtype="int32")
    if own_table:
        # Named: the weights of runs on different replica counts compare by name.
        table = loops.EmbeddingTable(ROWS, DIM, keras.optimizers.Adagrad(RATE), name="items")
    else:
        table = keras.layers.Embedding(ROWS, DIM)
    head = keras.layers.Dense(1)
    model = keras.Model(ids, head(keras.ops.mean(table(ids), axis=1)))
    if own_table:
        table.embeddings.assign(table_weights)
    else:
        table.set_weights([table_weights])
    head.set_weights([kernel, bias])
    return model, table, head


class TableModel(loops.Loop):
    supports_parameter_server = True  # its steps are sums over examples

    def __init__(self, *, own_table, clip_norm=None, **loop_args):
        super().__init__(**loop_args)
        self.own_table, self.clip_norm = own_table, clip_norm

    def build(self):
        self.model, self.table, self.head = make_model(self.own_table)
        self.optimizer = keras.optimizers.Adagrad(RATE)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model, clip_norm=self.clip_norm)

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _replica_loss(self, ids, targets):
        count = loops.global_count(tf.shape(targets)[0])
        scores = tf.squeeze(self.model(ids, training=True), -1)
        return loops.scale_to_global_batch((scores - targets) ** 2, count), {}

    def train_step(self, iterator):
        result = self.update(self._replica_loss, args=next(iterator))
        return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}


def batches():
    dataset = None
    for ids, targets in zip(IDS, TARGETS):
        batch = tf.data.Dataset.from_tensors((ids.astype(np.int32), targets))
        dataset = batch if dataset is None else dataset.concatenate(batch)
    return dataset


def trained(own_table, clip_norm=None, grad_accum_steps=1):
    loop = loops.Trainer(
        TableModel(own_table=own_table, clip_norm=clip_norm),
        strategy=loops.testing.replica_strategy(1),
        train_data=batches,
        health_every=1,
        grad_accum_steps=grad_accum_steps,
        progress=loops.testing.quiet_progress(),
    )
    logs = loop.train(len(IDS))
    definition = loop.definition
    table = np.asarray(definition.table.embeddings.numpy())
    loop.close()
    return definition, table, logs


@pytest.mark.parametrize("clip_norm, grad_accum_steps", [(None, 1), (0.05, 1), (None, 2)])
def test_a_trainer_trains_an_embedding_table_as_keras_embedding_and_the_same_adagrad(
    clip_norm, grad_accum_steps
):
    own, own_table, own_logs = trained(True, clip_norm, grad_accum_steps)
    keras_one, keras_table, keras_logs = trained(False, clip_norm, grad_accum_steps)
    initial = initial_weights()[0]
    assert np.abs(own_table - keras_table).max() <= 1e-6
    for got, want in zip(own.head.get_weights(), keras_one.head.get_weights()):
        assert np.abs(got - want).max() <= 1e-6
    touched = sorted(set(range(ROWS)) - set(UNTOUCHED))
    assert (np.abs(own_table[touched] - initial[touched]).max(axis=1) > 0).all()  # all moved
    assert np.abs(own_table - initial).max() > 1e-3
    np.testing.assert_array_equal(own_table[UNTOUCHED], initial[UNTOUCHED])
    # The table's own optimizer counted every step (its schedule reads it), the rest's too.
    assert int(own.table.optimizer.iterations.numpy()) == len(IDS)
    assert int(own.optimizer.iterations.numpy()) == len(IDS)
    for name in ("loss", "health/grad_norm"):
        assert float(np.ravel(own_logs[name])[-1]) == pytest.approx(
            float(np.ravel(keras_logs[name])[-1]), rel=1e-6
        )


def make_context(strategy, skips=False, **options):
    return loops.UpdateContext(
        strategy=strategy,
        global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
        nonfinite=loops.NonFiniteUpdates(strategy, skips=skips),
        options=loops.UpdateOptions(**options),
    )


def test_an_update_given_the_model_trains_its_table_and_skips_a_nonfinite_step():
    strategy = tf.distribute.get_strategy()
    model, table, _ = make_model(own_table=True)
    optimizer = keras.optimizers.SGD(RATE)
    optimizer.build(model.trainable_variables)
    update = loops.Update(make_context(strategy, skips=True), optimizer, model)
    assert len(update.variables()) == 3  # the table's one shard with the kernel and bias

    def replica_loss(ids, targets):
        count = loops.global_count(tf.shape(targets)[0])
        scores = tf.squeeze(model(ids, training=True), -1)
        return loops.scale_to_global_batch((scores - targets) ** 2, count), {}

    step = tf.function(lambda ids, targets: update(replica_loss, args=(ids, targets)))
    before = table.embeddings.numpy()
    result = step(tf.constant(IDS[3], tf.int32), tf.constant(TARGETS[3]))
    after = table.embeddings.numpy()
    assert float(result.nonfinite) == 0.0
    assert sorted(np.flatnonzero(np.abs(after - before).max(axis=1))) == [4, 9]
    # A non-finite target: the whole update, the table's rows included, is left out.
    result = step(tf.constant(IDS[3], tf.int32), tf.constant([np.nan], tf.float32))
    assert float(result.nonfinite) == 1.0
    np.testing.assert_array_equal(table.embeddings.numpy(), after)


def split_trainer(strategy, model_dir=None):
    """A Trainer of the table model (EmbeddingTable and Dense head), clipped to a global
    norm of 0.05, health every step; the table split over the strategy's replicas."""
    return loops.Trainer(
        TableModel(own_table=True, clip_norm=0.05),
        strategy=strategy,
        train_data=batches,
        health_every=1,
        model_dir=model_dir,
        progress=loops.testing.quiet_progress(),
    )


def test_a_table_split_over_1_2_and_4_replicas_trains_the_same_clipped_by_the_trainer():
    """The shared batches (duplicate ids; a batch of 3 and one of 1, so replicas go empty):
    every weight, the table's slot, loss, grad_norm and clipping agree on 1, 2 and 4 mirrored
    replicas, each block's rows counted once in the norm that clips."""
    runs = loops.testing.assert_replica_parity(split_trainer, num_steps=len(IDS))
    for count, run in runs.items():
        table = run["weights"]["model/table/items/embeddings"]
        if count == 1:
            one = table
        else:
            assert np.abs(table - one).max() <= 1e-6, count
    clipped = np.ravel(runs[4]["logs"]["health/clipped"])
    norms = np.ravel(runs[4]["logs"]["health/grad_norm"])
    assert clipped.tolist() == [float(norm > 0.05) for norm in norms] and clipped.sum() >= 1
    initial = initial_weights()[0]
    np.testing.assert_array_equal(one[UNTOUCHED], initial[UNTOUCHED])
    assert np.abs(one - initial).max() > 1e-3


def test_a_split_table_resumed_from_a_checkpoint_trains_as_the_uninterrupted_run(tmp_path):
    """4 replicas: stopped after 2 steps (saved), resumed for the other 2 in a new Trainer,
    the table, its slot and the head equal the run that never stopped."""
    uninterrupted = loops.testing.train_run(
        split_trainer, loops.testing.replica_strategy(4), num_steps=len(IDS)
    )
    model_dir = str(tmp_path / "split")
    first = split_trainer(loops.testing.replica_strategy(4), model_dir)
    first.train(2)
    first.close()
    resumed = split_trainer(loops.testing.replica_strategy(4), model_dir)
    assert int(resumed.global_step.numpy()) == 2
    resumed.train(len(IDS))
    weights = loops.testing.loop_weights(resumed)
    resumed.close()
    assert weights["model/table/items/embeddings"].shape == (ROWS, DIM)
    loops.testing.assert_close(
        weights, uninterrupted["weights"], rtol=1e-6, label="resumed on 4 replicas"
    )


def test_a_nonfinite_step_on_one_replica_leaves_every_block_of_a_split_table_as_it_was():
    """2 mirrored replicas, the table split over them: a finite step moves the looked-up
    rows of both blocks; a NaN target on replica 1 alone leaves both blocks (and the head)
    untouched, and `nonfinite` says so."""
    strategy = loops.testing.replica_strategy(2)
    with strategy.scope():
        model, table, head = make_model(own_table=True)
        optimizer = keras.optimizers.SGD(RATE)
        optimizer.build(model.trainable_variables)
        update = loops.Update(
            make_context(strategy, skips=True, health_every=1), optimizer, model, clip_norm=0.05
        )
    assert table.split_over_replicas and len(table.shards) == 2

    def replica_loss(ids, targets):
        count = loops.global_count(tf.shape(targets)[0])
        scores = tf.squeeze(model(ids, training=True), -1)
        return loops.scale_to_global_batch((scores - targets) ** 2, count), {}

    step = tf.function(lambda ids, targets: update(replica_loss, args=(ids, targets)))

    def per_replica(values, dtype):
        return strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(values[context.replica_id_in_sync_group], dtype)
        )

    ids = per_replica([[[1, 4, 4]], [[12, 12, 19]]], tf.int32)
    before = np.concatenate([np.asarray(shard) for shard in table.shards])
    result = step(ids, per_replica([[0.5], [-0.5]], tf.float32))
    after = np.concatenate([np.asarray(shard) for shard in table.shards])
    assert float(result.nonfinite) == 0.0
    assert sorted(np.flatnonzero(np.abs(after - before).max(axis=1))) == [1, 4, 12, 19]
    kernel = head.kernel.numpy()
    result = step(ids, per_replica([[0.5], [np.nan]], tf.float32))
    assert float(result.nonfinite) == 1.0
    np.testing.assert_array_equal(
        np.concatenate([np.asarray(shard) for shard in table.shards]), after
    )
    np.testing.assert_array_equal(head.kernel.numpy(), kernel)


@pytest.mark.parametrize(
    "replicas, options, table_optimizer, message",
    [
        (
            (2, "central_storage"),
            {},
            None,
            r"cannot train the EmbeddingTable .* on 2 synchronous replicas of this strategy.*Use ",
        ),
        (
            (1, "mirrored"),
            {},
            keras.optimizers.SGD,
            r"table_optimizer=SGD\) would train the EmbeddingTable",
        ),
        (
            (2, "mirrored"),
            {"ema_decay": 0.9},
            None,
            r"ema_decay keeps a moving average .*EmbeddingTable",
        ),
    ],
)
def test_an_update_refuses_a_table_it_cannot_train_with_the_fix(
    replicas, options, table_optimizer, message
):
    strategy = loops.testing.replica_strategy(*replicas)
    with strategy.scope():
        model, table, _ = make_model(own_table=True)
        optimizer = keras.optimizers.SGD(RATE)
        optimizer.build(model.trainable_variables)
        extra = {} if table_optimizer is None else {"table_optimizer": table_optimizer(RATE)}
        with pytest.raises(ValueError, match=message):
            loops.Update(make_context(strategy, **options), optimizer, model, **extra)


def test_a_table_split_over_two_servers_trains_through_the_trainer(tmp_path):
    """Under parameter servers (one worker, two servers) the Trainer trains the table on
    the servers: every hit row moves, the others stay bit-identical, and its optimizer
    counts every step. Not compared to one process: main's asynchronous parameter-server
    steps differ from one process for a keras.layers.Embedding model too (exact mode is
    issue 44's)."""
    out = str(tmp_path / "two.npz")
    launcher = [sys.executable, "-m", "loops.cluster.launch", "--num_workers=1", "--num_ps=2"]
    task = [sys.executable, os.path.join(ROOT, "tests", "table_training_tasks.py"), out]
    done = subprocess.run(
        [*launcher, "--grace_period=5", "--", *task],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    two = dict(np.load(out))
    assert two["shard_rows"].tolist() == [10, 10]
    assert two["devices"].tolist() == [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in (0, 1)]
    initial = initial_weights()[0]
    touched = sorted(set(range(ROWS)) - set(UNTOUCHED))
    assert (np.abs(two["table"][touched] - initial[touched]).max(axis=1) > 0).all()
    np.testing.assert_array_equal(two["table"][UNTOUCHED], initial[UNTOUCHED])
    assert np.isfinite(two["table"]).all() and np.isfinite(two["kernel"]).all()
    assert int(two["iterations"]) == len(IDS)
    # The same cluster trains a model of plain Embeddings under a loops.TablePlan: its large
    # table split over the servers, its accumulator too, untouched rows at their first draw.
    assert two["plan_shard_rows"].tolist() == [20, 20]
    assert two["plan_devices"].tolist() == two["devices"].tolist()
    assert two["plan_accumulator"].shape == (test_table_plan.BIG, test_table_plan.DIM)
    assert (two["plan_accumulator"] > 0.1).any()  # rows it updated (0.1 initially)
    untouched = test_table_plan.UNTOUCHED
    np.testing.assert_array_equal(
        two["plan_table"][untouched], test_table_plan.plan_rows()[untouched]
    )
    np.testing.assert_array_equal(two["plan_accumulator"][untouched], np.float32(0.1))
    assert np.isfinite(two["plan_table"]).all()
    assert int(two["plan_iterations"]) == len(test_table_plan.BIG_IDS)


def test_micro_batches_keep_a_shards_rows_that_only_a_later_one_looked_up():
    # A shard of a split table that the first micro-batch did not look up has no gradient
    # (None) there; the later micro-batches' rows of it are kept, not dropped.
    rows = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([3]), tf.constant([5, 2]))
    for first, second in ((None, rows), (rows, None)):
        summed = replica_gradients._plus(first, second)
        np.testing.assert_array_equal(tf.convert_to_tensor(summed).numpy()[3], [1.0, 2.0])
    assert replica_gradients._plus(None, None) is None
