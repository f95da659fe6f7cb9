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
) -> keras.layers.Layer:
    """A keras Embedding of `initializer`'s values, or with `table_optimizer_fn` a
    `loops.EmbeddingTable` of that optimizer, placed by the strategy (split over parameter
    servers or over synchronous replicas, whole on one device), seeded by the initializer's
    seed (its values then a function of that seed and the row alone). With `dynamic` (its
    capacity and `loops.AdmissionPolicy` keys) a `loops.DynamicTable` of raw int64 ids, of
    that optimizer, else of the Update's (which must have a row rule: Adagrad, SGD, ...)."""
    if dynamic is not None:
        import loops

        policy = {key: value for key, value in dynamic.items() if key != "capacity"}
        optimizer = table_optimizer_fn() if table_optimizer_fn is not None else "update"
        return loops.DynamicTable(
            dynamic["capacity"], width, optimizer, seed=initializer.seed, name=name, **policy
        )
    if table_optimizer_fn is None:
        return keras.layers.Embedding(rows, width, embeddings_initializer=initializer, name=name)
    import loops

    return loops.EmbeddingTable(rows, width, table_optimizer_fn(), seed=initializer.seed, name=name)
