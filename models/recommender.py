"""Keras models for recommenders: an id tower (user or item ids in, embeddings out) and a rating
model (user and item ids in, one score a pair out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np

from loops_models.tables import OptimizerFn, embedding_table


def _embedding_initializer(seed: int, index: int):
    # Explicit per-layer seeds: the initial weights are a function of `seed` alone, so
    # runs on 1 and N replicas start from the same point.
    return keras.initializers.RandomNormal(stddev=0.05, seed=seed * 1000 + index)


def _dense_initializer(seed: int, index: int):
    return keras.initializers.GlorotUniform(seed=seed * 1000 + index)


class FeatureLookup(keras.layers.Layer):
    """Looks up fixed feature rows by id: a non-trainable table, saved with the model."""

    def __init__(self, table: np.ndarray, **kwargs):
        super().__init__(**kwargs)
        table = np.asarray(table, np.float32)
        if table.ndim != 2:
            raise ValueError(
                f"features must be a [num_ids, num_features] table, got shape {table.shape}."
            )
        self.table = self.add_weight(
            shape=table.shape,
            initializer=keras.initializers.Constant(table),
            trainable=False,
            name="features",
        )

    def call(self, ids):
        return keras.ops.take(self.table, ids, axis=0)


class RawIds(keras.layers.Layer):
    """A log's indices (int32) -> the raw ids they stand for, as int64 (strings hashed by
    `loops.tables.id_rows.string_numbers`, as a dynamic table of strings keys them): a
    constant of the model, not a weight, so what a checkpoint holds keys rows by raw id
    whatever the log's vocabulary."""

    def __init__(self, raw_ids: Any, **kwargs):
        super().__init__(**kwargs)
        from loops.tables import id_rows

        self.numbers = id_rows.row_id_numbers(raw_ids)

    def call(self, indices):
        import tensorflow as tf

        return tf.gather(tf.constant(self.numbers), indices)


def _table(
    rows: int,
    width: int,
    seed: int,
    index: int,
    name: str,
    table_optimizer_fn: OptimizerFn | None,
    ids: Any,
    dynamic: Mapping[str, Any] | None,
):
    """A static table of `rows` rows (rows by id with `ids`) looked up by a log's indices, or
    with `dynamic` a `loops.DynamicTable` of that capacity and `loops.AdmissionPolicy` (the
    capacity 0: `rows`) looked up by the raw ids (`_keys`)."""
    initializer = _embedding_initializer(seed, index)
    if dynamic is None:
        return embedding_table(rows, width, initializer, name, table_optimizer_fn, initial_ids=ids)
    dynamic = {**dynamic, "capacity": dynamic["capacity"] or rows}
    return embedding_table(rows, width, initializer, name, table_optimizer_fn, dynamic)


def _keys(indices, ids: Any, dynamic: Mapping[str, Any] | None, name: str):
    """What a table of `_table` is looked up by: the indices, or a dynamic table's raw ids."""
    if dynamic is None:
        return indices
    if ids is None:
        raise ValueError(f"the dynamic tables of {name!r} need the log's raw ids (ids=...).")
    return RawIds(ids, name=f"{name}_raw_ids")(indices)


def history_table(users: np.ndarray, items: np.ndarray, num_users: int, num_items: int):
    """float32 [num_users, num_items]: row u holds 1 / sqrt(|N(u)|) at each item of N(u), the
    items user u interacted with (SVD++'s normalization), zeros elsewhere and for a user with
    none. A dense table: for catalogues of thousands (MovieLens-100K's takes 6 MB)."""
    table = np.zeros((num_users, num_items), np.float32)
    table[np.asarray(users), np.asarray(items)] = 1.0
    counts = table.sum(axis=1, keepdims=True)
    return table / np.sqrt(np.maximum(counts, 1.0))


def id_tower(
    *,
    num_ids: int,
    embedding_dim: int = 32,
    hidden_units: Sequence[int] = (),
    features: np.ndarray | None = None,
    normalize: bool = True,
    seed: int = 0,
    name: str = "tower",
    table_optimizer_fn: OptimizerFn | None = None,
    ids: Any = None,
    dynamic: Mapping[str, Any] | None = None,
) -> keras.Model:
    """int32 ids [batch] -> float32 embeddings [batch, embedding_dim].

    An id's embedding row, beside its `features` row when given (a fixed
    [num_ids, num_features] table), through `hidden_units` relu layers and a
    linear layer back to `embedding_dim` (none without hidden units and
    features), unit length when `normalize`. The table is a keras Embedding, or
    with `table_optimizer_fn` a `loops.EmbeddingTable` placed by the strategy
    (`loops_models.tables`). `ids` (the raw id of each of the `num_ids` indices) starts
    each row by its id (`loops.initial_rows`); with `dynamic` as well (a capacity, 0 for
    `num_ids`, and `loops.AdmissionPolicy` keys) the table is a `loops.DynamicTable` over
    those raw ids.
    """
    indices = keras.Input((), dtype="int32", name=f"{name}_ids")
    table = _table(
        num_ids, embedding_dim, seed, 0, f"{name}_table", table_optimizer_fn, ids, dynamic
    )
    parts = [table(_keys(indices, ids, dynamic, f"{name}_table"))]
    if features is not None:
        parts.append(FeatureLookup(features, name=f"{name}_features")(indices))
    hidden = parts[0] if len(parts) == 1 else keras.layers.Concatenate()(parts)
    for index, units in enumerate(hidden_units):
        hidden = keras.layers.Dense(
            units, activation="relu", kernel_initializer=_dense_initializer(seed, index + 1)
        )(hidden)
    if hidden_units or features is not None:
        hidden = keras.layers.Dense(
            embedding_dim, kernel_initializer=_dense_initializer(seed, len(hidden_units) + 1)
        )(hidden)
    if normalize:
        hidden = keras.layers.UnitNormalization()(hidden)
    return keras.Model(indices, hidden, name=name)


class _PairScore(keras.layers.Layer):
    """The global bias plus the user's and the item's biases plus their embeddings' dot product
    (the factorization machine's pairwise term for two fields) plus the MLP's output."""

    def __init__(self, initial_bias: float, **kwargs):
        super().__init__(**kwargs)
        self.initial_bias = float(initial_bias)

    def build(self, input_shape):
        self.bias = self.add_weight(
            shape=(), initializer=keras.initializers.Constant(self.initial_bias), name="bias"
        )

    def call(self, inputs):
        user, item, user_bias, item_bias, deep = inputs
        dot = keras.ops.sum(user * item, axis=-1)
        return self.bias + user_bias[:, 0] + item_bias[:, 0] + dot + deep[:, 0]


def rating_model(
    *,
    num_users: int,
    num_items: int,
    embedding_dim: int = 32,
    hidden_units: Sequence[int] = (64,),
    initial_bias: float = 0.0,
    l2: float = 0.0,
    user_history: np.ndarray | None = None,
    seed: int = 0,
    table_optimizer_fn: OptimizerFn | None = None,
    user_ids: Any = None,
    item_ids: Any = None,
    dynamic: Mapping[str, Any] | None = None,
) -> keras.Model:
    """(user ids [batch], item ids [batch]) int32 -> one score a pair [batch] (a rating, or a
    click's logit): biases, the embeddings' dot product and an MLP over both embeddings.

    With `user_history` (a fixed [num_users, num_items] table, `history_table`)
    the user's vector adds SVD++'s implicit term: the history row times a
    trained [num_items, embedding_dim] matrix, the normalized sum of the item
    factors of the items the user rated (penalized by `l2` beside the rows).

    `initial_bias` starts the global bias (e.g. the mean training rating).
    With `l2` > 0 the model gives (scores, penalties): each pair's penalty is
    l2 times the sum of squares of the rows it looked up (both embeddings and
    both biases), the regularization of matrix factorization trained by SGD,
    which `loops.RatingLoop` adds to the pair's loss; only those rows' gradients
    are touched, and it is per pair, so exact on any replica count.

    The four tables are keras Embeddings, or with `table_optimizer_fn`
    `loops.EmbeddingTable`s placed by the strategy (`loops_models.tables`); with
    `user_ids` and `item_ids` (the raw id of each index) their rows start by id, and with
    `dynamic` as well (as `id_tower`'s) they are `loops.DynamicTable`s over the raw ids.
    """
    users = keras.Input((), dtype="int32", name="users")
    items = keras.Input((), dtype="int32", name="items")
    # Each side's raw ids made once, for its embedding and its bias.
    user_keys = _keys(users, user_ids, dynamic, "user_table")
    item_keys = _keys(items, item_ids, dynamic, "item_table")
    shapes = {
        "user_table": (num_users, embedding_dim, user_keys, user_ids),
        "item_table": (num_items, embedding_dim, item_keys, item_ids),
        "user_bias": (num_users, 1, user_keys, user_ids),
        "item_bias": (num_items, 1, item_keys, item_ids),
    }
    looked_up = []
    for index, (name, (count, width, keys, ids)) in enumerate(shapes.items()):
        table = _table(count, width, seed, index, name, table_optimizer_fn, ids, dynamic)
        looked_up.append(table(keys))
    user, item, user_bias, item_bias = looked_up
    if user_history is not None:
        implicit = keras.layers.Dense(
            embedding_dim,
            use_bias=False,
            kernel_initializer=_embedding_initializer(seed, 4),
            name="implicit_factors",
        )(FeatureLookup(user_history, name="user_history")(users))
        looked_up.append(implicit)
        user = keras.layers.Add()([user, implicit])
    deep = keras.layers.Concatenate()([user, item])
    for index, units in enumerate(hidden_units):
        deep = keras.layers.Dense(
            units, activation="relu", kernel_initializer=_dense_initializer(seed, 10 + index)
        )(deep)
    deep = keras.layers.Dense(1, kernel_initializer="zeros")(deep)
    score = _PairScore(initial_bias, name="pair_score")([user, item, user_bias, item_bias, deep])
    if not l2:
        return keras.Model([users, items], score, name="rating")
    squares = [keras.ops.sum(keras.ops.square(rows), axis=-1) for rows in looked_up]
    penalty = keras.layers.Lambda(lambda parts: l2 * keras.ops.sum(keras.ops.stack(parts), 0))(
        squares
    )
    return keras.Model([users, items], [score, penalty], name="rating")
