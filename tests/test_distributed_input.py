"""Splitting global batches into per-replica slices."""

import numpy as np
import pytest
import tensorflow as tf

import loops
from loops import tf_private
from loops.input import distributed_input


def slices(rows, num_replicas, num_pipelines=1, pipeline_id=0):
    dataset = tf.data.Dataset.range(rows).batch(rows)
    context = tf.distribute.InputContext(num_pipelines, pipeline_id, num_replicas)
    return [s.numpy().tolist() for s in distributed_input.split_global_batches(dataset, context)]


def test_partial_batch_gives_the_first_replicas_one_row_more():
    assert slices(5, 4) == [[0, 1], [2], [3], [4]]
    assert slices(7, 4) == [[0, 1], [2, 3], [4, 5], [6]]


def test_a_replica_is_empty_only_when_a_batch_has_fewer_rows_than_replicas():
    assert slices(3, 4) == [[0], [1], [2], []]
    assert slices(1, 4) == [[0], [], [], []]


def test_full_batch_splits_evenly():
    assert slices(8, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_each_pipeline_keeps_only_its_replicas_rows():
    assert slices(8, 4, num_pipelines=2, pipeline_id=0) == [[0, 1], [2, 3]]
    assert slices(8, 4, num_pipelines=2, pipeline_id=1) == [[4, 5], [6, 7]]
    assert slices(3, 4, num_pipelines=2, pipeline_id=1) == [[2], []]
    assert slices(5, 4, num_pipelines=2, pipeline_id=0) == [[0, 1], [2]]
    assert slices(5, 4, num_pipelines=2, pipeline_id=1) == [[3], [4]]


def test_uneven_replicas_per_pipeline_is_an_error():
    with pytest.raises(ValueError, match="3 replicas cannot be spread evenly over 2"):
        slices(4, 3, num_pipelines=2)


def test_distributed_steps_hold_the_global_batch():
    strategy = loops.testing.replica_strategy(4)
    dataset = tf.data.Dataset.range(21).batch(8)
    per_step = []
    for batch in loops.distribute(strategy, dataset):
        parts = strategy.experimental_local_results(batch)
        per_step.append([p.numpy().tolist() for p in parts])
    assert per_step[2] == [[16, 17], [18], [19], [20]]
    assert [sum(p, []) for p in per_step] == [
        list(range(0, 8)),
        list(range(8, 16)),
        list(range(16, 21)),
    ]


def test_skip_resumes_the_stream_where_it_stopped():
    strategy = loops.testing.replica_strategy(2)
    dataset = tf.data.Dataset.range(10).batch(4)
    iterator = iter(loops.distribute(strategy, dataset, skip_batches=4, repeat=True))
    parts = strategy.experimental_local_results(next(iterator))
    # 3 batches an epoch: skipping 4 lands on the second batch of epoch 2.
    assert np.concatenate([p.numpy() for p in parts]).tolist() == [4, 5, 6, 7]


def test_rejects_something_that_is_not_a_dataset():
    with pytest.raises(TypeError, match="Expected a tf.data.Dataset of global batches"):
        loops.distribute(loops.testing.replica_strategy(1), [1, 2, 3])


def test_every_stream_the_framework_reads_runs_without_the_autotuning_model():
    # Dropping an iterator read inside a tf.function waited for its thread for about 80 s.
    def autotuned():
        return (
            tf.data.Dataset.range(12)
            .map(lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(4)
            .prefetch(tf.data.AUTOTUNE)
        )

    seekable = loops.SeekableBatches(lambda position: autotuned().skip(position))
    sources = {
        "a dataset": (autotuned(), 0),
        "a function": (autotuned, 0),
        "a function, resumed": (autotuned, 2),
        "a seekable stream, resumed": (seekable, 1),
    }
    for name, (source, skip) in sources.items():
        dataset = distributed_input.as_dataset_fn(source, skip_batches=skip)()
        assert dataset.options().autotune.enabled is False, name
        # The batches are those of the source: only how they are produced changed.
        first = next(iter(dataset)).numpy().tolist()
        assert first == [4 * skip + 1 + i for i in range(4)], name


def test_the_strategy_still_distributes_datasets_the_usual_way_afterwards():
    strategy = loops.testing.replica_strategy(2)
    next(iter(loops.distribute(strategy, tf.data.Dataset.range(8).batch(4), repeat=True)))
    batch = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(4))))
    assert [p.numpy().tolist() for p in strategy.experimental_local_results(batch)] == [
        [0, 1],
        [2, 3],
    ]


def _train_steps(strategy, source, steps, skip_batches=0):
    """Each step's per-replica rows from `train_iterator`, read by `next_batch` in a tf.function."""
    iterator = distributed_input.train_iterator(strategy, source, skip_batches=skip_batches)

    @tf.function
    def step(iterator):
        return distributed_input.next_batch(iterator, strategy)

    return [
        [part.numpy().tolist() for part in strategy.experimental_local_results(step(iterator))]
        for _ in range(steps)
    ]


def _distributed_steps(strategy, source, steps, skip_batches=0):
    iterator = iter(loops.distribute(strategy, source, skip_batches=skip_batches, repeat=True))
    return [
        [part.numpy().tolist() for part in strategy.experimental_local_results(next(iterator))]
        for _ in range(steps)
    ]


@pytest.mark.parametrize("num_replicas", [1, 2, 4])
def test_train_iterator_gives_every_replica_the_rows_distribute_gives(num_replicas):
    strategy = loops.testing.replica_strategy(num_replicas)
    source = lambda: tf.data.Dataset.range(21).batch(8)  # noqa: E731
    fast = _train_steps(strategy, source, 7, skip_batches=2)
    assert fast == _distributed_steps(strategy, source, 7, skip_batches=2)
    if num_replicas == 4:
        # Step 1 of the skipped stream is the epoch's partial batch of 5 rows.
        assert fast[0] == [[16, 17], [18], [19], [20]]
        assert fast[1] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize(
    "num_replicas, name, plain",
    [(1, "mirrored", True), (2, "mirrored", True), (2, "central_storage", False)],
)
def test_train_iterator_is_a_plain_iterator_where_replicas_share_host_memory(
    num_replicas, name, plain
):
    # The fast path is taken (a TensorFlow upgrade that moved the attributes
    # it relies on fails here, not silently slower), and only where it is right.
    strategy = loops.testing.replica_strategy(num_replicas, name)
    iterator = distributed_input.train_iterator(strategy, tf.data.Dataset.range(6).batch(4))
    is_plain = tf_private.iterator_resource(iterator) is not None
    assert is_plain == plain
    if not plain:
        assert _train_steps(strategy, tf.data.Dataset.range(6).batch(4), 2) == [
            [[0, 1], [2, 3]],
            [[4], [5]],
        ]


@pytest.mark.parametrize(
    "rows, num_replicas, expected",
    [
        (5, 4, [[0, 1], [2], [3], [4]]),
        (5, 2, [[0, 1, 2], [3, 4]]),
        (2, 4, [[0], [1], [], []]),
        (8, 4, [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ],
)
def test_replica_slice_gives_the_rows_of_split_global_batches(rows, num_replicas, expected):
    batch = tf.range(rows)
    assert (
        [
            distributed_input.replica_slice(batch, r, num_replicas).numpy().tolist()
            for r in range(num_replicas)
        ]
        == expected
        == slices(rows, num_replicas)
    )


def test_replica_slice_of_a_full_batch_keeps_a_static_shape():
    def slice_shapes(spec):
        shapes = []

        def trace(batch):
            shapes.extend(
                distributed_input.replica_slice(batch, r, 2).shape.as_list() for r in range(2)
            )
            return batch

        tf.function(trace).get_concrete_function(spec)
        return shapes

    assert slice_shapes(tf.TensorSpec([64, 3])) == [[32, 3], [32, 3]]
    assert slice_shapes(tf.TensorSpec([None, 3])) == [[None, 3], [None, 3]]


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_a_stream_of_full_batches_reaches_the_step_with_a_static_shape(num_replicas):
    # What the train step is traced for: a stream of full batches keeps its batch
    # dimension through train_iterator and next_batch (BUILD.md, full batches).
    strategy = loops.testing.replica_strategy(num_replicas)
    stream = tf.data.Dataset.range(64).batch(8, drop_remainder=True)
    iterator = distributed_input.train_iterator(strategy, stream)
    shapes = []

    def trace(iterator):
        batch = distributed_input.next_batch(iterator, strategy)
        shapes.extend(part.shape.as_list() for part in strategy.experimental_local_results(batch))
        return tf.constant(0)

    tf.function(trace).get_concrete_function(iterator)
    assert shapes == [[8 // num_replicas]] * num_replicas


def test_ragged_batches_take_the_distributed_iterator_and_arrive_whole():
    strategy = loops.testing.replica_strategy(1)
    ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3], [4, 5, 6]])).batch(
        2
    )
    iterator = distributed_input.train_iterator(strategy, ragged, skip_batches=1)

    @tf.function
    def step(iterator):
        return distributed_input.next_batch(iterator, strategy)

    assert step(iterator).to_list() == [[4, 5, 6]]
    assert step(iterator).to_list() == [[1], [2, 3]]
