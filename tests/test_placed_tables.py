"""loops.EmbeddingTable placed by the strategy: rows split over the replicas of MirroredStrategy,
initial values that depend on the global row alone, exact row updates (SGD, Adagrad, row-wise
Adagrad), one logical array per table and slot in checkpoints, each replica holding its block."""

import functools
import os
import subprocess
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
import test_table_plan

import loops
from loops import placement, tf_private
from loops.tables import table_blocks

ROWS, DIM, RATE, EPSILON = 11, 3, 0.1, 1e-7
WEIGHTS = np.array([[1.0, -2.0, 0.5]], np.float32)
# Each step's ids of 4 replicas: duplicates within and across replicas, an empty replica.
STEPS_OF_4 = (
    ([0, 3, 3], [9, 3], [], [5, 10, 0]),
    ([9, 9], [1], [4, 7, 0], []),
    ([], [6, 6, 2], [0], [3]),
)
UNTOUCHED = [8]  # no step looks it up

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(RATE),
    "adagrad": lambda: keras.optimizers.Adagrad(RATE),
    "rowwise_adagrad": lambda: loops.RowwiseAdagrad(RATE),
}


def steps_of(replicas):
    """STEPS_OF_4's ids dealt to `replicas` replicas (the same global batch, in order)."""
    return tuple(
        tuple(sum((list(ids) for ids in step[r::replicas]), []) for r in range(replicas))
        for step in STEPS_OF_4
    )


def whole(variable):
    """A table or slot as one array, its blocks joined."""
    return np.concatenate([np.asarray(part) for part in tf_private.variable_parts(variable)])


def made_table(replicas, optimizer="adagrad", rows=ROWS, seed=7):
    strategy = loops.testing.replica_strategy(replicas)
    with strategy.scope():
        table = loops.EmbeddingTable(rows, DIM, OPTIMIZERS[optimizer](), seed=seed, name="items")
        table.build()
    return strategy, table


def trained(strategy, table, steps):
    """Runs `steps` (ids per replica) with loss sum(table(ids)**2 * WEIGHTS) on each replica;
    each step's looked-up rows, per replica."""
    weights = tf.constant(WEIGHTS)

    def replica_step(ids):
        with tf.GradientTape() as tape:
            found = table(ids)
            loss = tf.reduce_sum(found**2 * weights)
        table.apply_gradients(tape.gradient(loss, table.shards))
        return found

    # One trace for ids of any count after the first: the collectives change shape by step.
    step = tf.function(lambda ids: strategy.run(replica_step, args=(ids,)), reduce_retracing=True)
    looked_up = []
    for ids in steps:
        per_replica = strategy.experimental_distribute_values_from_function(
            lambda context, ids=ids: tf.constant(ids[context.replica_id_in_sync_group], tf.int32)
        )
        found = strategy.experimental_local_results(step(per_replica))
        looked_up.append([np.asarray(rows) for rows in found])
    assert step.experimental_get_tracing_count() <= 2
    return looked_up


def reference(table, slot, optimizer, steps):
    """Float64 numpy of the same training over the global batches; each step's table."""
    table, slot = table.astype(np.float64), None if slot is None else slot.astype(np.float64)
    tables = []
    for step in steps:
        ids = sum((list(replica_ids) for replica_ids in step), [])
        tables.append(table.copy())
        gradient = np.zeros_like(table)
        np.add.at(gradient, ids, 2.0 * table[ids] * WEIGHTS)
        if optimizer == "sgd":
            table -= RATE * gradient
            continue
        if optimizer == "adagrad":
            slot += gradient**2
        else:
            slot += np.mean(gradient**2, axis=1, keepdims=True)
        table -= RATE * gradient / np.sqrt(slot + EPSILON)
    return table, slot, tables


def test_initial_values_are_a_function_of_the_global_row_on_every_layout():
    _, alone = made_table(1)
    expected = alone.embeddings.numpy()
    assert expected.shape == (ROWS, DIM) and np.abs(expected).max() <= 0.05
    assert len(np.unique(expected)) == ROWS * DIM
    for replicas in (2, 4):
        _, split = made_table(replicas)
        assert len(split.shards) == replicas
        np.testing.assert_array_equal(whole(split.embeddings), expected)
        # Outside strategy.run (evaluation, export) a lookup reads every block.
        np.testing.assert_array_equal(split(tf.constant([10, 0, 4])).numpy(), expected[[10, 0, 4]])
    # Servers: the blocks TablePartitioner has TensorFlow make, as it passes them (3 servers).
    blocks = [alone._initial_rows((rows, DIM), (first, 0)) for first, rows in ((0, 4), (4, 4))]
    blocks.append(alone._initial_rows((3, DIM), (8, 0)))
    np.testing.assert_array_equal(np.concatenate([b.numpy() for b in blocks]), expected)
    _, other_seed = made_table(1, seed=8)
    assert np.abs(other_seed.embeddings.numpy() - expected).min() > 0


def test_the_placement_splits_a_table_over_the_replicas_of_mirrored_alone():
    four = placement.Placement.of(loops.testing.replica_strategy(4), "exact")
    assert four.tables_split_over_replicas
    assert four.table_row_blocks(ROWS) == ((0, 3), (3, 6), (6, 9), (9, 11))
    assert four.table_row_blocks(2) == ((0, 1), (1, 2), (2, 2), (2, 2))
    assert [device[-5:] for device in four.table_block_devices] == [f"CPU:{i}" for i in range(4)]
    central = placement.Placement.of(loops.testing.replica_strategy(2, "central_storage"), "exact")
    one = placement.Placement.of(loops.testing.replica_strategy(1), "exact")
    for whole_table in (central, one):
        assert not whole_table.tables_split_over_replicas
        assert whole_table.table_block_devices == ()
        assert whole_table.table_row_blocks(ROWS) == ((0, ROWS),)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_table_split_over_replicas_trains_as_one_process_in_float64(optimizer):
    for replicas in (1, 2, 4):
        strategy, table = made_table(replicas, optimizer)
        initial = whole(table.embeddings)
        slot = whole(table.accumulator) if table.slot_names else None
        steps = steps_of(replicas)
        looked_up = trained(strategy, table, steps)
        want_table, want_slot, tables = reference(initial, slot, optimizer, steps)
        label = f"{optimizer} on {replicas} replicas"
        for step, (ids, found) in enumerate(zip(steps, looked_up)):
            for replica_ids, rows in zip(ids, found):
                assert rows.shape == (len(replica_ids), DIM), label
                np.testing.assert_allclose(rows, tables[step][replica_ids], atol=1e-6, rtol=0)
        got = whole(table.embeddings)
        np.testing.assert_allclose(got, want_table, rtol=0, atol=1e-5, err_msg=label)
        assert np.abs(got - initial).max(axis=1)[[0, 3, 9]].min() > 1e-3, label
        np.testing.assert_array_equal(got[UNTOUCHED], initial[UNTOUCHED], err_msg=label)
        if slot is not None:
            accumulator = whole(table.accumulator)
            np.testing.assert_allclose(accumulator, want_slot, rtol=0, atol=1e-5, err_msg=label)
            np.testing.assert_array_equal(accumulator[UNTOUCHED], slot[UNTOUCHED])


def test_a_table_of_fewer_rows_than_replicas_leaves_replicas_without_rows_and_trains_exactly():
    strategy, table = made_table(4, "sgd", rows=2)
    assert [tuple(part.shape) for part in table.shards] == [(1, DIM), (1, DIM), (0, DIM), (0, DIM)]
    initial = whole(table.embeddings)
    steps = (([0, 1, 1], [], [1], [0]), ([1], [1, 1], [], []))
    looked_up = trained(strategy, table, steps)
    want, _, tables = reference(initial, None, "sgd", steps)
    np.testing.assert_allclose(whole(table.embeddings), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(looked_up[1][1], tables[1][[1, 1]], rtol=0, atol=1e-6)
    assert looked_up[0][1].shape == (0, DIM)


def test_each_replica_holds_only_its_block_of_the_table_and_its_slots():
    strategy, table = made_table(4, "adagrad", rows=10)
    _, rowwise = made_table(4, "rowwise_adagrad", rows=10)
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)]
    for variable, width in (
        (table.embeddings, DIM),
        (table.accumulator, DIM),
        (rowwise.accumulator, 1),
    ):
        parts = tf_private.variable_parts(variable)
        assert [tuple(part.shape) for part in parts] == [(3, width), (3, width), (2, width)] + [
            (2, width)
        ]
        assert [part.device for part in parts] == devices
        # One copy each, not one per replica: a replicated table fails here.
        assert [len(strategy.experimental_local_results(part)) for part in parts] == [1] * 4
    assert sum(int(np.prod(part.shape)) for part in table.shards) == 10 * DIM


def checkpointed(table, directory):
    return tf.train.Checkpoint(table=table).save(str(directory / "table"))


@pytest.mark.parametrize("saved_on, restored_on", [(4, 1), (1, 2)])
def test_a_checkpoint_of_one_split_restores_into_another_and_trains_on_equal(
    tmp_path, saved_on, restored_on
):
    strategy, table = made_table(saved_on)
    initial, slot = whole(table.embeddings), whole(table.accumulator)
    trained(strategy, table, steps_of(saved_on)[:2])
    path = checkpointed(table, tmp_path)

    strategy, restored = made_table(restored_on, seed=99)  # other initial values, overwritten
    tf.train.Checkpoint(table=restored).restore(path).assert_consumed()
    np.testing.assert_array_equal(whole(restored.embeddings), whole(table.embeddings))
    np.testing.assert_array_equal(whole(restored.accumulator), whole(table.accumulator))
    trained(strategy, restored, steps_of(restored_on)[2:])
    want_table, want_slot, _ = reference(initial, slot, "adagrad", STEPS_OF_4)
    np.testing.assert_allclose(whole(restored.embeddings), want_table, rtol=0, atol=1e-5)
    np.testing.assert_allclose(whole(restored.accumulator), want_slot, rtol=0, atol=1e-5)


def test_loop_weights_give_a_split_table_and_its_slot_as_one_array_each():
    strategy, _ = made_table(4)
    with strategy.scope():
        ids = keras.Input((2,), dtype="int32")
        table = loops.EmbeddingTable(
            ROWS, DIM, keras.optimizers.Adagrad(RATE), seed=7, name="items"
        )
        model = keras.Model(ids, keras.layers.Dense(1)(table(ids)))
    trainer = types.SimpleNamespace(
        global_step=tf.Variable(0),
        strategy=strategy,
        saved_items=lambda: {"global_step": None, "model": model},
    )
    weights = loops.testing.loop_weights(trainer)
    assert sorted(weights) == [
        "global_step",
        "model/0/dense/kernel",
        "model/1/dense/bias",
        "model/table/items/accumulator",
        "model/table/items/embeddings",
    ]
    np.testing.assert_array_equal(weights["model/table/items/embeddings"], whole(table.embeddings))
    assert weights["model/table/items/accumulator"].shape == (ROWS, DIM)
    _, alone = made_table(1)
    np.testing.assert_array_equal(weights["model/table/items/embeddings"], alone.embeddings.numpy())


def test_rowwise_adagrad_applied_densely_is_the_stated_rule_and_refuses_a_vector():
    optimizer = loops.RowwiseAdagrad(RATE, initial_accumulator_value=0.5)
    table = keras.Variable(np.arange(6, dtype=np.float32).reshape(3, 2) / 10)
    gradient = np.array([[1.0, 3.0], [0.0, 0.0], [-2.0, 2.0]], np.float32)
    optimizer.apply_gradients([(tf.constant(gradient), table)])
    accumulator = 0.5 + np.mean(gradient.astype(np.float64) ** 2, axis=1, keepdims=True)
    want = np.arange(6).reshape(3, 2) / 10 - RATE * gradient / np.sqrt(accumulator + EPSILON)
    np.testing.assert_allclose(table.numpy(), want, rtol=0, atol=1e-6)
    assert table.numpy()[1].tolist() == np.float32([0.2, 0.3]).tolist()  # g = 0: unchanged
    np.testing.assert_allclose(optimizer.variables[-1].numpy(), accumulator, rtol=1e-6)
    with pytest.raises(ValueError, match=r"RowwiseAdagrad trains tables of rows .* shape \(4,\)"):
        loops.RowwiseAdagrad().build([keras.Variable(np.zeros(4, np.float32), name="bias")])


def test_a_split_lookup_sends_a_fixed_count_of_ids_and_a_large_table_needs_it_static():
    # One shape through a loop of steps: a small table's rows, else the static id count.
    assert table_blocks.lookup_capacity("items", 11, tf.zeros([3], tf.int32)) == 11
    assert table_blocks.lookup_capacity("items", 100_000, tf.zeros([4, 3], tf.int32)) == 12
    traced = tf.function(lambda ids: table_blocks.lookup_capacity("items", 100_000, ids))
    with pytest.raises(
        ValueError,
        match=r"EmbeddingTable 'items' \(100000 rows\) is split .* not static \(shape "
        r"\(None, 3\)\): give the step batches of one size \(batch with drop_remainder=True\)",
    ):
        traced.get_concrete_function(tf.TensorSpec([None, 3], tf.int32))


def test_a_checkpoint_moves_from_4_replicas_to_2_workers_to_3_servers_to_one_process(tmp_path):
    """The reshard chain: step 1 on 4 mirrored replicas, step 2 on 2 workers (one block each,
    restored from the first's checkpoint), step 3 on 3 parameter servers (restored from the
    workers'), then restored into one process: each continuation equal to the float64
    reference of one uninterrupted run."""
    import sharded_table_tasks
    from test_sharded_tables import run_tasks

    from conftest import ROOT, SUBPROCESS_ENV

    strategy, table = made_table(4)
    initial, slot = whole(table.embeddings), whole(table.accumulator)
    trained(strategy, table, steps_of(4)[:1])
    four = checkpointed(table, tmp_path / "four")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "loops.cluster.launch", "--num_workers=2", "--"),
            *(sys.executable, os.path.join(ROOT, "tests", "placed_table_workers.py")),
            *(str(tmp_path), four),
        ],
        capture_output=True,
        text=True,
        env={name: value for name, value in SUBPROCESS_ENV.items() if name != "TF_CONFIG"},
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (more,) = sharded_table_tasks.MORE_STEPS  # the servers' step: the same loss, other ids
    run = (*STEPS_OF_4[:2], (more,))
    _, _, tables = reference(initial, slot, "adagrad", run)
    for index, (first, last) in enumerate([(0, 6), (6, 11)]):
        worker = np.load(tmp_path / f"worker_{index}.npz")
        # Made on the workers, the table starts as on one process, bit for bit.
        np.testing.assert_array_equal(worker["initial_table"], initial)
        np.testing.assert_array_equal(worker["initial_slot"], slot)
        # Each holds its block and its slot's alone, on its own task.
        assert worker["block_rows"].tolist() == [first, last]
        assert worker["held"].tolist() == [(last - first) * DIM, (last - first) * DIM]
        assert f"/task:{index}/" in str(worker["block_device"])
        np.testing.assert_array_equal(worker["block"], worker["table"][first:last])
        # Its replica's lookups of the second step read the first step's table.
        ids = steps_of(2)[1][index]
        np.testing.assert_allclose(worker["looked_up"], tables[1][ids], rtol=0, atol=1e-6)
    np.testing.assert_allclose(worker["table"], tables[2], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(worker["table"][UNTOUCHED], initial[UNTOUCHED])
    # A model of plain Embeddings under a TablePlan on the 2 workers (its large table split
    # over them, one block each): the plain layer's losses and rows on one process.
    one, plain_losses, _ = test_table_plan.run(1, 4, seed_rows=test_table_plan.plan_rows())
    plain = one.big.embeddings.numpy()
    assert worker["plan_shard_rows"].tolist() == [test_table_plan.BIG // 2]
    np.testing.assert_allclose(worker["plan_losses"], plain_losses, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(worker["plan_table"], plain, rtol=0, atol=1e-6)
    # SGD and row-wise Adagrad on the 2 workers, every step: the float64 reference's.
    for optimizer in ("sgd", "rowwise_adagrad"):
        _, alone = made_table(1, optimizer)
        start = whole(alone.accumulator) if optimizer != "sgd" else None
        want_table, want_slot, _ = reference(whole(alone.embeddings), start, optimizer, STEPS_OF_4)
        np.testing.assert_allclose(worker[f"{optimizer}_table"], want_table, rtol=0, atol=1e-5)
        if start is not None:
            got = worker[f"{optimizer}_accumulator"]
            np.testing.assert_allclose(got, want_slot, rtol=0, atol=1e-5)

    servers, servers_dir = run_tasks(tmp_path, "servers", "continue", tmp_path, num_ps=3)
    assert servers["shard_rows"].tolist() == [4, 4, 3]
    np.testing.assert_array_equal(servers["restored_table"], worker["table"])
    np.testing.assert_array_equal(servers["restored_accumulator"], worker["slot"])
    want_table, want_slot, _ = reference(initial, slot, "adagrad", run)
    np.testing.assert_allclose(servers["table"], want_table, rtol=0, atol=1e-5)
    np.testing.assert_allclose(servers["accumulator"], want_slot, rtol=0, atol=1e-5)

    _, alone = made_table(1, seed=99)  # other initial values, overwritten
    latest = tf.train.latest_checkpoint(servers_dir)
    tf.train.Checkpoint(table=alone).restore(latest).assert_consumed()
    np.testing.assert_array_equal(whole(alone.embeddings), servers["table"])
    np.testing.assert_array_equal(whole(alone.accumulator), servers["accumulator"])


def test_a_large_tables_lookup_count_is_derived_from_the_placements_global_batch():
    from loops.tables import table_rows

    def traced_capacity(rows, examples):
        found = []
        ids = tf.TensorSpec([None, 3], tf.int32)
        capacity = functools.partial(table_blocks.lookup_capacity, examples_per_replica=examples)
        tf.function(
            lambda ids: found.append(capacity("items", rows, ids)) or ids
        ).get_concrete_function(ids)
        return found[0]

    strategy = tf.distribute.get_strategy()
    where = placement.Placement.of(strategy, placement.EXACT, global_batch_size=8)
    assert where.examples_per_replica == 8
    assert where.derived_lookups(3) == 24 and where.derived_lookups(None) is None
    assert traced_capacity(100_000, where.examples_per_replica) == 24  # 8 examples, 3 ids each
    assert traced_capacity(20, where.examples_per_replica) == 20  # at most the table
    assert table_blocks.lookup_capacity("items", 100_000, tf.zeros([4, 3], tf.int32)) == 12
    # The global batch travels with the run's placement, never on the strategy: a placement
    # of the same strategy without one derives nothing.
    assert placement.Placement.of(strategy, placement.EXACT).examples_per_replica is None
    halves = placement.Placement.of(loops.testing.replica_strategy(2), "exact", global_batch_size=9)
    assert halves.examples_per_replica == 5  # rounded up: a partial batch splits unevenly
    # Of a batch: the most values an example holds in an integer or string tensor.
    batch = (tf.zeros([4, 3], tf.int32), tf.zeros([4, 5]), tf.zeros([4], tf.string))
    assert table_rows.ids_per_example(batch) == 3
    assert table_rows.ids_per_example((tf.zeros([4, 2, 2], tf.int64),)) == 4
    assert table_rows.ids_per_example((tf.zeros([4, 5]),)) is None  # no ids
