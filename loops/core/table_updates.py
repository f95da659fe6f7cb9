"""How a `loops.Update` trains embedding tables: their gradients kept sparse where the
optimizer has an exact row update, and each variable applied by its group's optimizer.

A table is a variable whose gradient comes out of the tape as a
`tf.IndexedSlices` (a `keras.layers.Embedding`, any `tf.gather` of a
variable): found when the step is traced, with no special layer. Its
optimizer is the Update's `table_optimizer`, or its `optimizer` when none is
given. Where that optimizer has a row update (`loops.tables.row_updates`: SGD
without momentum, Adagrad; exact) the gradient stays sparse end to end:
duplicate ids summed, rows gathered across replicas, only those rows (and
their slots) read and written. Otherwise the table is trained densely, as
before, with a note once that says why (for a table of `NOTE_FROM_ROWS` rows or more).

A model's `loops.EmbeddingTable` layers are tables of their own: their shards'
gradients summed by row and applied by each layer's `apply_gradients` with its
own row optimizer and slots (split as the table is), on one replica, under
parameter servers, or split over the replicas of a MirroredStrategy, where
each replica applies its own block's rows, already summed over the replicas
by the lookup's collectives (`loops.tables.table_blocks`), and the blocks'
squares are summed over the replicas for clipping and health
(`TableGradients.global_norm`); `check_own_tables` refuses the rest (central
storage, several workers) before any step.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from loops import keras_private
from loops.core.gradients import sum_over_replicas
from loops.tables import embedding_tables, row_updates, table_rows
from loops.vocabulary.whole_numbers import check_whole

# Tables of fewer rows are trained densely without a note: their dense update costs little
# (the LM's 256 byte embeddings).
NOTE_FROM_ROWS = 10_000


def _name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


class TableGradients:
    """The tables among one Update's variables, and the application of its gradients.

    Args:
        optimizer: the Update's optimizer (of every variable that is not a table).
        table_optimizer: the optimizer of the tables; None: `optimizer`.
        averaged: the Update keeps a moving average of its variables, which
            would read every row of a table each step: refused for a sparse table.
        max_lookups: the most ids one replica looks up in one table in one
            step, where that is not static (`table_rows.capacity`).
        own_tables: the model's `loops.EmbeddingTable` layers (built, checked
            by `check_own_tables`), each trained by its own optimizer; one split over
            the replicas trains block by block, each on its own replica.
    """

    def __init__(
        self,
        optimizer: Any,
        table_optimizer: Any | None,
        *,
        averaged: bool,
        max_lookups: int | None = None,
        own_tables: Sequence[Any] = (),
    ):
        self.optimizer = optimizer
        self.own_tables = list(own_tables)
        self.table_optimizer = optimizer if table_optimizer is None else table_optimizer
        self.averaged = averaged
        self.max_lookups = max_lookups
        # The lookups a replica's batch bounds, set by the Update as it traces a step.
        self.derived_lookups: int | None = None
        # Whether the tables' gradients stay sparse (their optimizer has a row update).
        self.sparse = row_updates.why_dense(self.table_optimizer) is None
        self.indices: frozenset[int] = frozenset()  # of the tables among the variables, once traced
        self._noted: set[str] = set()

    def optimizer_of(self, index: int) -> Any:
        """The optimizer of the Update's variable number `index`."""
        return self.table_optimizer if index in self.indices else self.optimizer

    def prepared(self, gradients: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """Each table's gradient as its rows over replicas (or dense), the rest as they are.

        Call in replica context. A table with a row update gets
        `table_rows.rows_over_replicas(unique_rows(...))`: the same on every
        replica, already summed. Any other IndexedSlices is made dense.

        Raises:
            ValueError: a sparse table in an Update that averages its weights.
        """
        own = self._own_shards()
        tables = frozenset(
            index
            for index, (g, v) in enumerate(zip(gradients, variables))
            if isinstance(g, tf.IndexedSlices) and id(v) not in own
        )
        self.indices = tables
        reason = row_updates.why_dense(self.table_optimizer)
        prepared = []
        for gradient, variable in zip(gradients, variables):
            if id(variable) in own:
                # One replica, or this replica's own block of a split table (the others'
                # are None): its rows are the whole step's, summed by id.
                prepared.append(
                    None if gradient is None else table_rows.unique_rows(_rows(gradient))
                )
            elif not isinstance(gradient, tf.IndexedSlices):
                prepared.append(gradient)
            elif reason is None:
                self._check_not_averaged(variable)
                capacity = table_rows.capacity(
                    gradient, variable.shape[0], self.max_lookups, self.derived_lookups
                )
                rows = table_rows.unique_rows(gradient)
                prepared.append(table_rows.rows_over_replicas(rows, capacity))
            else:
                self._note_dense(variable, reason)
                prepared.append(tf.convert_to_tensor(gradient))
        return prepared

    def global_norm(self, summed: Sequence[Any], variables: Sequence[Any]) -> tf.Tensor:
        """The global norm of the replicas' summed gradient (`summed`), the same on every
        replica; call in replica context.

        A table split over the replicas has each block's gradient on its own
        replica alone (None on the others): the blocks' sums of squares are
        summed over the replicas, so each row counts once, as in the dense
        gradient's norm.
        """
        blocks = self._block_shards()
        if not blocks:
            return tf.linalg.global_norm(summed)
        shared = [g for g, v in zip(summed, variables) if id(v) not in blocks]
        own = [g for g, v in zip(summed, variables) if id(v) in blocks]
        context = tf.distribute.get_replica_context()
        own_squares = context.all_reduce(tf.distribute.ReduceOp.SUM, _sum_of_squares(own))
        return tf.sqrt(_sum_of_squares(shared) + own_squares)

    def sent_rows(self, gradients: Sequence[Any]) -> list[Any]:
        """Each table's gradient as its rows, each id once (`table_rows.unique_rows`), the
        rest as they are: what the exact parameter-server mode sends the chief from a
        slice, so that the transfer follows the slice's ids, not the table's rows. The
        chief sums the slices' rows and `prepared` trains them as on one replica."""
        return [
            table_rows.unique_rows(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients
        ]

    def summed(self, gradients: Sequence[Any]) -> list[Any]:
        """The replicas' sum of each gradient; table rows are already one (replica context)."""
        dense = sum_over_replicas(
            [None if isinstance(g, tf.IndexedSlices) else g for g in gradients]
        )
        return [g if isinstance(g, tf.IndexedSlices) else s for g, s in zip(gradients, dense)]

    def apply(
        self, gradients: Sequence[Any], variables: Sequence[Any], *, dense_share: float | None
    ) -> None:
        """Applies every gradient with its variable's optimizer; call in replica context.

        Args:
            gradients: from `prepared` (per replica: the optimizers sum the
                dense ones), or from `summed` and clipped.
            dense_share: None for per-replica gradients; for summed ones
                1 / replicas, which the dense gradients are multiplied by,
                since each optimizer sums the replicas' again.
        """
        own = self._own_shards()
        own_gradients = {}
        groups: dict[int, tuple[Any, list, list]] = {}
        for index, (gradient, variable) in enumerate(zip(gradients, variables)):
            if id(variable) in own:
                own_gradients[id(variable)] = gradient
                continue
            optimizer = self.optimizer_of(index)
            _, dense, rows = groups.setdefault(id(optimizer), (optimizer, [], []))
            if isinstance(gradient, tf.IndexedSlices):
                rows.append((gradient, variable))
            else:
                if dense_share is not None and gradient is not None:
                    gradient = gradient * dense_share
                dense.append((gradient, variable))
        self._apply_own_tables(own_gradients)
        for optimizer, dense, rows in groups.values():
            # Rows first: they read the rate of this step, before apply_gradients counts it.
            if rows:
                row_updates.apply_table_rows(optimizer, rows, count_step=not dense)
            if dense:
                optimizer.apply_gradients(dense)
        for optimizer in {
            id(layer.optimizer): layer.optimizer for layer in self.own_tables
        }.values():
            if id(optimizer) not in groups:  # no group counted this step of its schedule
                optimizer.iterations.assign_add(1)

    def _apply_own_tables(self, own_gradients: dict[int, Any]) -> None:
        """Each EmbeddingTable's rows, by its own optimizer, at this step's rate."""
        for layer in self.own_tables:
            layer.apply_gradients([own_gradients.get(id(shard)) for shard in layer.shards])

    def _block_shards(self) -> set[int]:
        """The ids of the shards of tables split over this step's replicas (one block each)."""
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync < 2:
            return set()
        return {
            id(shard)
            for layer in self.own_tables
            if layer.split_over_replicas
            for shard in layer.shards
        }

    def _own_shards(self) -> dict[int, Any]:
        """The EmbeddingTables' shards, by id (a variable is not hashable), and each's layer."""
        return {id(shard): layer for layer in self.own_tables for shard in layer.shards}

    def _check_not_averaged(self, variable: Any) -> None:
        if self.averaged:
            raise ValueError(
                f"ema_decay keeps a moving average of every weight of this loops.Update, and "
                f"{_name(variable)} is an embedding table trained sparsely: averaging it "
                f"would read and write all its {variable.shape[0]} rows each step, the cost "
                "the sparse update avoids. Make this Update with average=False (train the "
                "tables in an Update of their own to average the rest), or set ema_decay=None."
            )

    def _note_dense(self, variable: Any, reason: str) -> None:
        name = _name(variable)
        if name in self._noted or variable.shape[0] < NOTE_FROM_ROWS:
            return
        self._noted.add(name)
        warnings.warn(
            f"note: loops.Update trains the embedding table {name} ({variable.shape[0]} rows) "
            f"densely, every row each step: {reason}. For a step whose cost follows the "
            "batch, train the tables with keras.optimizers.Adagrad (or SGD without momentum, "
            "or loops.LazyAdam, Adam on the rows a step touches): "
            "loops.Update(..., table_optimizer=keras.optimizers.Adagrad(...)).",
            stacklevel=2,
        )


def update_tables(
    trained: Any,
    optimizer: Any,
    table_optimizer: Any | None,
    *,
    replicas: int,
    averaged: bool,
    max_lookups: int | None,
) -> TableGradients:
    """The tables of an Update of `trained` (`TableGradients`), checked before any step.

    Finds the model's `loops.EmbeddingTable` layers (their variables are not
    Keras weights) and refuses the ones it cannot train (`check_own_tables`);
    where the tables train sparsely, the model's `keras.layers.Embedding`
    layers look their rows up with a sparse read.
    """
    is_model = isinstance(trained, keras.Model)
    own_tables = embedding_tables.tables_in(trained) if is_model else []
    _give_optimizer(own_tables, table_optimizer or optimizer)
    check_own_tables(own_tables, replicas, table_optimizer, averaged=averaged)
    if max_lookups is not None:
        check_whole("max_table_lookups", max_lookups, note=" (ids a replica looks up)")
        for table in own_tables:  # a table split over the replicas exchanges its ids too
            table.bound_lookups(max_lookups)
    tables = TableGradients(
        optimizer,
        table_optimizer,
        averaged=averaged,
        max_lookups=max_lookups,
        own_tables=own_tables,
    )
    if is_model and tables.sparse:
        for layer in keras_private.embedding_layers(trained):
            keras_private.read_rows_sparsely(layer, table_rows.lookup)
    return tables


def _give_optimizer(tables: Sequence[Any], optimizer: Any) -> None:
    """Gives `optimizer` (the Update's table optimizer, else its optimizer) to each built
    table made to train with the optimizer of its Update (`EmbeddingTable(optimizer=
    "update")`, a `loops.TablePlan`'s), with its slots.

    Raises:
        ValueError: an optimizer without an exact row update, with the fix.
    """
    for table in tables:
        if not table.built or table.optimizer_taken:
            continue
        reason = row_updates.why_dense(optimizer)
        if reason is not None:
            raise ValueError(
                f"loops.Update trains the EmbeddingTable {table.name!r} ({table.rows} rows) by "
                f"rows with the Update's table optimizer, its optimizer when it has none, and "
                f"{type(optimizer).__name__} has no exact row update ({reason}): pass "
                "table_optimizer=keras.optimizers.Adagrad(...) (or SGD without momentum) to "
                "the Update, or give the table an optimizer of its own "
                "(loops.TablePlan(optimizer=...))."
            )
        table.take_optimizer(optimizer)


def _sum_of_squares(gradients: Sequence[Any]) -> tf.Tensor:
    """The sum of the squares of every value of `gradients` (None ones left out), in float32."""
    total = tf.constant(0.0)
    for gradient in gradients:
        if gradient is None:
            continue
        values = gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
        total += tf.reduce_sum(tf.square(tf.cast(values, tf.float32)))
    return total


def _rows(gradient: Any) -> tf.IndexedSlices:
    """A table shard's gradient as rows; a dense one (from a caller's own sum) as all of them."""
    if isinstance(gradient, tf.IndexedSlices):
        return gradient
    gradient = tf.convert_to_tensor(gradient)
    return tf.IndexedSlices(gradient, tf.range(tf.shape(gradient)[0]), tf.shape(gradient))


def check_own_tables(
    tables: Sequence[Any],
    replicas: int,
    table_optimizer: Any | None,
    *,
    averaged: bool,
) -> None:
    """Refuses, with the fix, a model's `loops.EmbeddingTable` that an Update cannot train.

    Args:
        tables: the model's EmbeddingTable layers (`embedding_tables.tables_in`).
        replicas: the strategy's replicas in sync.
        table_optimizer: the Update's `table_optimizer`.
        averaged: the Update keeps a moving average of its variables.
    """
    for table in tables:
        name = f"EmbeddingTable {table.name!r} ({table.rows} rows)"
        if not table.built:
            raise ValueError(
                f"loops.Update trains the {name} of its model, which is not built yet: build "
                "the model (give it a keras.Input, or call it on a batch) before the Update."
            )
        if replicas > 1 and not table.split_over_replicas:
            raise ValueError(
                f"loops.Update cannot train the {name} on {replicas} synchronous replicas of "
                "this strategy: it updates one copy of its rows (one process, one_device or "
                "parameter_server) or splits them over the replicas of a MirroredStrategy "
                "or a MultiWorkerMirroredStrategy. Use keras.layers.Embedding(rows, dim) "
                "there: through "
                "loops.Update it trains sparsely and exactly on any replica count "
                "(table_optimizer=keras.optimizers.Adagrad(...))."
            )
        if table_optimizer is not None and table_optimizer is not table.optimizer:
            raise ValueError(
                f"loops.Update(table_optimizer={type(table_optimizer).__name__}) would train "
                f"the {name}, which trains with its own optimizer "
                f"(EmbeddingTable(optimizer=...)), whose slots are split as the table: pass "
                "that same optimizer as table_optimizer, or leave table_optimizer=None "
                "(each EmbeddingTable then trains with its own optimizer)."
            )
        if averaged:
            raise ValueError(
                f"ema_decay keeps a moving average of every weight of this loops.Update, and "
                f"its model's {name} is trained by rows: averaging it would read and write "
                "all its rows each step. Make this Update with average=False, or set "
                "ema_decay=None."
            )


def built_table_optimizer(optimizer_fn: Any | None, model: Any) -> Any | None:
    """`optimizer_fn()` built on every `keras.layers.Embedding` table of `model` (a definition's
    `table_optimizer`, e.g. Adagrad: sparse and exact), or None without a function."""
    if optimizer_fn is None:
        return None
    optimizer = optimizer_fn()
    optimizer.build([layer.embeddings for layer in keras_private.embedding_layers(model)])
    return optimizer
