"""The embedding table of an example model: a keras Embedding, or a `loops.EmbeddingTable`
placed by the strategy when the model is given an optimizer for its tables."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import keras

# () -> a table's own optimizer (Adagrad, loops.RowwiseAdagrad or SGD: an exact row update).
OptimizerFn = Callable[[], keras.optimizers.Optimizer]


def embedding_table(
    rows: int,
    width: int,
    initializer: Any,
    name: str,
    table_optimizer_fn: OptimizerFn | None,
    dynamic: Mapping[str, Any] | None = None,
    initial_ids: Any = None,
) -> keras.layers.Layer:
    """A keras Embedding of `initializer`'s values, or with `table_optimizer_fn` a
    `loops.EmbeddingTable` of that optimizer, placed by the strategy (split over parameter
    servers or over synchronous replicas, whole on one device), seeded by the initializer's
    seed (its values then a function of that seed and the row alone). With `dynamic` (its
    capacity and `loops.AdmissionPolicy` keys) a `loops.DynamicTable` of raw int64 ids, of
    that optimizer, else of the Update's (which must have a row rule: Adagrad, SGD, ...).
    With `initial_ids` (the raw id of each row) a static table's rows start by id
    (`loops.initial_rows` of the initializer's seed), as a dynamic table's admitted ids do."""
    if dynamic is not None:
        import loops

        policy = {key: value for key, value in dynamic.items() if key != "capacity"}
        optimizer = table_optimizer_fn() if table_optimizer_fn is not None else "update"
        return loops.DynamicTable(
            dynamic["capacity"], width, optimizer, seed=initializer.seed, name=name, **policy
        )
    import loops

    if table_optimizer_fn is None:
        if initial_ids is not None:
            initializer = keras.initializers.Constant(
                _rows_by_id(initializer.seed, initial_ids, width)
            )
        return keras.layers.Embedding(rows, width, embeddings_initializer=initializer, name=name)
    return loops.EmbeddingTable(
        rows, width, table_optimizer_fn(), seed=initializer.seed, name=name, initial_ids=initial_ids
    )


def _rows_by_id(seed: int, initial_ids: Any, width: int):
    """float32 [rows, width]: each row's `loops.initial_rows` by the id it holds."""
    import tensorflow as tf

    import loops
    from loops.tables import id_rows

    numbers = tf.constant(id_rows.row_id_numbers(initial_ids))
    return loops.initial_rows(seed, numbers, width).numpy()
