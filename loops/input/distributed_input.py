"""Turns a stream of global batches into per-replica batches for a strategy.

Every input pipeline builds the same stream of global batches and keeps only
its own rows of each, split into one slice per local replica. A step therefore
sees exactly the examples a single device would see in that step, whatever the
number of workers and replicas. Slices are balanced: a partial final batch
gives the first replicas one row more than the rest (21 examples, global
batch 8, 4 replicas: the third step is split [2, 1, 1, 1]), so a replica is
left without rows only when a batch has fewer rows than there are replicas
(BUILD.md fact 17). Reading the whole stream on every pipeline is the
price of that exactness; it is small next to the step for the datasets this
framework targets, and a user with sharded files can pass their own
`dataset_fn`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import tensorflow as tf

from loops import tf_private, topology
from loops.input.random_access import SeekableBatches
from loops.placement import EXACT, Placement

DatasetSource: TypeAlias = "tf.data.Dataset | Callable[[], tf.data.Dataset] | SeekableBatches"


def _placement(strategy: tf.distribute.Strategy) -> Placement:
    """Where the input of `strategy` is read: a placement in either parameter-server mode, as
    the input asks nothing the mode changes (`per_replica_input_pipelines`,
    `global_batches_in_host_memory`)."""
    return Placement.of(strategy, EXACT)


def split_global_batches(
    dataset: tf.data.Dataset, input_context: tf.distribute.InputContext
) -> tf.data.Dataset:
    """Returns this pipeline's per-replica slices of each global batch, in order.

    Each global batch is cut into `num_replicas_in_sync` contiguous slices
    (`topology.replica_bounds`); pipeline p yields the slices of its replicas, one
    element each, so the strategy's round-robin hands slice k to local replica k.
    """
    num_replicas = input_context.num_replicas_in_sync
    num_pipelines = input_context.num_input_pipelines
    if num_replicas % num_pipelines:
        raise ValueError(
            f"{num_replicas} replicas cannot be spread evenly over "
            f"{num_pipelines} input pipelines; use the same number of "
            "replicas on every worker."
        )
    local_replicas = num_replicas // num_pipelines
    if num_replicas == 1:
        return dataset
    first_replica = input_context.input_pipeline_id * local_replicas

    # Gather each global batch into this pipeline's slices padded to the
    # longest, unbatch them with their true row counts, then cut the padding
    # off. This costs a third less per step than a flat_map over slice datasets.
    def to_padded_slices(*batch):
        batch = batch[0] if len(batch) == 1 else batch
        parts = tf.nest.flatten(batch)
        rows = tf.shape(parts[0])[0]
        longest = (rows + num_replicas - 1) // num_replicas
        starts, ends = topology.replica_bounds(
            rows, tf.range(first_replica, first_replica + local_replicas), num_replicas
        )
        # Rows past a slice's end repeat its last row: padding, cut off below.
        index = tf.minimum(starts[:, None] + tf.range(longest)[None, :], rows - 1)
        return tuple(tf.gather(part, index) for part in parts), ends - starts

    def unpad(parts, count):
        return tf.nest.pack_sequence_as(structure, [part[:count] for part in parts])

    structure = dataset.element_spec
    return dataset.map(to_padded_slices).unbatch().map(unpad)


def as_dataset_fn(source: DatasetSource, *, skip_batches: int = 0) -> Callable[[], tf.data.Dataset]:
    """Accepts a dataset or a function that builds one; returns a function building the stream.

    With `skip_batches`, the function builds the stream from that batch on: a
    `SeekableBatches` starts there directly, anything else skips up to it.
    Every dataset it returns is checked and carries `READ_OPTIONS`.
    """
    build = _source_fn(source, skip_batches)
    return lambda: _as_read(build())


# The options of every stream the framework reads. Without tf.data's autotuning
# model: dropping an iterator read inside a tf.function (a recovery, a new
# position, an evaluation's end, a garbage collection) was seen to wait for
# its model thread for about 80 s, holding the GIL (benchmarks/RESULTS.md,
# "Input costs"). AUTOTUNE still means something without it: a parallel map
# runs as many calls as its threads, a prefetch buffer grows while its reader waits.
READ_OPTIONS = tf.data.Options()
READ_OPTIONS.autotune.enabled = False


def _source_fn(source: DatasetSource, skip_batches: int) -> Callable[[], object]:
    if isinstance(source, SeekableBatches):
        return lambda: source.batches_from(skip_batches)
    if skip_batches:
        dataset_fn = as_dataset_fn(source)
        return lambda: dataset_fn().repeat().skip(skip_batches)
    if isinstance(source, tf.data.Dataset):
        return lambda: source
    if callable(source):
        return source
    raise TypeError(
        f"Expected a tf.data.Dataset of global batches or a function returning "
        f"one, got {type(source).__name__}: {source!r}."
    )


def distribute(
    strategy: tf.distribute.Strategy,
    source: DatasetSource,
    *,
    skip_batches: int = 0,
    repeat: bool = False,
) -> tf.distribute.DistributedDataset:
    """Distributes a stream of global batches over `strategy`'s replicas.

    Args:
        strategy: the strategy whose replicas consume the batches.
        source: a dataset of global batches, or a function building one (a
            function is preferred: it is called once per input pipeline).
        skip_batches: global batches to drop from the start, to resume
            mid-stream after a restore (a `SeekableBatches` starts there
            without reading them; anything else is repeated and skipped).
        repeat: repeat the stream forever (training).
    """
    dataset_fn = as_dataset_fn(source, skip_batches=skip_batches)
    options = _input_options(strategy)
    per_replica_pipelines = options is not None

    def pipeline(input_context):
        dataset = dataset_fn()
        if repeat:
            dataset = dataset.repeat()
        dataset = split_global_batches(dataset, input_context)
        if not per_replica_pipelines:
            return dataset.prefetch(tf.data.AUTOTUNE)
        # One pipeline per replica shares the cores with the replicas' compute:
        # a fixed, small prefetch on one private thread each ran 1.45x faster
        # (2-replica MLP) than autotuned pipelines that spawn threads of their own.
        sized = tf.data.Options()
        sized.threading.private_threadpool_size = 1
        sized.autotune.enabled = False
        return dataset.prefetch(2).with_options(sized)

    if not per_replica_pipelines:
        return strategy.distribute_datasets_from_function(pipeline, options)
    # Per-replica pipelines would change the strategy's input workers for good.
    with tf_private.input_workers_kept(strategy):
        return strategy.distribute_datasets_from_function(pipeline, options)


def _as_read(dataset: object) -> tf.data.Dataset:
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"The input function returned {type(dataset).__name__}, not a "
            "tf.data.Dataset of global batches."
        )
    return dataset.with_options(READ_OPTIONS)


def _input_options(strategy: tf.distribute.Strategy) -> tf.distribute.InputOptions | None:
    """Per-replica pipelines when the replicas are logical CPUs of one host.

    There a pipeline per replica (each reading the stream and keeping its own
    slice) delivers a step's input 2.3x faster than one pipeline feeding all
    replicas through a multi-device iterator, which copies what needs no copy.
    Devices with their own memory (GPUs) keep the default: one pipeline per
    worker that prefetches to the devices. So does every strategy but
    MirroredStrategy: CentralStorageStrategy accepts PER_REPLICA but builds
    a single pipeline for all its replicas, and its steps then fail with an
    IndexError when `strategy.run` looks for replica 1's input
    (`Placement.per_replica_input_pipelines`).
    """
    if not _placement(strategy).per_replica_input_pipelines:
        return None
    return tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False,
    )


def train_iterator(
    strategy: tf.distribute.Strategy, source: DatasetSource, *, skip_batches: int = 0
):
    """An endless iterator over `source`'s batches for the train loop, `skip_batches` in.

    Read it with `next_batch`. When the replicas share the host's memory (one
    replica, or MirroredStrategy over the CPUs of one machine) and batches are
    dense tensors, it is a plain tf.data iterator of global batches that
    `next_batch` reads with one synchronous kernel and cuts into the replicas'
    slices inside the step; otherwise it is the strategy's own distributed
    iterator.
    """
    if not _placement(strategy).global_batches_in_host_memory:
        return iter(distribute(strategy, source, skip_batches=skip_batches, repeat=True))
    dataset = as_dataset_fn(source, skip_batches=skip_batches)().repeat()
    if not _dense(dataset.element_spec):
        # The dataset already built is handed on, not built a second time.
        return iter(distribute(strategy, dataset, repeat=True))
    with tf.device("/cpu:0"):  # where every replica reads it (they are all host CPUs)
        return iter(dataset)


def global_batch_iterator(source: DatasetSource, *, skip_batches: int = 0) -> tf.data.Iterator:
    """An endless plain iterator over `source`'s global batches on this host's CPU,
    `skip_batches` in: where the chief of the exact parameter-server mode reads each step's
    batch (the same batch the synchronous strategies read at that step)."""
    with tf.device("/cpu:0"):
        return iter(as_dataset_fn(source, skip_batches=skip_batches)().repeat())


def next_batch(iterator, strategy: tf.distribute.Strategy):
    """The next step's input from a `train_iterator`: a global batch at 1 replica, else per replica.

    On a plain iterator this avoids two costs of `next` on a distributed
    one: its asynchronous kernel hands every element between threads, and
    per-replica pipelines each read the whole stream and cut their slice
    with tf.data functions (measured in benchmarks/RESULTS.md). Slices follow
    `split_global_batches`.
    """
    resource = tf_private.iterator_resource(iterator)
    if resource is None or not _dense(iterator.element_spec):
        return next(iterator)
    specs = tf.nest.flatten(iterator.element_spec)
    flat = tf.raw_ops.IteratorGetNextSync(
        iterator=resource,
        output_types=[spec.dtype for spec in specs],
        output_shapes=[spec.shape for spec in specs],
    )
    return replica_batches(tf.nest.pack_sequence_as(iterator.element_spec, flat), strategy)


def replica_batches(batch, strategy: tf.distribute.Strategy):
    """A global batch read whole as the step takes it: itself at 1 replica, else each
    replica's slice (`replica_slice`) as per-replica values."""
    num_replicas = strategy.num_replicas_in_sync
    if num_replicas == 1:
        return batch
    return strategy.experimental_distribute_values_from_function(
        lambda context: replica_slice(batch, context.replica_id_in_sync_group, num_replicas)
    )


def eval_dataset(
    strategy: tf.distribute.Strategy, source: DatasetSource
) -> tf.data.Dataset | tf.distribute.DistributedDataset:
    """The eval pass's stream of `source`'s global batches, read as `train_iterator` reads the
    train stream: where the replicas share this host's memory and batches are dense tensors,
    the plain dataset, each batch cut into the replicas' slices inside the step
    (`replica_batches`); otherwise the strategy's distributed dataset.

    A distributed iterator's `get_next_as_optional` holds a cond a replica that passes every
    component of the batch, and Grappler's dependency optimizer takes time that grows with the
    square of the components to rewrite it: the first eval pass of 200 feature columns on 2
    replicas took 53 s (benchmarks/RESULTS.md, "Many feature columns").
    """
    if not _placement(strategy).global_batches_in_host_memory:
        return distribute(strategy, source)
    dataset = as_dataset_fn(source)()
    if not _dense(dataset.element_spec):
        # The dataset already built is handed on, not built a second time.
        return distribute(strategy, dataset)
    return dataset


def replica_slice(batch, replica_id, num_replicas: int):
    """Replica `replica_id`'s rows of a global batch (`topology.replica_bounds`).

    A batch of static size keeps a static shape: TensorFlow folds the shape
    arithmetic when the graph is built (tested).
    """
    parts = tf.nest.flatten(batch)
    start, end = topology.replica_bounds(tf.shape(parts[0])[0], replica_id, num_replicas)
    # One slice op a part, its bounds shared: `part[start:end]` packs them anew for each part
    # (three ops more a part and a replica; a table of many columns has many parts).
    begin, stop, stride = tf.stack([start]), tf.stack([end]), tf.ones([1], start.dtype)
    return tf.nest.pack_sequence_as(
        batch, [tf.strided_slice(part, begin, stop, stride) for part in parts]
    )


def _dense(element_spec) -> bool:
    """Every component is a dense tensor (what the synchronous kernel's outputs can describe)."""
    return all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(element_spec))
