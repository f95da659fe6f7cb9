"""`loops.EmbeddingTable`: a Keras layer whose table and slots split by rows (servers, replicas).

Under ParameterServerStrategy made with `loops.TablePartitioner` (as
`loops.make_strategy("parameter_server")` makes it) the table and each slot of
its row optimizer are `ShardedVariable`s: block i of the rows lives on server i
and is initialized there, so no task, the chief included, ever holds the whole
table. A lookup gathers from each shard (`tf.nn.embedding_lookup`) and
`apply_gradients` touches only the rows the batch hit, shard by shard, with
the row update of its Keras optimizer (SGD without momentum or Adagrad, exact:
`loops.tables.row_updates`) on slots of the table's own, split as it is. Under
one process (or one_device) the same variables are ordinary ones, and the
layer equals `keras.layers.Embedding` (lookups) and its optimizer Keras' on
the dense gradient (updates). Under MirroredStrategy or MultiWorkerMirroredStrategy
of N replicas the table and its slots are split into N blocks, block i on
replica i's device alone (`Placement.table_row_blocks`; each worker makes and
holds only its own replicas' blocks, `loops.tables.worker_blocks`): a lookup
inside `strategy.run` exchanges ids and rows with collectives, and
`apply_gradients` there updates this replica's block alone
(`loops.tables.table_blocks` states the bytes a step moves). Other strategies
of several synchronous replicas (central storage) look up but refuse to update.

The table saves as `embeddings` and each slot under its name (`accumulator`),
every one as one whole tensor whatever the split, so a checkpoint saved with M
servers, N replicas or W workers restores into any other split or into one
process, slots included (TensorFlow reshards a ShardedVariable itself when it
restores one; several workers gather their blocks as they save).

Initial values: uniform in [-0.05, 0.05] (Keras' Embedding default), a function
of `seed` and the global row alone (`table_blocks.uniform_rows`), so one
process, N replicas and M servers start equal bit for bit; with `initial_ids`, of
`seed` and the id a row holds (`loops.tables.id_rows.initial_rows`, a
`DynamicTable`'s start for that id), whatever the ids' order.
"""

from __future__ import annotations

import contextlib
import numbers
import typing
from collections.abc import Iterator, Sequence

import keras
import tensorflow as tf

from loops import keras_private, placement, tf_private
from loops.tables import (
    id_rows,
    row_updates,
    table_blocks,
    table_ids,
    table_rows,
    worker_blocks,
)
from loops.tables.id_rows import INITIAL_RANGE
from loops.vocabulary.whole_numbers import is_whole

# EmbeddingTable(optimizer=FROM_UPDATE) trains with the optimizer of the Update that trains it.
FROM_UPDATE = "update"


class EmbeddingTable(keras.layers.Layer):
    """A table of `rows` vectors of `dim` floats, looked up by row numbers, strings or hashes.

    Args:
        rows: the table's rows.
        dim: each vector's length.
        optimizer: the Keras optimizer `apply_gradients` uses: Adagrad (the
            default, Keras' defaults), `loops.RowwiseAdagrad`, `loops.LazyAdam` or
            SGD without momentum, the ones with an exact row update
            (`loops.tables.row_updates.RULES`). Its slots live beside
            the table, split the same way; its learning rate is read each step,
            a schedule's at the optimizer's `iterations`, which the table does
            not count (`optimizer.iterations.assign_add(1)` after the step
            does, or an optimizer that trains more). "update": the optimizer
            of the `loops.Update` that trains it, its `table_optimizer` (else
            its `optimizer`), taken with its slots when that Update is made
            (`take_optimizer`), for a table whose model its trainer does not
            write (a `loops.TablePlan`'s).
        ids: "rows" (int ids in [0, rows)), "strings" or "hashes" (int64 ids of
            any value), the last two hashed to rows (`loops.tables.table_ids`
            states the collision policy) unless a vocabulary maps the strings.
            A "rows" id outside [0, rows) fails the lookup with an
            InvalidArgumentError naming the table, on the CPU and on a GPU
            alike (where TensorFlow's gather alone would return zeros), before
            any row changes; under XLA (`jit_compile`) the check is dropped
            and XLA's gather clamps the id to the nearest row.
        vocabulary: words (strings; bytes are read as UTF-8) mapped to rows
            0..len-1 in order, at least one; other words hash to the
            `oov_buckets` rows after them (rows = len(vocabulary) + oov_buckets).
        seed: the initial values' seed.
        initial_ids: the raw id each row holds (whole numbers or strings, one a row): row
            r then starts at `loops.initial_rows(seed, initial_ids[r])`, as a `DynamicTable` of
            that seed starts the id, not at the seed's draw for row r.

    The whole numbers (rows, dim, oov_buckets, seed) may be NumPy integers.
    """

    def __init__(
        self,
        rows: int,
        dim: int,
        optimizer: keras.optimizers.Optimizer | str | None = None,
        *,
        ids: str = "rows",
        vocabulary: Sequence[str] | None = None,
        oov_buckets: int = 1,
        seed: int = 0,
        initial_ids: Sequence | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        rows, dim = _whole_argument("rows", rows, 1), _whole_argument("dim", dim, 1)
        seed = _whole_argument("seed", seed, None)
        self.initial_ids = None if initial_ids is None else _checked_ids(initial_ids, rows)
        if vocabulary is not None:
            vocabulary = table_ids.checked_vocabulary(vocabulary)
            oov_buckets = _whole_argument("oov_buckets", oov_buckets, 1)
        table_ids.check_id_kind(ids, rows, vocabulary, oov_buckets)
        self.rows, self.dim, self.ids, self.seed = rows, dim, ids, seed
        if isinstance(optimizer, str) and optimizer != FROM_UPDATE:
            raise ValueError(
                f"EmbeddingTable(optimizer={optimizer!r}): pass a Keras optimizer, or "
                f"{FROM_UPDATE!r} for the optimizer of the loops.Update that trains it."
            )
        self.optimizer = optimizer if optimizer is not None else keras.optimizers.Adagrad()
        # Taken from the Update that trains it (`take_optimizer`), with its slots, after build.
        self._slots = {} if optimizer == FROM_UPDATE else row_updates.slot_values(self.optimizer)
        self._vocabulary = (
            None if vocabulary is None else table_ids.vocabulary_lookup(vocabulary, oov_buckets)
        )
        # The most ids one replica looks up here in a step, where not static (`bound_lookups`).
        self.max_lookups: int | None = None

    def build(self, input_shape=None) -> None:
        strategy = tf.distribute.get_strategy()
        _check_split_over_servers(self, strategy)
        # The run's placement where a Trainer builds the table (its global batch bounds the
        # lookups); a table built by hand lives as it would in either mode.
        self._placement = placement.current(strategy, placement.EXACT)
        with placement.rows_split_over_servers():
            self.embeddings = self._table_variable("embeddings", self._initial_rows, True)
        self._make_slots()
        super().build(input_shape)

    def _make_slots(self) -> None:
        """The optimizer's slots, split as the table is."""
        with placement.rows_split_over_servers():
            for name, (value, width) in self._slots.items():
                variable = self._table_variable(name, self._filled(value, width), False, width)
                setattr(self, name, variable)

    @property
    def optimizer_taken(self) -> bool:
        """Whether the table has its optimizer: its own, or the Update's it was made to take."""
        return self.optimizer != FROM_UPDATE

    def take_optimizer(self, optimizer: keras.optimizers.Optimizer) -> None:
        """Makes `optimizer` the table's (one made with optimizer="update", built), and its
        slots beside the table, split as it is; the Update that trains the table calls it.

        Raises:
            ValueError: an optimizer without an exact row update, saying why.
        """
        if self.optimizer_taken:
            return  # its own, or taken already: the Update checks that it trains with it
        slots = row_updates.slot_values(optimizer)
        self.optimizer, self._slots = optimizer, slots
        with self._placement.strategy.scope():
            self._make_slots()

    def _table_variable(self, name: str, initial_value, trainable: bool, width: int | None = None):
        """The table (or a slot of `width` columns, the table's by default), placed here."""
        width = self.dim if width is None else width
        if self._placement.tables_split_over_replicas:
            return table_blocks.blocks_over_replicas(
                name,
                self._placement.table_row_blocks(self.rows),
                self._placement.table_block_devices,
                width,
                initial_value,
                trainable=trainable,
                first_block=self._placement.first_table_block,
                strategy=self._placement.strategy,
            )
        arguments = dict(
            initial_value=initial_value,
            shape=(self.rows, width),
            dtype=tf.float32,
            trainable=trainable,
            name=name,
        )
        device = self._placement.whole_table_device
        if device is not None:
            return tf_private.variable_on_device(device, **arguments)
        return tf.Variable(**arguments)

    def _initial_rows(self, partition_shape=None, partition_offset=None) -> tf.Tensor:
        shape = partition_shape if partition_shape is not None else (self.rows, self.dim)
        first = 0 if partition_offset is None else int(partition_offset[0])
        if self.initial_ids is not None:
            ids = tf.constant(self.initial_ids[first : first + int(shape[0])])
            return id_rows.initial_rows(self.seed, ids, int(shape[1]))
        return table_blocks.uniform_rows(
            self.seed, first, tuple(shape), -INITIAL_RANGE, INITIAL_RANGE
        )

    def _filled(self, value: float, width: int | None):
        def initial(partition_shape=None, partition_offset=None):
            del partition_offset  # every row starts the same
            columns = self.dim if width is None else width
            shape = partition_shape if partition_shape is not None else (self.rows, columns)
            return _filled_rows(tuple(shape), tf.constant(value, tf.float32))

        return initial

    @property
    def shards(self) -> list[tf.Variable]:
        """The variables this process holds the rows in, in row order: one per server, one per
        replica (of this worker), or the one table."""
        return _parts(self.embeddings)

    def whole(self, name: str = "embeddings") -> tf.Tensor:
        """The table (or slot `name`) as one (rows, width) tensor, its blocks joined in row
        order. Split over several workers, every worker must call it (a collective)."""
        variable = getattr(self, name)
        if isinstance(variable, worker_blocks.WorkerBlocks):
            return variable.whole()
        return tf.concat([tf.convert_to_tensor(part) for part in _parts(variable)], axis=0)

    def set_whole(self, value, name: str = "embeddings") -> None:
        """Sets the table (or slot `name`) from one (rows, width) array in row order, each block
        taking its own rows: the inverse of `whole`. Split over several workers, every worker
        must call it, with the same array.

        Raises:
            ValueError: an array of another shape, naming both.
        """
        _set_whole(self, name, value)

    def bound_lookups(self, count: int) -> None:
        """Bounds the ids one replica looks up here in one step at `count` (the
        `max_table_lookups=` of the `loops.Update` that trains the table; the largest of
        several): split over the replicas, a lookup whose id count is not static exchanges
        this many ids a replica."""
        self.max_lookups = max(int(count), self.max_lookups or 0)

    @property
    def split_over_replicas(self) -> bool:
        """Whether each replica of the strategy holds one block of the rows and updates it
        alone (MirroredStrategy or MultiWorkerMirroredStrategy of several replicas)."""
        return self._placement.tables_split_over_replicas

    def where(self) -> dict:
        """Where the built table lives, for results.json: its name, rows, width, optimizer,
        how its rows are split ("replicas", "servers" or "whole") and each block's (first,
        one-past-last) row."""
        return {
            "name": self.name,
            "rows": self.rows,
            "dim": self.dim,
            "optimizer": type(self.optimizer).__name__ if self.optimizer_taken else None,
            "split": self._placement.table_split(self.rows),
            "blocks": [list(block) for block in self._placement.table_row_blocks(self.rows)],
        }

    @property
    def slot_names(self) -> tuple[str, ...]:
        """The names of the optimizer's slots the table keeps (Adagrad's: accumulator)."""
        return tuple(self._slots)

    def slot_shards(self, name: str) -> list[tf.Variable]:
        """Slot `name`'s variables, split as `shards`."""
        return _parts(getattr(self, name))

    def row_ids(self, ids) -> tf.Tensor:
        """The table row of each id (see `ids`)."""
        ids = tf.convert_to_tensor(ids)
        if self._vocabulary is not None:
            return self._vocabulary.lookup(ids)
        if self.ids == "rows":
            return ids
        return table_ids.hashed_rows(ids, self.rows)

    def call(self, ids) -> tf.Tensor:
        rows = self.row_ids(ids)
        if self.ids == "rows":
            rows = _checked_rows(self, rows)
        return rows_of(self, rows)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.dim)

    def apply_gradients(self, gradients: Sequence[tf.IndexedSlices | tf.Tensor | None]) -> None:
        """Updates only the touched rows of each shard and its slots.

        `gradients` is `tape.gradient(loss, table.shards)`: one per shard, in order.

        Split over the replicas, call it inside `strategy.run`: each replica
        has the gradient of its own block (the others are None) and updates it.

        Raises:
            ValueError: under another strategy of several synchronous replicas,
                whose copies of the table this would update apart.
        """
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1 and not self._placement.tables_split_over_replicas:
            raise ValueError(
                f"EmbeddingTable.apply_gradients updates one copy of the table, but the strategy "
                f"keeps {replicas} replicas in sync: use it in one process, under one_device or "
                "parameter_server, or train a keras.layers.Embedding through loops.Update."
            )
        if not self.optimizer_taken:
            raise ValueError(
                f"EmbeddingTable {self.name!r} trains with the optimizer of the loops.Update "
                "that trains it (optimizer='update'), and no Update has taken it: train it "
                "through loops.Update, or call take_optimizer(optimizer) first."
            )
        if len(gradients) != len(self.shards):
            raise ValueError(
                f"{len(gradients)} gradients for a table of {len(self.shards)} shards: pass "
                "tape.gradient(loss, table.shards), one per shard."
            )
        rate = typing.cast(keras.optimizers.Optimizer, self.optimizer).learning_rate
        rate = rate.value if isinstance(rate, keras.Variable) else rate
        slots = [self.slot_shards(name) for name in self._slots]
        for index, (shard, gradient) in enumerate(zip(self.shards, gradients, strict=True)):
            if gradient is None:
                continue  # no row of this shard was looked up
            if not isinstance(gradient, tf.IndexedSlices):
                gradient = tf.IndexedSlices(gradient, tf.range(tf.shape(gradient)[0]))
            rows = table_rows.unique_rows(gradient)
            shard_slots = [slot[index] for slot in slots]
            row_updates.apply_rows(
                self.optimizer,
                shard,
                rows.indices,
                rows.values,
                learning_rate=rate,
                slots=shard_slots,
            )


def rows_of(table: EmbeddingTable, rows: tf.Tensor) -> tf.Tensor:
    """The rows `rows` (row numbers in [0, table.rows), any shape) of `table`, wherever they
    live: through the replicas' collectives inside `strategy.run` when split over them."""
    # Inside the strategy's strategy.run; outside it (no strategy in force is the default
    # strategy's one replica) the lookup reads every block.
    context = tf.distribute.get_replica_context()
    in_replicas = context is not None and context.num_replicas_in_sync > 1
    if table._placement.tables_split_over_replicas and in_replicas:
        return table_blocks.lookup_over_replicas(
            table.name,
            table.shards,
            table._placement.table_row_blocks(table.rows),
            rows,
            table._placement.first_table_block,
            max_lookups=table.max_lookups,
            examples_per_replica=table._placement.examples_per_replica,
        )
    if isinstance(table.embeddings, worker_blocks.WorkerBlocks):
        raise ValueError(
            f"EmbeddingTable {table.name!r} is split over the replicas of "
            f"{table._placement.num_workers} workers, and this worker holds only its own "
            "replicas' rows: look rows up inside strategy.run (each replica asks every "
            "other for its rows there), or read the table with whole(), on every worker."
        )
    return tf.nn.embedding_lookup(table.embeddings, rows)


def _check_split_over_servers(table: EmbeddingTable, strategy: tf.distribute.Strategy) -> None:
    """Refuses a parameter-server strategy that would put the whole table on one server.

    A throwaway variable of one row per server, made as the table will be,
    shows how the strategy splits one before the table is made.
    """
    servers = placement.num_parameter_servers(strategy)
    if servers < 2:
        return
    with placement.rows_split_over_servers():
        probe = tf.Variable(tf.zeros([servers, 1]), trainable=False, name="split_probe")
    if len(tf_private.variable_parts(probe)) != servers:
        raise ValueError(
            f"EmbeddingTable({table.rows}, {table.dim}) under ParameterServerStrategy with "
            f"{servers} servers would lie whole on one of them: make the strategy with "
            f"variable_partitioner=loops.TablePartitioner({servers}) "
            "(loops.make_strategy('parameter_server') does)."
        )


def _checked_rows(table: EmbeddingTable, rows: tf.Tensor) -> tf.Tensor:
    """`rows`, once every one lies in [0, rows): an InvalidArgumentError naming the table
    otherwise, on every device (a GPU's gather alone would return zeros for it)."""
    inside = tf.reduce_all((rows >= 0) & (rows < tf.cast(table.rows, rows.dtype)))
    check = tf.debugging.Assert(
        inside,
        [
            f"EmbeddingTable {table.name!r} (ids='rows') was given an id outside "
            f"[0, {table.rows}); the ids, first 10:",
            rows,
        ],
        summarize=10,
    )
    with tf.control_dependencies([check]):
        return tf.identity(rows)


def _whole_argument(name: str, value: object, least: int | None) -> int:
    """`value` as an int (a NumPy integer too), or a ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"EmbeddingTable({name}={value!r}) needs a whole number"
            f"{'' if least is None else f' >= {least}'}, not a {type(value).__name__}."
        )
    if not is_whole(int(value), least):
        raise ValueError(f"EmbeddingTable({name}={value!r}) needs a whole number >= {least}.")
    return int(value)


def _set_whole(table: EmbeddingTable, name: str, value) -> None:
    """`EmbeddingTable.set_whole`: each of the table's (or slot `name`'s) blocks its rows."""
    variable = getattr(table, name)
    value = tf.cast(tf.convert_to_tensor(value), tf.float32)
    shape = (table.rows, int(variable.shape[1]))
    if tuple(value.shape) != shape:
        raise ValueError(
            f"EmbeddingTable {table.name!r} holds its {name} as one {shape} array, one row a "
            f"table row, and was given one of shape {tuple(value.shape)}: pass the {shape} "
            "array whole() reads."
        )
    if isinstance(variable, worker_blocks.WorkerBlocks):
        variable.restore_whole(value)
        return
    first = 0
    for part in _parts(variable):
        last = first + int(part.shape[0])
        part.assign(value[first:last])
        first = last


def _parts(variable: object) -> list[tf.Variable]:
    """The variables a table or slot is held in here, in row order."""
    if isinstance(variable, worker_blocks.WorkerBlocks):
        return variable.variables
    return tf_private.variable_parts(variable)


def tables_in(model: keras.Layer) -> list[EmbeddingTable]:
    """Every trainable `EmbeddingTable` in `model` (nested models and layers included)."""
    layers = keras_private.nested_layers(model, include_self=True)
    return [layer for layer in layers if isinstance(layer, EmbeddingTable) and layer.trainable]


@contextlib.contextmanager
def held_whole(items: object) -> Iterator[None]:
    """Inside, each table split over several workers (of the Keras models among `items`, a
    definition's checkpoint items) holds all its rows, and each of its slots, in one variable
    of this process, gathered from every worker: what a test or an export that reads the model
    outside `strategy.run` needs. Every worker must enter it (a gather a variable); other
    tables are left as they are."""
    # The table and its slots alike: a SavedModel saves every variable a layer holds.
    held = [
        (table, name, getattr(table, name))
        for table in split_over_workers(items)
        for name in ("embeddings", *table.slot_names)
    ]
    for table, name, blocks in held:
        whole = tf_private.variable_on_device(
            blocks.device, initial_value=blocks.whole(), trainable=False, name=name
        )
        setattr(table, name, whole)
    try:
        yield
    finally:
        for table, name, blocks in held:
            setattr(table, name, blocks)


def table_placements(items: object, where: placement.Placement) -> list[dict]:
    """Where each built table of the Keras models among `items` (a definition's checkpoint
    items) lives, for results.json: `EmbeddingTable.where` of each, then each plain
    `keras.layers.Embedding`, "replicated" on every replica of a synchronous strategy of
    several, "whole" otherwise (`where`: the run's placement); nothing for a model with
    neither."""
    placed = [table.where() for table in _built_tables(items)]
    replicated = replicated_embeddings(items)
    if not replicated:
        return placed
    return placed + [
        {
            "name": layer.name,
            "rows": layer.input_dim,
            "dim": layer.output_dim,
            "optimizer": None,  # the Update's
            "split": where.table_split(layer.input_dim, placed=False),
            "blocks": [[0, layer.input_dim]],
        }
        for layer in replicated
    ]


def replicated_embeddings(items: object) -> list[keras.layers.Embedding]:
    """The built plain `keras.layers.Embedding` layers of the Keras models among `items` (a
    definition's checkpoint items): whole on every replica."""
    return [
        layer
        for model in _models(items)
        for layer in keras_private.embedding_layers(model)
        if layer.built
    ]


def split_over_workers(items: object) -> list[EmbeddingTable]:
    """The built tables of the Keras models among `items` (a definition's checkpoint items)
    whose rows are split over several workers, each holding only its own."""
    return [
        table
        for table in _built_tables(items)
        if isinstance(table.embeddings, worker_blocks.WorkerBlocks)
    ]


def _built_tables(items: object) -> list[EmbeddingTable]:
    return [table for model in _models(items) for table in tables_in(model) if table.built]


def _models(items: object) -> list[keras.Model]:
    values = items.values() if isinstance(items, dict) else ()
    return [model for model in values if isinstance(model, keras.Model)]


# The initial values are made in a function, not op by op, whose temporaries stay inside it:
# a server making a 2M x 64 shard and its accumulator (976 MiB) grew by 1,008 MiB so, and by
# 1,528 MiB op by op, the CPU allocator keeping the freed buffers (benchmarks/sharded_tables.py,
# oneDNN on, TF 2.21).
@tf.function(autograph=False)
def _filled_rows(shape: tuple[int, ...], value: tf.Tensor) -> tf.Tensor:
    return tf.fill(shape, value)


def _checked_ids(initial_ids, rows: int):
    """The int64 id of each of the `rows` rows (`id_rows.row_id_numbers`).

    Raises:
        ValueError: ids that are not one a row.
    """
    numbers = id_rows.row_id_numbers(initial_ids)
    if len(numbers) != rows:
        raise ValueError(
            f"EmbeddingTable(rows={rows}, initial_ids=...) got {len(numbers)} ids; pass one id "
            "for each row."
        )
    return numbers
