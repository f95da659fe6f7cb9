"""The private TensorFlow names loops relies on (`loops.tf_private`) are still there and do what
its adapters need: a TensorFlow release that renames one fails here, by name, before the
features built on it fail."""

import numpy as np
import tensorflow as tf

from loops import tf_private

DEVICES = ["/cpu:0", "/cpu:1"]  # two of the logical CPUs tests/conftest.py makes


def test_a_mirrored_strategy_keys_its_collectives_from_the_base_it_is_made_with():
    assert isinstance(getattr(tf.distribute.MirroredStrategy, tf_private.COLLECTIVE_KEY_BASE), int)
    tf_private.start_collective_keys_at(7_700_000)
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    assert getattr(strategy.extended, tf_private.COLLECTIVE_KEY_BASE) == 7_700_000
    ids = strategy.run(
        lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
    )
    assert float(strategy.reduce("SUM", ids, axis=None)) == 1.0  # 0 + 1, over the new keys


def test_per_replica_pipelines_leave_the_strategys_input_workers_as_they_were():
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    before = getattr(strategy.extended, tf_private.INPUT_WORKER_DEVICES)
    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA
    )
    with tf_private.input_workers_kept(strategy):
        strategy.distribute_datasets_from_function(
            lambda context: tf.data.Dataset.range(4).batch(1), options
        )
    assert getattr(strategy.extended, tf_private.INPUT_WORKER_DEVICES) == before
    # What the restored devices are for: a dataset distributed afterwards still reads.
    batches = strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(4))
    first = strategy.experimental_local_results(next(iter(batches)))
    np.testing.assert_array_equal(np.concatenate([t.numpy() for t in first]), [0, 1, 2, 3])


def test_a_plain_iterators_resource_reads_its_next_element_synchronously():
    iterator = iter(tf.data.Dataset.from_tensor_slices(np.array([5, 6, 7], np.int64)))
    resource = tf_private.iterator_resource(iterator)
    assert resource is not None
    (value,) = tf.raw_ops.IteratorGetNextSync(
        iterator=resource, output_types=[tf.int64], output_shapes=[tf.TensorShape([])]
    )
    assert int(value) == 5 and int(next(iterator)) == 6
    assert tf_private.iterator_resource([1, 2]) is None
