"""An embedding table's rows in blocks: initial values that depend on the global row alone, the
blocks one per replica of a MirroredStrategy, and the lookup that exchanges ids and rows between
the replicas with collectives.

Initial values: row r, column c of a table is element r * dim + c of one
counter-based stream (Philox, keyed on the table's seed), so a block of rows
draws exactly its part of the stream, whatever the split: one process, N
replicas and M servers start equal bit for bit.

Split over N replicas (`loops.placement.Placement.tables_split_over_replicas`),
replica i holds block i of the rows (`Placement.table_row_blocks`) and its
optimizer slots, on its own device, and no other replica holds them; over
several workers, each makes only its own replicas' blocks
(`loops.tables.worker_blocks`). A lookup
in replica context (`lookup_over_replicas`) sends C distinct ids per replica,
C fixed when traced (`lookup_capacity`: the table's rows for a table of
`SMALL_TABLE_ROWS` rows or fewer, else the static id count, else the Update's
`max_table_lookups=`, else a share of the Trainer's global batch), because a loop
of steps in one function runs each collective with the instance keys of its
call, and such a collective must keep one shape from step to step:
1. an all-reduce of the ids, each replica's distinct ids padded with -1 to C
   and placed at its offset in a zero vector of N x C (an all-gather of the
   ids, in replica order);
2. each replica gathers the rows of its own block among those ids, zero
   elsewhere, and an all-reduce of these N C x dim floats gives every replica
   every row; each keeps its own ids' rows.
The gradient comes back the same way: the all-reduce's gradient is an
all-reduce of the replicas' row gradients (N C x dim floats), and each
replica's gather sends the rows of its own block to its block alone, as an
`IndexedSlices` of its local row numbers: already summed over the replicas,
so `loops.Update` applies it as it is and counts its squares once.
Bytes a step moves per table: three all-reduces of 8 N C (ids) + 4 N C dim
(rows, forward) + 4 N C dim (row gradients, backward) bytes; a ring
all-reduce sends and receives about twice its size per replica, a reduction
to one device N times. For N C = 4 x 1024 ids and dim = 64: 2.13 MB a step
(2,129,920 bytes). The replicated sparse path of `loops.Update`
(`table_rows.rows_over_replicas`) all-gathers about the backward half of
that (padded to the same kind of capacity) but holds the whole table and its
slots on every replica; a split table holds 1/N of them per replica. An
all-to-all would send each row to the one replica that asked: a later stage.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import tensorflow as tf

from loops import tf_private
from loops.tables import worker_blocks
from loops.tables.table_rows import SMALL_TABLE_ROWS

# A block's initial values: (its shape, the global index of its first row) -> a tensor.
BlockInitial = Callable[..., tf.Tensor]


def uniform_rows(
    seed: int, first_row: int, shape: Sequence[int], low: float, high: float
) -> tf.Tensor:
    """Rows `first_row` .. `first_row + shape[0]` of a table's uniform draw in [low, high):
    element r * dim + c of one Philox stream keyed on `seed`, the same whatever the block."""
    rows, dim = int(shape[0]), int(shape[1])
    start = first_row * dim
    # Philox makes 4 numbers a counter step: draw from the step that holds `start`.
    skip = start % 4
    return _uniform_stream(
        tf.constant([seed], tf.int64),
        tf.constant([(start - skip) // 4, 0], tf.int64),
        tf.constant(skip + rows * dim, tf.int32),
        tf.constant(skip, tf.int32),
        (rows, dim),
        tf.constant(low, tf.float32),
        tf.constant(high, tf.float32),
    )


# Made in a function, not op by op, whose temporaries stay inside it (see `embedding_tables`).
@tf.function(autograph=False)
def _uniform_stream(seed, counter, count, skip, shape, low, high) -> tf.Tensor:
    flat = tf.raw_ops.StatelessRandomUniformV2(
        shape=tf.reshape(count, [1]),
        key=tf.bitcast(seed, tf.uint64),
        counter=tf.bitcast(counter, tf.uint64),
        alg=1,  # Philox, on every device (auto-select would pick ThreeFry on a TPU)
        dtype=tf.float32,
    )
    return tf.reshape(flat[skip:], shape) * (high - low) + low


def blocks_over_replicas(
    name: str,
    blocks: Sequence[tuple[int, int]],
    devices: Sequence[str],
    width: int,
    initial: BlockInitial,
    *,
    trainable: bool,
    first_block: int = 0,
    strategy: tf.distribute.Strategy | None = None,
) -> object:
    """A table (or slot) of `width` columns split into `blocks` (every replica's, of every
    worker), of which this process makes and holds blocks `first_block` .. on `devices`, one
    each: as one ShardedVariable where it holds them all, else as this worker's
    `WorkerBlocks` of `strategy`. Either saves as one tensor of all the rows."""
    own = blocks[first_block : first_block + len(devices)]
    parts = []
    for index, ((first, last), device) in enumerate(zip(own, devices, strict=True)):
        shape = (last - first, width)
        parts.append(
            tf_private.variable_on_device(
                device,
                # Called on `device`: a block's values are made where they will live.
                initial_value=functools.partial(
                    initial, partition_shape=shape, partition_offset=(first, 0)
                ),
                trainable=trainable,
                name=f"{name}/part_{first_block + index}",
                dtype=tf.float32,
            )
        )
    if len(parts) == len(blocks):
        return tf_private.sharded_variable(parts, name)
    assert strategy is not None, "a worker's blocks need the strategy that gathers them"
    return worker_blocks.WorkerBlocks(name, parts, blocks, first_block, strategy)


def _replica_context(table_name: str) -> tf.distribute.ReplicaContext:
    context = tf.distribute.get_replica_context()
    replica = None if context is None else tf.get_static_value(context.replica_id_in_sync_group)
    if replica is None:
        raise ValueError(
            f"EmbeddingTable {table_name!r} is split over the replicas and looks rows up "
            "inside strategy.run, where each replica knows which block is its own; call it "
            "there (or in cross-replica context, which reads every block)."
        )
    return context


# The table size `lookup_capacity` is given for ids of no size bound (a dynamic table's raw ids).
UNBOUNDED_IDS = 2**62


def lookup_capacity(
    table_name: str,
    table_rows: int,
    rows: tf.Tensor,
    max_lookups: int | None = None,
    *,
    examples_per_replica: int | None = None,
) -> int:
    """The most distinct ids one replica sends in a lookup, the same on every replica and
    known when traced: the table's rows for a table of `SMALL_TABLE_ROWS` rows or fewer
    (as `loops.Update` gathers a replicated table's rows), else the replica's ids: their
    count where it is static (and the same on every replica, as a dataset's batches are),
    else `max_lookups` (the `max_table_lookups=` of the Update that trains the table), else
    `examples_per_replica` (the run's share of its global batch a replica holds,
    `Placement.examples_per_replica`) times the ids an example holds here.

    Raises:
        ValueError: a larger table and a count neither static, given nor derived.
    """
    if table_rows <= SMALL_TABLE_ROWS:
        return table_rows
    lookups = rows.shape.num_elements()
    if lookups is None:
        lookups = max_lookups
    ids_each = rows.shape[1:].num_elements() if rows.shape.rank else None
    if lookups is None and examples_per_replica is not None and ids_each is not None:
        # The run's global batch size's share times the ids an example holds here.
        lookups = examples_per_replica * ids_each
    if lookups is not None:
        return max(min(int(lookups), table_rows), 1)
    size = "of raw ids" if table_rows >= UNBOUNDED_IDS else f"({table_rows} rows)"
    raise ValueError(
        f"EmbeddingTable {table_name!r} {size} is split over the replicas and "
        "exchanges a step's ids between them in a shape fixed when the step is traced (a "
        "loop of steps keeps one), and the number of ids a replica looks up here is not "
        f"static (shape {rows.shape}): give the step batches of one size (batch with "
        "drop_remainder=True), or the Trainer global_batch_size= (the most examples a "
        "step's batch holds, from which the count is derived), or the loops.Update that "
        "trains it max_table_lookups=N (the most ids one replica looks up in one table in "
        "one step), or split the table over parameter servers."
    )


def lookup_over_replicas(
    table_name: str,
    blocks: Sequence[tf.Variable],
    bounds: Sequence[tuple[int, int]],
    rows: tf.Tensor,
    first_block: int = 0,
    *,
    max_lookups: int | None = None,
    examples_per_replica: int | None = None,
) -> tf.Tensor:
    """The rows `rows` (any shape, values in [0, table rows)) of a table split over the
    replicas, for this replica; call in replica context (see the module docstring).
    `blocks`: this process's blocks, `bounds[first_block]` .. on; `bounds`: every block's;
    `max_lookups`: the most ids a replica looks up, where their count is not static, else
    `examples_per_replica` times the ids an example holds (`lookup_capacity`)."""
    context = _replica_context(table_name)
    replica = int(tf.get_static_value(context.replica_id_in_sync_group))
    replicas = context.num_replicas_in_sync
    capacity = lookup_capacity(
        table_name, bounds[-1][1], rows, max_lookups, examples_per_replica=examples_per_replica
    )
    distinct, positions = tf.unique(tf.reshape(tf.cast(rows, tf.int64), [-1]))
    count = tf.shape(distinct)[0]
    check = tf.debugging.assert_less_equal(
        count,
        capacity,
        f"EmbeddingTable {table_name!r}: a replica looked up more distinct ids than the "
        f"{capacity} its lookup was traced with (its static id count, the Update's "
        "max_table_lookups=, or the global batch's share times the ids an example holds); "
        "pass loops.Update(..., max_table_lookups=N), N the most ids one replica looks up "
        "in one table in one step",
    )
    with tf.control_dependencies([check]):
        # Own ids, then -1 up to the capacity, at this replica's offset; zeros elsewhere.
        own = tf.pad(distinct + 1, [[0, capacity - count]]) - 1
    placed = tf.pad(own, [[replica * capacity, (replicas - 1 - replica) * capacity]])
    every_id = context.all_reduce(tf.distribute.ReduceOp.SUM, placed)

    block = blocks[replica - first_block]
    first, last = bounds[replica]
    dim = int(block.shape[1])
    # An empty block (fewer rows than replicas) gathers no row, but through the same ops:
    # the all-reduce's gradient, a collective, must run on every replica. Padding (-1) lies
    # in no block.
    owned = tf.where((every_id >= first) & (every_id < last))
    found = tf.gather(block, tf.gather_nd(every_id, owned) - first)
    own_rows = tf.scatter_nd(owned, found, [replicas * capacity, dim])
    every_row = context.all_reduce(tf.distribute.ReduceOp.SUM, own_rows)
    mine = tf.gather(every_row[replica * capacity : (replica + 1) * capacity], positions)
    return tf.reshape(mine, tf.concat([tf.shape(rows), [dim]], axis=0))
