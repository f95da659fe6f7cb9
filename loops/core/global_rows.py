"""A replica's rows seen as part of the whole global batch: its offset in it, and every
replica's rows gathered in global row order.

A loss over the whole batch (contrastive negatives, a ranking loss, batch
statistics) needs the other replicas' rows. The input layer gives replica r
the rows [offset_r, offset_r + rows_r) of each global batch, in replica order,
so gathering every replica's rows in replica order rebuilds the global batch
exactly, also when replicas hold different numbers of rows or none (a partial
final batch). Both functions run in replica context (inside `strategy.run`,
e.g. in a `loops.Update`'s loss function).
"""

from __future__ import annotations

import tensorflow as tf

from loops.vocabulary.whole_numbers import check_whole


def _replica_context() -> tf.distribute.ReplicaContext:
    context = tf.distribute.get_replica_context()
    if context is None:
        raise ValueError(
            "loops.global_row_offset and loops.gather_global_rows work on one replica's "
            "rows, and were called in cross-replica context; call them inside "
            "strategy.run (for example in the loss function a loops.Update runs)."
        )
    return context


def _rows_of_every_replica(local_rows: tf.Tensor) -> tf.Tensor:
    """The number of rows each replica holds, in replica order (int32, one entry a replica)."""
    context = _replica_context()
    replicas = context.num_replicas_in_sync
    mine = tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=tf.int32)
    return context.all_reduce(tf.distribute.ReduceOp.SUM, mine * tf.cast(local_rows, tf.int32))


def global_row_offset(local_rows: tf.Tensor | int) -> tf.Tensor:
    """The global row of this replica's first row: the rows all replicas before it hold.

    Args:
        local_rows: the rows this replica holds (e.g. `tf.shape(labels)[0]`).

    Returns:
        An int32 scalar; row i of this replica is row `offset + i` of the global batch.

    Raises:
        ValueError: called in cross-replica context.
    """
    context = _replica_context()
    counts = _rows_of_every_replica(tf.convert_to_tensor(local_rows))
    return tf.reduce_sum(counts[: context.replica_id_in_sync_group])


def gather_global_rows(value: tf.Tensor, *, global_batch_size: int) -> tf.Tensor:
    """Every replica's rows of `value` (axis 0), concatenated in global row order.

    The same tensor on every replica: row `global_row_offset(...) + i` is this
    replica's row i. It is differentiable: a loss computed from it on every
    replica sends each row's gradient back to the replica that holds the row,
    summed over the replicas that used it, so summing the replicas' losses
    (each divided by the global count, `loops.scale_to_global_batch`) gives the
    gradient of one loss over the whole batch on one device.

    Each replica places its rows at its offset in a zero tensor of
    `global_batch_size` rows and the tensors are summed over replicas: unlike
    an all-gather it needs no equal shapes, so empty and short replicas work,
    and adding zeros is exact. The size is fixed because a compiled
    collective keeps the shape of its first run: a partial final batch of
    another size would fail in the middle of training.

    Args:
        value: a tensor of rank >= 1 whose first axis is this replica's rows.
        global_batch_size: the most rows a step's global batch holds (the
            configured global batch size).

    Returns:
        A tensor of shape [global rows, *value.shape[1:]], global rows being
        the rows of this step (fewer than global_batch_size in a partial batch).

    Raises:
        ValueError: `value` is a scalar, a global_batch_size that is not a whole
            number >= 1, or called in cross-replica context.
        tf.errors.InvalidArgumentError: at run time, a step holds more rows than
            global_batch_size.
    """
    value = tf.convert_to_tensor(value)
    if value.shape.rank == 0:
        raise ValueError(
            "loops.gather_global_rows gathers rows along the first axis and got a scalar; "
            "pass a tensor whose first axis is this replica's rows (e.g. embeddings [rows, dim])."
        )
    check_whole("global_batch_size", global_batch_size, note=" (the most rows a step holds)")
    context = _replica_context()
    rows = tf.shape(value)[0]
    counts = _rows_of_every_replica(rows)
    total = tf.reduce_sum(counts)
    offset = tf.reduce_sum(counts[: context.replica_id_in_sync_group])
    message = (
        f"loops.gather_global_rows was given global_batch_size={global_batch_size}, and a "
        "step holds more rows; pass the global batch size the input makes"
    )
    with tf.control_dependencies(
        [tf.debugging.assert_less_equal(total, global_batch_size, message)]
    ):
        after = global_batch_size - offset - rows
    paddings = tf.concat([[[offset, after]], tf.zeros([tf.rank(value) - 1, 2], tf.int32)], axis=0)
    placed = tf.ensure_shape(tf.pad(value, paddings), [global_batch_size, *value.shape[1:]])
    return context.all_reduce(tf.distribute.ReduceOp.SUM, placed)[:total]
