"""How a `loops.Update` trains embedding tables: their gradients kept sparse where the
optimizer has an exact row update, and each variable applied by its group's optimizer.

A table is a variable whose gradient comes out of the tape as a
`tf.IndexedSlices` (a `keras.layers.Embedding`, any `tf.gather` of a
variable): found when the step is traced, with no special layer. Its
optimizer is the Update's `table_optimizer`, or its `optimizer` when none is
given. Where that optimizer has a row update (`loops.core.row_updates`: SGD
without momentum, Adagrad; exact) the gradient stays sparse end to end:
duplicate ids summed, rows gathered across replicas, only those rows (and
their slots) read and written. Otherwise the table is trained densely, as
before, with a note once that says why (for a table of `NOTE_FROM_ROWS` rows or more).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from loops.core import row_updates, table_rows
from loops.core.gradients import sum_over_replicas

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
    """

    def __init__(
        self,
        optimizer: Any,
        table_optimizer: Any | None,
        *,
        averaged: bool,
        max_lookups: int | None = None,
    ):
        self.optimizer = optimizer
        self.table_optimizer = optimizer if table_optimizer is None else table_optimizer
        self.averaged = averaged
        self.max_lookups = max_lookups
        # Whether the tables' gradients stay sparse (their optimizer has a row update).
        self.sparse = row_updates.why_dense(self.table_optimizer) is None
        self.indices: frozenset[int] = frozenset()  # of the tables among the variables, once traced
        self._noted: set[str] = set()
        # Whether the gradients reach `prepared` dense from `densified` (the exact
        # parameter-server mode), its tables noted there.
        self.sent_dense = False

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
        tables = frozenset(
            index for index, g in enumerate(gradients) if isinstance(g, tf.IndexedSlices)
        )
        if not self.sent_dense:  # else dense from `densified`, which noted the tables
            self.indices = tables
        reason = row_updates.why_dense(self.table_optimizer)
        prepared = []
        for gradient, variable in zip(gradients, variables):
            if not isinstance(gradient, tf.IndexedSlices):
                prepared.append(gradient)
            elif reason is None:
                self._check_not_averaged(variable)
                capacity = table_rows.capacity(gradient, variable.shape[0], self.max_lookups)
                rows = table_rows.unique_rows(gradient)
                prepared.append(table_rows.rows_over_replicas(rows, capacity))
            else:
                self._note_dense(variable, reason)
                prepared.append(tf.convert_to_tensor(gradient))
        return prepared

    def densified(self, gradients: Sequence[Any]) -> list[Any]:
        """Every gradient dense, the tables among them noted for `optimizer_of`: the
        exact parameter-server mode sends a slice's gradients to the chief so, and the
        chief's `prepared` then finds no IndexedSlices (the update equals the sparse one:
        SGD and Adagrad leave a row with a zero gradient as it is)."""
        self.sent_dense = True
        self.indices = frozenset(
            index for index, g in enumerate(gradients) if isinstance(g, tf.IndexedSlices)
        )
        return [
            tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients
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
        groups: dict[int, tuple[Any, list, list]] = {}
        for index, (gradient, variable) in enumerate(zip(gradients, variables)):
            optimizer = self.optimizer_of(index)
            _, dense, rows = groups.setdefault(id(optimizer), (optimizer, [], []))
            if isinstance(gradient, tf.IndexedSlices):
                rows.append((gradient, variable))
            else:
                if dense_share is not None and gradient is not None:
                    gradient = gradient * dense_share
                dense.append((gradient, variable))
        for optimizer, dense, rows in groups.values():
            # Rows first: they read the rate of this step, before apply_gradients counts it.
            if rows:
                row_updates.apply_table_rows(optimizer, rows, count_step=not dense)
            if dense:
                optimizer.apply_gradients(dense)

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
            "batch, train the tables with keras.optimizers.Adagrad (or SGD without momentum): "
            "loops.Update(..., table_optimizer=keras.optimizers.Adagrad(...)).",
            stacklevel=2,
        )


def built_table_optimizer(optimizer_fn: Any | None, model: Any) -> Any | None:
    """`optimizer_fn()` built on every `keras.layers.Embedding` table of `model` (a definition's
    `table_optimizer`, e.g. Adagrad: sparse and exact), or None without a function."""
    if optimizer_fn is None:
        return None
    from loops.core import keras_private

    optimizer = optimizer_fn()
    optimizer.build([layer.embeddings for layer in keras_private.embedding_layers(model)])
    return optimizer
