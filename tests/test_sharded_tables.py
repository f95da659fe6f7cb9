"""loops.EmbeddingTable: Keras' numbers in one process, hashed ids, rows split over servers."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import sharded_table_tasks as tasks
import tensorflow as tf

import loops
from conftest import ROOT, SUBPROCESS_ENV
from loops import placement
from loops.placement import TablePartitioner, rows_split_over_servers
from loops.tables import table_ids

BATCHES = ([0, 3, 3, 9, 5, 3], [9, 9, 1], [4, 7, 0, 6, 6])
UNTOUCHED = [2, 8]


def trained(layer, optimizer_step, weights, initial):
    """Trains `layer` (already holding `initial`) on BATCHES; the losses."""
    losses = []
    for ids in BATCHES:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.constant(ids)) ** 2 * weights)
        optimizer_step(tape, loss)
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize(
    "row_optimizer, keras_optimizer",
    [
        (lambda: keras.optimizers.Adagrad(0.1), lambda: keras.optimizers.Adagrad(0.1)),
        (lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.SGD(0.1)),
    ],
    ids=["adagrad", "sgd"],
)
def test_a_table_in_one_process_equals_keras_embedding_and_its_optimizer(
    row_optimizer, keras_optimizer
):
    initial = tasks.initial_table()[:10]
    weights = tf.constant([[1.0, -2.0, 0.5]])
    table = loops.EmbeddingTable(10, 3, row_optimizer())
    table.build()
    table.embeddings.assign(initial)
    embedding = keras.layers.Embedding(10, 3)
    embedding.build()
    embedding.embeddings.assign(initial)
    optimizer = keras_optimizer()

    def keras_step(tape, loss):
        weights = embedding.trainable_variables
        # Dense, as loops.Update makes it: Keras' own sparse Adagrad squares each duplicate apart.
        dense = [tf.convert_to_tensor(gradient) for gradient in tape.gradient(loss, weights)]
        optimizer.apply_gradients(zip(dense, weights))

    ours = trained(
        table,
        lambda tape, loss: table.apply_gradients(tape.gradient(loss, table.shards)),
        weights,
        initial,
    )
    theirs = trained(embedding, keras_step, weights, initial)

    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
    got = table.embeddings.numpy()
    np.testing.assert_allclose(got, embedding.embeddings.numpy(), rtol=0, atol=1e-6)
    assert np.abs(got - initial).min(axis=1)[[0, 3, 9]].min() > 1e-3  # touched rows moved
    # Rows no batch touched are bit-identical, table and slots.
    np.testing.assert_array_equal(got[UNTOUCHED], initial[UNTOUCHED])
    if isinstance(table.optimizer, keras.optimizers.Adagrad):
        accumulator = table.accumulator.numpy()
        np.testing.assert_allclose(accumulator, optimizer.variables[2].numpy(), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(accumulator[UNTOUCHED], np.full((2, 3), 0.1, np.float32))


def test_hashed_ids_are_deterministic_within_range_and_collide_as_stated():
    strings = loops.EmbeddingTable(1000, 2, ids="strings")
    hashes = loops.EmbeddingTable(1000, 2, ids="hashes")
    words = tf.constant(["user:17", "item:9", "user:17", ""])
    rows = strings.row_ids(words).numpy()
    # FarmHash fingerprint64 mod 1000: the same on every run, task and platform.
    assert rows[0] == rows[2] and rows.tolist() == strings.row_ids(words).numpy().tolist()
    assert rows.tolist() == [517, 446, 517, 263]
    big = tf.constant([2**62 + 5, -(2**63), 17, 2**62 + 5], tf.int64)
    hashed = hashes.row_ids(big).numpy()
    assert hashed[0] == hashed[3] and hashed[2] == strings.row_ids(["17"]).numpy()[0]

    many = np.random.default_rng(0).integers(-(2**63), 2**63 - 1, size=20_000, dtype=np.int64)
    spread = hashes.row_ids(tf.constant(many)).numpy()
    assert spread.min() >= 0 and spread.max() < 1000 and spread.dtype == np.int64
    # 5,000 distinct ids in 100,000 rows: collisions near the stated expectation (~122).
    table = loops.EmbeddingTable(100_000, 2, ids="hashes")
    ids = np.unique(many)[:5000]
    collided = 5000 - len(np.unique(table.row_ids(tf.constant(ids)).numpy()))
    expected = table_ids.expected_collisions(5000, 100_000)
    assert 121 < expected < 123 and abs(collided - expected) < 4 * expected**0.5


def test_a_vocabulary_maps_its_words_in_order_and_others_to_its_buckets():
    table = loops.EmbeddingTable(5, 2, ids="strings", vocabulary=["a", "b", "c"], oov_buckets=2)
    rows = table.row_ids(tf.constant(["c", "a", "zebra", "b", "zebra", "yak"])).numpy()
    assert rows[:2].tolist() == [2, 0] and rows[3] == 1
    assert rows[2] == rows[4] and {rows[2], rows[5]} <= {3, 4}
    table.build()
    np.testing.assert_array_equal(table(tf.constant(["b"])).numpy(), table.embeddings.numpy()[[1]])


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"rows": 0, "dim": 2}, r"EmbeddingTable\(rows=0\) needs a whole number >= 1"),
        ({"rows": 4, "dim": 2, "ids": "words"}, r"ids='words'.*rows, strings, hashes"),
        (
            {"rows": 4, "dim": 2, "ids": "strings", "vocabulary": ["a", "b"]},
            r"rows=4\) with a vocabulary of 2 words .* pass rows=3",
        ),
        (
            {"rows": 3, "dim": 2, "ids": "rows", "vocabulary": ["a", "b"]},
            r"a vocabulary maps strings; pass ids='strings'",
        ),
    ],
)
def test_bad_table_arguments_are_refused_with_the_fix(arguments, message):
    with pytest.raises(ValueError, match=message):
        loops.EmbeddingTable(**arguments)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            {"rows": 4, "dim": 2.0},
            r"^EmbeddingTable\(dim=2.0\) needs a whole number >= 1, not a float\.$",
        ),
        (
            {"rows": 4, "dim": 2, "seed": 1.5},
            r"^EmbeddingTable\(seed=1.5\) needs a whole number, not a float\.$",
        ),
        (
            {"rows": 1, "dim": 2, "ids": "strings", "vocabulary": []},
            r"^EmbeddingTable\(vocabulary=\[\]\) holds no word: pass the words",
        ),
        (
            {"rows": 3, "dim": 2, "ids": "strings", "vocabulary": ["a", 7]},
            r"^EmbeddingTable\(vocabulary=...\): word 1 is 7 \(int\); a vocabulary holds strings",
        ),
        (
            {"rows": 3, "dim": 2, "ids": "strings", "vocabulary": "ab"},
            r"^EmbeddingTable\(vocabulary='ab'\) needs a list of words",
        ),
    ],
)
def test_a_table_argument_of_the_wrong_type_is_named_before_tensorflow_sees_it(arguments, message):
    with pytest.raises(ValueError, match=message):
        loops.EmbeddingTable(**arguments)


def test_numpy_integers_and_byte_words_are_taken_as_their_values():
    table = loops.EmbeddingTable(
        np.int64(4),
        np.int32(2),
        ids="strings",
        vocabulary=[b"a", "b", np.str_("c")],
        oov_buckets=np.int64(1),
        seed=np.int64(3),
    )
    assert (table.rows, table.dim, table.seed) == (4, 2, 3)
    assert type(table.rows) is int
    assert table.row_ids(tf.constant(["c", "a", "b"])).numpy().tolist() == [2, 0, 1]


def test_a_row_id_outside_the_table_fails_naming_the_table_and_changes_no_row():
    table = loops.EmbeddingTable(10, 3, keras.optimizers.SGD(0.1), name="users")
    table.build()
    before = table.embeddings.numpy()
    for ids in ([2, 10], [-1, 4]):
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=r"EmbeddingTable 'users' \(ids='rows'\) was given an id outside \[0, 10\)",
        ):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(table(tf.constant(ids)))
            table.apply_gradients(tape.gradient(loss, table.shards))
    # Traced too: the check is part of the lookup, not of eager execution.
    lookup = tf.function(lambda ids: table(ids))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"outside \[0, 10\)"):
        lookup(tf.constant([3, 11]))
    np.testing.assert_array_equal(table.embeddings.numpy(), before)
    np.testing.assert_array_equal(lookup(tf.constant([9, 0])).numpy(), before[[9, 0]])


def test_an_optimizer_without_an_exact_row_update_is_refused_saying_why():
    with pytest.raises(
        ValueError,
        match=r"EmbeddingTable\(optimizer=Adam\): Adam has no sparse update .* pass "
        r"keras.optimizers.Adagrad, keras.optimizers.SGD without momentum, "
        r"loops.RowwiseAdagrad or loops.LazyAdam",
    ):
        loops.EmbeddingTable(4, 2, keras.optimizers.Adam())
    with pytest.raises(ValueError, match=r"optimizer=SGD\): SGD with momentum moves every row"):
        loops.EmbeddingTable(4, 2, keras.optimizers.SGD(momentum=0.9))


def test_the_partitioner_splits_only_what_a_table_creates():
    partitioner = TablePartitioner(3)
    assert partitioner(tf.TensorShape([11, 4]), tf.float32) == [1, 1]
    with rows_split_over_servers():
        assert partitioner(tf.TensorShape([11, 4]), tf.float32) == [3, 1]
        assert partitioner(tf.TensorShape([2, 4]), tf.float32) == [2, 1]
        assert partitioner(tf.TensorShape([]), tf.float32) == []
    assert partitioner(tf.TensorShape([11, 4]), tf.float32) == [1, 1]
    with pytest.raises(ValueError, match=r"TablePartitioner\(num_shards=0\) needs a whole number"):
        TablePartitioner(0)


def adagrad_reference(table, accumulator, batches, learning_rate=0.1, epsilon=1e-7):
    """Float64 Adagrad of the tasks' loss, sum(table[ids]**2 * weights), over `batches`."""
    table, accumulator = table.astype(np.float64), accumulator.astype(np.float64)
    weights = tasks.step_weights().numpy().astype(np.float64)
    losses = []
    for ids in batches:
        losses.append(float((table[ids] ** 2 * weights).sum()))
        gradient = np.zeros_like(table)
        np.add.at(gradient, ids, 2.0 * table[ids] * weights)
        accumulator += gradient**2
        table -= learning_rate * gradient / np.sqrt(accumulator + epsilon)
    return losses, table, accumulator


def run_tasks(tmp_path, name, mode, from_dir, num_ps=0):
    """Runs tests/sharded_table_tasks.py alone or as a cluster with `num_ps` servers; its npz."""
    out, to_dir = str(tmp_path / f"{name}.npz"), str(tmp_path / name)
    command = [sys.executable, os.path.join(ROOT, "tests", "sharded_table_tasks.py")]
    command += [mode, str(from_dir), to_dir, out]
    if num_ps:
        launcher = [sys.executable, "-m", "loops.cluster.launch", "--num_workers=1"]
        command = [*launcher, f"--num_ps={num_ps}", "--grace_period=5", "--", *command]
    done = subprocess.run(
        command, capture_output=True, text=True, env=SUBPROCESS_ENV, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dict(np.load(out)), to_dir


def test_a_table_split_over_two_servers_equals_one_process_and_restores_into_three_then_one(
    tmp_path,
):
    alone, _ = run_tasks(tmp_path, "alone", "train", "-")
    two, two_dir = run_tasks(tmp_path, "two", "train", "-", num_ps=2)

    # Each server holds its block of rows, table and slots; the chief none.
    assert two["shard_rows"].tolist() == [6, 5]
    assert two["devices"].tolist() == [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in (0, 1)]
    assert alone["shard_rows"].tolist() == [11]
    # Lookups, losses and updates equal the unsharded table and a float64 Adagrad.
    losses, table, accumulator = adagrad_reference(
        tasks.initial_table(), np.full((11, 3), 0.1), tasks.TRAIN_STEPS
    )
    for key in ("losses", "table", "accumulator", "looked_up"):
        np.testing.assert_allclose(two[key], alone[key], rtol=0, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(two["losses"], losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(two["table"], table, rtol=0, atol=1e-6)
    np.testing.assert_allclose(two["accumulator"], accumulator, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(two["looked_up"], two["table"][tasks.LOOKED_UP])
    untouched = [2, 8]
    np.testing.assert_array_equal(two["table"][untouched], tasks.initial_table()[untouched])

    # Saved by 2 servers, restored into 3: the same table and slots, split in 3; it trains on.
    three, three_dir = run_tasks(tmp_path, "three", "continue", two_dir, num_ps=3)
    assert three["shard_rows"].tolist() == [4, 4, 3]
    np.testing.assert_array_equal(three["restored_table"], two["table"])
    np.testing.assert_array_equal(three["restored_accumulator"], two["accumulator"])
    losses, table, accumulator = adagrad_reference(
        two["table"], two["accumulator"], tasks.MORE_STEPS
    )
    np.testing.assert_allclose(three["losses"], losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(three["table"], table, rtol=0, atol=1e-6)
    np.testing.assert_allclose(three["accumulator"], accumulator, rtol=0, atol=1e-5)

    # Saved by 3 servers, restored into one process without servers: equal again.
    back, _ = run_tasks(tmp_path, "back", "continue", three_dir)
    assert back["shard_rows"].tolist() == [11]
    np.testing.assert_array_equal(back["restored_table"], three["table"])
    np.testing.assert_array_equal(back["restored_accumulator"], three["accumulator"])


def test_updating_a_table_on_synchronous_replicas_is_refused_with_the_fix():
    # Central storage: MirroredStrategy splits the table over its replicas instead.
    strategy = loops.testing.replica_strategy(2, "central_storage")
    with strategy.scope():
        table = loops.EmbeddingTable(4, 2, keras.optimizers.SGD(0.1))
        table.build()
    before = table.embeddings.numpy()

    def replica_step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(table(ids))
        table.apply_gradients(tape.gradient(loss, table.shards))

    with pytest.raises(ValueError, match=r"the strategy keeps 2 replicas in sync: use it in one"):
        strategy.run(tf.function(replica_step), args=(tf.constant([1, 2]),))
    np.testing.assert_array_equal(table.embeddings.numpy(), before)


def test_a_parameter_server_strategy_without_the_partitioner_is_refused_before_the_table(
    monkeypatch,
):
    # As under ParameterServerStrategy made without loops.TablePartitioner: 2 servers, and
    # variables that come out whole (a real one needs a cluster; the slow test has one).
    monkeypatch.setattr(placement, "num_parameter_servers", lambda strategy: 2)
    table = loops.EmbeddingTable(4_000_000, 64)
    with pytest.raises(
        ValueError,
        match=r"EmbeddingTable\(4000000, 64\) under ParameterServerStrategy with 2 servers "
        r"would lie whole on one of them: make the strategy with "
        r"variable_partitioner=loops.TablePartitioner\(2\)",
    ):
        table.build()
    assert not table.built and not hasattr(table, "embeddings")
