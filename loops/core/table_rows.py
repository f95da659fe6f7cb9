"""An embedding table's gradient kept sparse: its duplicate ids summed, then every replica's
rows gathered and summed again, so that each replica holds the step's rows once each.

A `keras.layers.Embedding` (any `tf.gather` of a variable) differentiates to a
`tf.IndexedSlices`: one row per looked-up id, an id repeated as often as the
batch holds it. `unique_rows` sums the repeats (`tf.math.unsorted_segment_sum`
over `tf.unique` ids), which is the dense gradient restricted to the ids it
touches; `rows_over_replicas` all-gathers the replicas' ids and rows (which
takes replicas of uneven counts, an empty one included, and moves only the
touched rows: never R x D floats) and sums the repeats across replicas. The
result is the same on every replica and its squared norm equals the dense
summed gradient's, so a global-norm clip and the health metrics see the
numbers a dense gradient would give.
"""

from __future__ import annotations

import tensorflow as tf


def unique_rows(slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """`slices` with each id once, its rows summed, in the order ids first appear.

    Args:
        slices: a gradient of a table: `indices` [n] ids (repeats allowed),
            `values` [n, ...] rows.

    Returns:
        An IndexedSlices of unique ids whose dense form equals that of `slices`.
    """
    ids, positions = tf.unique(slices.indices)
    rows = tf.math.unsorted_segment_sum(slices.values, positions, tf.shape(ids)[0])
    return tf.IndexedSlices(rows, ids, slices.dense_shape)


def rows_over_replicas(slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """Every replica's `slices` summed, each id once: the same on every replica.

    Call in replica context with this replica's rows (`unique_rows` first, so
    that fewer rows travel). The rows are gathered in replica order, so every
    replica sums them in the same order and holds the same bits; one replica
    gathers nothing.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return unique_rows(slices)
    ids = context.all_gather(slices.indices, axis=0)
    rows = context.all_gather(slices.values, axis=0)
    return unique_rows(tf.IndexedSlices(rows, ids, slices.dense_shape))


def scaled(slices: tf.IndexedSlices, factor: tf.Tensor) -> tf.IndexedSlices:
    """`slices` with its rows multiplied by `factor` (a scalar)."""
    return tf.IndexedSlices(
        slices.values * tf.cast(factor, slices.values.dtype), slices.indices, slices.dense_shape
    )


def concatenated(first: tf.IndexedSlices, second: tf.IndexedSlices) -> tf.IndexedSlices:
    """The sum of two gradients of one table, as one IndexedSlices (repeats kept)."""
    return tf.IndexedSlices(
        tf.concat([first.values, second.values], axis=0),
        tf.concat([first.indices, second.indices], axis=0),
        first.dense_shape,
    )


def lookup(table, ids: tf.Tensor) -> tf.Tensor | None:
    """The rows `ids` of `table` read sparsely from this replica's copy; None where that
    cannot be done (in cross-replica context, or a replica id not known when traced).

    A sparse read (`ResourceGather`) touches only those rows, and its gradient
    is an IndexedSlices for `unique_rows`. A mirrored variable has no sparse
    read of its own in replica context (`tf.gather` reads it whole), so this
    reads the replica's own copy.

    Args:
        table: a Keras or tf variable ([rows, ...]), mirrored or not.
        ids: int32 or int64 row numbers in [0, rows).
    """
    context = tf.distribute.get_replica_context()
    if context is None:
        return None
    # A Keras variable wraps a tf.Variable (mirrored under a mirrored strategy).
    variable = table if isinstance(table, tf.Variable) else table.value
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is None:
        return None
    copies = context.strategy.experimental_local_results(variable)
    try:
        return copies[int(replica) % len(copies)].sparse_read(ids)
    except AttributeError:  # a variable without its own sparse read
        return None
