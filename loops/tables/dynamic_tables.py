"""`loops.DynamicTable`: an `EmbeddingTable` of a fixed capacity looked up by raw ids, which
admits and evicts ids by a stated policy on the step clock, the same on every layout.

The table is an `EmbeddingTable` of `capacity + 1` rows (placed, split, trained by its row
rule and checkpointed as every table is) and a map (`loops.tables.id_map`) from raw ids to
its rows. A training call (`training=True`, one a step) first gathers the step's distinct
ids and their counts from every replica, in one all-reduce of 2 x 8 x N x L bytes (N
replicas, L the most distinct ids a replica looks up, `table_blocks.lookup_capacity`),
and every replica, of every worker, takes the same decisions from them on its own copy of
the map (`id_map.decide`); then it looks the ids up through the new map. Each replica so
holds the whole map, about C x 42 bytes (C the capacity: 41 a row, 16 each of the C / 16
places of the index's recent part) and 24 bytes a waiting place, and no step moves it.

An id without a row (never seen, not yet admitted, evicted or refused) reads zeros and gets
no update: its lookups read the table's last row, held at zeros, through a mask whose
gradient is zero, which every row rule leaves unchanged. An admitted id's row starts at
`initial_rows(seed, id)`, uniform in [-0.05, 0.05) from a hash of the seed and the id, and
its optimizer slots at their initial values, so a re-admitted id starts afresh as a new one
does. Evaluation and serving (`training` not True) change nothing.

The map lives in variables that every replica writes alone (synchronized on read, the first
replica's saved), so a checkpoint holds the map, the rows, the slots, the counters and the
step count, and restores into any other layout. Under the exact parameter-server mode the map
lives on the servers with the rows: the chief makes the step's decisions from the whole
global batch before the workers compute their slices (`decided_elsewhere`: the slices only
look up), so the decisions are the synchronous strategies'. The asynchronous mode is refused:
its workers take steps apart, and the map's decisions need the whole step.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import keras
import tensorflow as tf

from loops import placement
from loops.tables import embedding_tables, id_map, id_rows, table_blocks
from loops.tables.embedding_tables import EmbeddingTable, _whole_argument
from loops.tables.id_rows import initial_rows

ID_KINDS = ("ints", "strings")

# Whether a DynamicTable traced now only looks up: its step's decisions made elsewhere (the
# exact parameter-server chief's, before the workers' slices), set while a slice is traced.
# Process-wide, not a thread's: a strategy may trace a replica's function in a thread of its
# own.
_DECISIONS = {"elsewhere": 0}
_DECISIONS_LOCK = threading.Lock()


@contextlib.contextmanager
def decided_elsewhere() -> Iterator[None]:
    """Within it, a DynamicTable's training call only looks up (traces no decision): the
    exact parameter-server mode's slices, whose step the chief decided beforehand."""
    with _DECISIONS_LOCK:
        _DECISIONS["elsewhere"] += 1
    try:
        yield
    finally:
        with _DECISIONS_LOCK:
            _DECISIONS["elsewhere"] -= 1


class ChiefDecisions:
    """Takes a step's dynamic-table decisions on the exact parameter-server chief, from the
    whole global batch, before the workers compute their slices: the step's slice function
    (`compute(step_rows, first_row, *batch)`) on the whole batch in a `tf.function` whose
    outputs are dropped, so only its writes run (the maps and the admitted rows' starts,
    and what feeds them; the rest of the step is pruned)."""

    def __init__(self, strategy: tf.distribute.Strategy):
        self._strategy = strategy
        self._deciders: dict = {}  # by slice function: each traced once

    @contextlib.contextmanager
    def taken(self, tables, compute, args: tuple) -> Iterator[None]:
        """Takes the step's decisions here where `tables` hold a DynamicTable; within it the
        slices only look up (`decided_elsewhere`)."""
        if any(isinstance(table, DynamicTable) for table in tables):
            self(compute, args)
        with decided_elsewhere():
            yield

    def __call__(self, compute, args: tuple) -> None:
        decide = self._deciders.get(compute)
        if decide is None:
            strategy = self._strategy

            def decided(rows, *batch):
                strategy.run(compute, args=(rows, tf.constant(0, tf.int32), *batch))

            decide = self._deciders[compute] = tf.function(decided, reduce_retracing=True)
        decide(tf.shape(tf.nest.flatten(args)[0], out_type=tf.int32)[0], *args)


class DynamicTable(EmbeddingTable):
    """A table of at most `capacity` raw ids' rows of `dim` floats (the module docstring).

    Args:
        capacity: the most ids that hold a row at once.
        dim: each vector's length.
        optimizer: the row rule's Keras optimizer, as `loops.EmbeddingTable`'s (Adagrad,
            `loops.RowwiseAdagrad` or SGD without momentum; "update": the Update's).
        admit_after: an id gets a row once seen this many times; before, it reads zeros.
        seed: the seed of every admitted id's initial values.
        ids: "ints" (int64 ids of any value but 2**63 - 1) or "strings" (each hashed to
            an int64 by TensorFlow's 64-bit fingerprint: two strings share a row only if
            their fingerprints are equal, about n**2 / 2**64 for n strings).
        decay, ttl, waiting: the rest of the `id_map.AdmissionPolicy`.
    """

    def __init__(
        self,
        capacity: int,
        dim: int,
        optimizer: keras.optimizers.Optimizer | str | None = None,
        admit_after: int = 1,
        seed: int = 0,
        *,
        ids: str = "ints",
        decay: float = 1.0,
        ttl: int | None = None,
        waiting: int | None = None,
        **kwargs,
    ):
        capacity = _whole_argument("capacity", capacity, 1)
        self.policy = id_map.AdmissionPolicy(admit_after, decay, ttl, waiting)
        if ids not in ID_KINDS:
            raise ValueError(f"DynamicTable(ids={ids!r}): pass one of {ID_KINDS}.")
        super().__init__(capacity + 1, dim, optimizer, ids="rows", seed=seed, **kwargs)
        self.capacity, self.id_kind = capacity, ids

    @property
    def waiting_places(self) -> int:
        """How many ids can wait for admission at once."""
        if self.policy.waiting is not None:
            return self.policy.waiting
        return self.capacity if self.policy.admit_after > 1 else 0

    def build(self, input_shape=None) -> None:
        _check_strategy(self, tf.distribute.get_strategy())
        super().build(input_shape)
        empty = id_map.empty_state(self.capacity, self.waiting_places)
        strategy = tf.distribute.get_strategy()
        on_servers = placement.current(strategy, placement.EXACT).variables_on_servers
        # Every replica writes its own copy, the same values; the first one's saves. On the
        # servers, one copy the chief writes.
        copies = (
            {}
            if on_servers
            else {
                "synchronization": tf.VariableSynchronization.ON_READ,
                "aggregation": tf.VariableAggregation.ONLY_FIRST_REPLICA,
            }
        )
        for name, value in zip(id_map.FIELDS, empty.values(), strict=True):
            variable = tf.Variable(value, trainable=False, name=f"map_{name}", **copies)
            setattr(self, f"map_{name}", variable)

    def _initial_rows(self, partition_shape=None, partition_offset=None) -> tf.Tensor:
        del partition_offset  # every row starts at zeros; an admitted id's row is set then
        shape = partition_shape if partition_shape is not None else (self.rows, self.dim)
        return tf.zeros(shape, tf.float32)

    def map_state(self) -> id_map.MapState:
        """The map as tensors (this replica's copy, inside `strategy.run`)."""
        return id_map.MapState(
            **{name: tf.convert_to_tensor(getattr(self, f"map_{name}")) for name in id_map.FIELDS}
        )

    def id_numbers(self, ids) -> tf.Tensor:
        """Each id as the int64 the map keys it by."""
        ids = tf.convert_to_tensor(ids)
        if self.id_kind == "strings":
            return id_rows.string_numbers(ids)
        numbers = tf.cast(ids, tf.int64)
        check = tf.debugging.assert_none_equal(
            numbers,
            tf.constant(id_map.EMPTY, tf.int64),
            message=f"DynamicTable {self.name!r}: the id 2**63 - 1 is reserved (it marks the map's "
            "unused end); map it to another id.",
        )
        with tf.control_dependencies([check]):
            return tf.identity(numbers)

    def known(self, ids) -> tf.Tensor:
        """Whether each of `ids` holds a row (bool, the ids' shape)."""
        return id_map.lookup(self.map_state(), self.id_numbers(ids), self.capacity)[1]

    def call(self, ids, training=None) -> tf.Tensor:
        numbers = self.id_numbers(ids)
        if training and not _DECISIONS["elsewhere"]:
            self._take_step(numbers)
        rows, known = id_map.lookup(self.map_state(), numbers, self.capacity)
        vectors = embedding_tables.rows_of(self, rows)
        return tf.where(known[..., None], vectors, tf.zeros_like(vectors))

    def _take_step(self, numbers: tf.Tensor) -> None:
        """The step's decisions over every replica's ids, written to the map and the rows."""
        ids, counts = _step_ids(self, numbers)
        decision = id_map.decide(self.map_state(), ids, counts, self.policy)
        for name, value in zip(id_map.FIELDS, decision.state.values(), strict=True):
            getattr(self, f"map_{name}").assign(value)
        self._start_rows(decision.admitted_ids, decision.admitted_rows)

    def _start_rows(self, ids: tf.Tensor, rows: tf.Tensor) -> None:
        """Sets the admitted ids' rows to their initial values, and their slots to theirs,
        in the blocks this replica holds."""
        values = initial_rows(self.seed, ids, self.dim)
        slots = [(self.slot_shards(name), value) for name, (value, _) in self._slots.items()]
        for index, (first, last) in _own_blocks(self):
            inside = (rows >= first) & (rows < last)
            local = (tf.boolean_mask(rows, inside) - first)[:, None]
            self.shards[index].scatter_nd_update(local, tf.boolean_mask(values, inside))
            for parts, value in slots:
                part = parts[index]
                filled = tf.fill([tf.shape(local)[0], int(part.shape[1])], value)
                part.scatter_nd_update(local, filled)

    def counter_tensors(self) -> dict[str, tf.Tensor]:
        """The map's counters (`id_map.COUNTERS`), its resident and waiting ids and its step
        count, as int64 scalars (in a traced step too)."""
        state = self.map_state()
        values = {name: state.counters[i] for i, name in enumerate(id_map.COUNTERS)}
        values["resident"] = tf.reduce_sum(tf.cast(state.row_used, tf.int64))
        values["waiting"] = tf.reduce_sum(tf.cast(state.waiting_ids != id_map.EMPTY, tf.int64))
        values["step"] = state.step
        return values

    def counters(self) -> dict[str, int]:
        """`counter_tensors` as Python ints."""
        return {name: int(value) for name, value in self.counter_tensors().items()}

    def where(self) -> dict:
        placed = super().where()
        placed["dynamic"] = {
            "capacity": self.capacity,
            "admit_after": self.policy.admit_after,
            "decay": self.policy.decay,
            "ttl": self.policy.ttl,
            "waiting_places": self.waiting_places,
            **self.counters(),
        }
        return placed


# The step outputs of a run's dynamic tables, totals over them (results.json's `tables` has
# each table's): the name of each and the counter (or "resident") it sums.
STEP_COUNTERS = {"ids_resident": "resident", "ids_evicted": "evictions", "ids_refused": "refusals"}


def summed_counters(tables) -> dict[str, tf.Tensor]:
    """`STEP_COUNTERS` summed over the `DynamicTable`s among `tables` (int64 scalars, read in
    cross-replica context); {} without any."""
    dynamic = [table for table in tables if isinstance(table, DynamicTable) and table.built]
    if not dynamic:
        return {}
    each = [table.counter_tensors() for table in dynamic]
    return {
        name: tf.add_n([values[counter] for values in each])
        for name, counter in STEP_COUNTERS.items()
    }


def _check_strategy(table: DynamicTable, strategy: tf.distribute.Strategy) -> None:
    where = placement.current(strategy, placement.EXACT)
    if where.variables_on_servers and not where.exact_parameter_server:
        raise ValueError(
            f"DynamicTable {table.name!r} cannot train under the asynchronous "
            "parameter-server mode: its workers take steps apart, and the map's admissions "
            "need the whole step's ids. Use parameter_server_mode='exact' (the default), "
            "MirroredStrategy or MultiWorkerMirroredStrategy (the same numbers)."
        )
    if where.num_replicas_in_sync > 1 and not where.tables_split_over_replicas:
        raise ValueError(
            f"DynamicTable {table.name!r}: {where.strategy_name} keeps one copy of the table "
            "for several replicas, which cannot set admitted rows in step; use "
            "MirroredStrategy or MultiWorkerMirroredStrategy."
        )


def _step_ids(table: DynamicTable, numbers: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The step's distinct ids over every replica, ascending, and how often each was seen."""
    ids, _, counts = tf.unique_with_counts(tf.reshape(numbers, [-1]), out_idx=tf.int64)
    context = tf.distribute.get_replica_context()
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas > 1:
        if context is None:
            raise ValueError(
                f"DynamicTable {table.name!r} trains inside strategy.run, where the "
                "replicas share their ids; call it there with training=True."
            )
        width = table_blocks.lookup_capacity(
            table.name,
            table_blocks.UNBOUNDED_IDS,
            numbers,
            table.max_lookups,
            examples_per_replica=table._placement.examples_per_replica,
        )
        replica = tf.get_static_value(context.replica_id_in_sync_group)
        check = tf.debugging.assert_less_equal(
            tf.shape(ids, out_type=tf.int64)[0],
            tf.constant(width, tf.int64),
            f"DynamicTable {table.name!r}: a replica looked up more distinct ids than the "
            f"{width} it was traced with; pass loops.Update(..., max_table_lookups=N).",
        )
        with tf.control_dependencies([check]):
            own = tf.pad(tf.stack([ids, counts]), [[0, 0], [0, width - tf.shape(ids)[0]]])
        placed = tf.pad(own, [[0, 0], [replica * width, (replicas - 1 - replica) * width]])
        every = context.all_reduce(tf.distribute.ReduceOp.SUM, placed)
        seen = every[1] > 0  # padding has no count
        ids, index = tf.unique(tf.boolean_mask(every[0], seen), out_idx=tf.int64)
        counts = tf.math.unsorted_segment_sum(
            tf.boolean_mask(every[1], seen), index, tf.shape(ids)[0]
        )
    order = tf.argsort(ids)
    return tf.gather(ids, order), tf.gather(counts, order)


def _own_blocks(table: DynamicTable) -> list[tuple[int, tuple[int, int]]]:
    """(index among `table.shards`, (first, one-past-last) row) of each block this replica
    writes: its own alone when split over the replicas, else every one."""
    blocks = table._placement.table_row_blocks(table.rows)
    context = tf.distribute.get_replica_context()
    if table.split_over_replicas and context is not None and context.num_replicas_in_sync > 1:
        replica = int(tf.get_static_value(context.replica_id_in_sync_group))
        return [(replica - table._placement.first_table_block, blocks[replica])]
    return list(enumerate(blocks))
