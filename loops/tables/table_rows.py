"""An embedding table's gradient kept sparse: its duplicate ids summed, then every replica's
rows gathered and summed again, so that each replica holds the step's rows once each.

A `keras.layers.Embedding` (any `tf.gather` of a variable) differentiates to a
`tf.IndexedSlices`: one row per looked-up id, an id repeated as often as the
batch holds it. `unique_rows` sums the repeats (`tf.math.unsorted_segment_sum`
over `tf.unique` ids), which is the dense gradient restricted to the ids it
touches; `rows_over_replicas` all-gathers the replicas' ids and rows, each
padded to a capacity fixed when traced (uneven counts and an empty replica
included; the step's lookups, not R x D floats of a large table) and sums
the repeats across replicas. The
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


# A table of at most this many rows is gathered whole-sized when a step's lookups have no
# static bound: a capacity of its rows costs what a dense all-reduce of it would.
SMALL_TABLE_ROWS = 65_536


def ids_per_example(tensors: object) -> int | None:
    """The most values one example holds in any integer or string tensor of `tensors` (a
    step's batch, examples first): a bound on the ids an example looks up in a table, for
    ids read from the batch as they are. None: a tensor whose example size is not static."""
    most = 0
    for tensor in tf.nest.flatten(tensors):
        dtype = getattr(tensor, "dtype", None)
        if dtype is None or not (dtype.is_integer or dtype == tf.string):
            continue
        size = tensor.shape[1:].num_elements() if tensor.shape.rank else 1
        if size is None:
            return None
        most = max(most, size)
    return most or None


def capacity(
    slices: tf.IndexedSlices,
    table_rows: int,
    max_lookups: int | None,
    derived: int | None = None,
) -> int | None:
    """The most unique rows one replica's gradient of a table can hold, known when traced:
    its lookups if their count is static, else `max_lookups`, else `derived` (the marked
    global batch's share times the ids an example holds, `Placement.derived_lookups`), at most the
    table's rows (all of them for a table of `SMALL_TABLE_ROWS` rows or fewer); None: not
    known."""
    lookups = slices.indices.shape[0]
    bound = lookups if lookups is not None else max_lookups
    bound = bound if bound is not None else derived
    if bound is None:
        return table_rows if table_rows <= SMALL_TABLE_ROWS else None
    return min(int(bound), table_rows)


def rows_over_replicas(slices: tf.IndexedSlices, capacity: int | None) -> tf.IndexedSlices:
    """Every replica's `slices` summed, each id once: the same on every replica.

    Call in replica context with this replica's rows (`unique_rows` first, so
    that fewer rows travel). Each replica sends `capacity` rows, its own
    padded with id -1 (dropped after): a collective must keep one shape
    through a function's loop of steps, where the replicas' counts change
    from step to step (an empty replica sends only padding). The rows are
    gathered in replica order, so every replica sums them in the same order
    and holds the same bits; one replica gathers nothing.

    Args:
        capacity: the most rows one replica can hold (`capacity`); None is
            refused on several replicas.

    Raises:
        ValueError: several replicas and no capacity.
        tf.errors.InvalidArgumentError: at run time, more rows than `capacity`.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return unique_rows(slices)
    if capacity is None:
        raise ValueError(
            "loops.Update gathers an embedding table's rows across replicas in a shape "
            "fixed when the step is traced, and neither the number of ids a replica looks "
            "up in a step is static nor was max_table_lookups given, and the table has "
            f"more than {SMALL_TABLE_ROWS} rows. Give the Trainer global_batch_size= (the "
            "most examples a step's batch holds), from which the count is derived for ids "
            "read from the batch, or pass loops.Update(..., max_table_lookups=N), N the "
            "most ids one replica looks up in one table in one step (its examples times "
            "ids each)."
        )
    count = tf.shape(slices.indices)[0]
    check = tf.debugging.assert_less_equal(
        count,
        capacity,
        f"loops.Update was given max_table_lookups={capacity} (or the table's rows, or the "
        "global batch size's share times the ids an example holds), and a replica looked "
        "up more ids in one step; pass max_table_lookups=N, the most ids one replica looks "
        "up in one table in one step",
    )
    with tf.control_dependencies([check]):
        pad = capacity - count
    ids = tf.pad(tf.cast(slices.indices, tf.int64), [[0, pad]], constant_values=-1)
    paddings = tf.concat([[[0, pad]], tf.zeros([tf.rank(slices.values) - 1, 2], tf.int32)], 0)
    values = tf.pad(slices.values, paddings)
    ids = context.all_gather(tf.ensure_shape(ids, [capacity]), axis=0)
    values = context.all_gather(
        tf.ensure_shape(values, [capacity, *slices.values.shape[1:]]), axis=0
    )
    kept = ids >= 0
    gathered = tf.boolean_mask(ids, kept)
    return unique_rows(
        tf.IndexedSlices(tf.boolean_mask(values, kept), gathered, slices.dense_shape)
    )


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
