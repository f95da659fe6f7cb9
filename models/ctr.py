"""Keras models for click-through rates: wide & deep, DCN-v2 and DLRM over one feature description
(numeric, categorical and multi-hot columns), each a dict of column tensors -> one logit a row.

The model's inputs, by column name: a numeric column float32 [batch] (already
normalized: this stage does no normalization of its own), a categorical column
int32 ids [batch] in 0..cardinality - 1, a multi-hot column int32 ids [batch,
length] padded with -1 (`PAD_ID`). A bag's valid ids alone are gathered from
its table and pooled by sum or mean; an empty bag (all padding) pools to zeros,
and the table's gradient touches only the rows looked up.

Each builder's tables are `keras.layers.Embedding`s, trained by the loop's
optimizers, unless `table_optimizer_fn` is given: then each is a
`loops.EmbeddingTable` with an optimizer of its own from that function, placed
by the strategy (split over parameter servers or over the replicas of a
MirroredStrategy, whole on one device), its initial values a function of the
seed and the row alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from loops_models.tables import OptimizerFn, embedding_table

PAD_ID = -1
POOLINGS = ("mean", "sum")

# () -> a new Keras optimizer (a table's own).


class MultiHot(NamedTuple):
    """A multi-hot column: ids 0..cardinality - 1, a bag of any length pooled by `pooling`."""

    cardinality: int
    pooling: str = "mean"


@dataclass(frozen=True)
class CTRFeatures:
    """The columns a model reads, by kind: numeric names, categorical name -> cardinality,
    multi-hot name -> `MultiHot` (or its cardinality alone: pooled by mean).

    Raises:
        ValueError: naming the column: a cardinality that is not a whole number >= 1,
            an unknown pooling, a column named twice, or no column at all.
    """

    numeric: Sequence[str] = ()
    categorical: Mapping[str, int] = field(default_factory=dict)
    multi_hot: Mapping[str, MultiHot | int] = field(default_factory=dict)
    # Id columns whose table is a `loops.DynamicTable` of raw int64 ids: name -> its capacity
    # and `loops.AdmissionPolicy` keys ({"capacity": N, "admit_after": K, ...}).
    dynamic: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        numeric = (self.numeric,) if isinstance(self.numeric, str) else tuple(self.numeric)
        bags = {
            name: MultiHot(*bag) if isinstance(bag, tuple) else MultiHot(bag)
            for name, bag in self.multi_hot.items()
        }
        object.__setattr__(self, "numeric", numeric)
        object.__setattr__(self, "categorical", dict(self.categorical))
        object.__setattr__(self, "multi_hot", bags)
        object.__setattr__(self, "dynamic", {k: dict(v) for k, v in self.dynamic.items()})
        _check_columns(self)
        unknown = sorted(set(self.dynamic) - set(self.id_columns))
        if unknown:
            raise ValueError(
                f"Dynamic columns {unknown} are no categorical or multi-hot column; make each "
                "dynamic table an id column's."
            )

    @property
    def id_columns(self) -> list[str]:
        """The categorical then the multi-hot columns: those with an embedding table."""
        return [*self.categorical, *self.multi_hot]


def _check_columns(features: CTRFeatures) -> None:
    kinds: dict[str, str] = {}
    named = [(name, "numeric") for name in features.numeric]
    named += [(name, "categorical") for name in features.categorical]
    named += [(name, "multi-hot") for name in features.multi_hot]
    for name, kind in named:
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {kind} column is named {name!r}; name each column by a string.")
        if name in kinds:
            raise ValueError(
                f"Column {name!r} is named twice ({kinds[name]} and {kind}); give each column "
                "one kind."
            )
        kinds[name] = kind
    if not kinds:
        raise ValueError("The feature description has no column; name at least one column.")
    cardinalities = dict(features.categorical)
    cardinalities.update({name: bag.cardinality for name, bag in features.multi_hot.items()})
    for name, cardinality in cardinalities.items():
        if isinstance(cardinality, bool) or not isinstance(cardinality, int | np.integer):
            cardinality = repr(cardinality)
        elif cardinality >= 1:
            continue
        raise ValueError(
            f"Column {name!r} has cardinality {cardinality}; give it a whole number >= 1 "
            "(its ids are 0..cardinality - 1)."
        )
    for name, bag in features.multi_hot.items():
        if bag.pooling not in POOLINGS:
            raise ValueError(
                f"Multi-hot column {name!r} pools by {bag.pooling!r}; pool by one of {POOLINGS}."
            )


class BagPooling(keras.layers.Layer):
    """int ids [batch, length] padded with `PAD_ID` -> [batch, width]: the sum or mean of each
    bag's rows of an embedding table; an empty bag gives zeros."""

    def __init__(
        self,
        cardinality: int,
        width: int,
        pooling: str,
        initializer: Any,
        table_optimizer_fn: OptimizerFn | None = None,
        dynamic: Mapping[str, Any] | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.pooling = pooling
        self.table = embedding_table(
            cardinality, width, initializer, f"{self.name}_table", table_optimizer_fn, dynamic
        )
        # A dynamic table's raw ids are int64 (fingerprints); PAD_ID is none of them.
        self.id_type = tf.int64 if dynamic is not None else tf.int32
        self.width = width

    def build(self, input_shape) -> None:
        self.table.build((None,))
        self.built = True

    def call(self, ids):
        ids = tf.cast(ids, self.id_type)
        if self.id_type == tf.int64 and ids.shape.is_fully_defined():
            # A dynamic table exchanges a step's raw ids between replicas in a fixed shape:
            # the padded bags bound the valid ids the mask below leaves (of no static count).
            self.table.bound_lookups(ids.shape.num_elements())
        valid = ids != PAD_ID
        rows = tf.cast(tf.where(valid)[:, 0], tf.int32)  # the bag of each valid id
        # Only the valid ids are gathered: the gradient touches the rows looked up alone.
        vectors = self.table(tf.boolean_mask(ids, valid))
        pooled = tf.math.unsorted_segment_sum(vectors, rows, tf.shape(ids)[0])
        if self.pooling == "sum":
            return pooled
        sizes = tf.reduce_sum(tf.cast(valid, pooled.dtype), axis=1, keepdims=True)
        return pooled / tf.maximum(sizes, 1.0)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.width)


def inputs(features: CTRFeatures) -> dict[str, keras.KerasTensor]:
    """The model's inputs by column name (see the module docstring for their shapes)."""
    columns = {name: keras.Input((), dtype="float32", name=name) for name in features.numeric}

    def ids(name: str) -> str:
        return "int64" if name in features.dynamic else "int32"

    columns.update(
        {name: keras.Input((), dtype=ids(name), name=name) for name in features.categorical}
    )
    columns.update(
        {name: keras.Input((None,), dtype=ids(name), name=name) for name in features.multi_hot}
    )
    return columns


def _initializer(seed: int, index: int, kind: str = "embedding"):
    # Explicit per-layer seeds: the initial weights are a function of `seed` alone, so
    # runs on 1 and N replicas start from the same point.
    if kind == "embedding":
        return keras.initializers.RandomNormal(stddev=0.05, seed=seed * 1000 + index)
    return keras.initializers.GlorotUniform(seed=seed * 1000 + index)


def embedded(
    features: CTRFeatures,
    columns: Mapping[str, Any],
    width: int,
    seed: int,
    prefix: str = "",
    table_optimizer_fn: OptimizerFn | None = None,
) -> list[Any]:
    """One [batch, width] vector a categorical or multi-hot column, in `id_columns` order;
    the tables as the module docstring says."""
    vectors = []
    for index, name in enumerate(features.id_columns):
        initializer = _initializer(seed, index)
        layer_name = f"{prefix}{name}_embedding"
        dynamic = features.dynamic.get(name)
        if name in features.categorical:
            rows = features.categorical[name]
            table = embedding_table(
                rows, width, initializer, layer_name, table_optimizer_fn, dynamic
            )
        else:
            bag = features.multi_hot[name]
            table = BagPooling(
                bag.cardinality,
                width,
                bag.pooling,
                initializer,
                table_optimizer_fn,
                dynamic,
                name=layer_name,
            )
        vectors.append(table(columns[name]))
    return vectors


def dynamic_tables_of(model: keras.Model, features: CTRFeatures) -> dict[str, Any]:
    """Each dynamic column's `loops.DynamicTable` in `model` (a builder's: the deep one where
    wide & deep has two, the same map), by column."""
    layers = {layer.name: layer for layer in model.layers}
    found = {}
    for name in features.dynamic:
        layer = layers[f"{name}_embedding"]
        found[name] = layer.table if isinstance(layer, BagPooling) else layer
    return found


def table_layers(name: str, features: CTRFeatures) -> dict[str, list[str]]:
    """The layers of model `name` that hold each categorical or multi-hot column's rows, by
    column (`embedded`'s names: wide & deep's wide tables too), as `loops.WarmStart`'s row_ids
    name them."""
    prefixes = ("", "wide_") if name == "wide_and_deep" else ("",)
    return {
        column: [f"{prefix}{column}_embedding" for prefix in prefixes]
        for column in features.id_columns
    }


def numeric_block(features: CTRFeatures, columns: Mapping[str, Any]) -> Any | None:
    """The numeric columns side by side, float32 [batch, columns]; None without any."""
    if not features.numeric:
        return None
    return keras.ops.stack([columns[name] for name in features.numeric], axis=1)


def mlp(hidden, units: Sequence[int], seed: int, first_index: int, *, name: str):
    """ReLU Dense layers of `units`, seeded from `first_index` on."""
    for offset, count in enumerate(units):
        hidden = keras.layers.Dense(
            count,
            activation="relu",
            kernel_initializer=_initializer(seed, first_index + offset, "dense"),
            name=f"{name}_{offset}",
        )(hidden)
    return hidden


def _logit(hidden, seed: int, index: int, name: str = "logit"):
    return keras.layers.Dense(1, kernel_initializer=_initializer(seed, index, "dense"), name=name)(
        hidden
    )


def _joined(parts: list) -> Any:
    return parts[0] if len(parts) == 1 else keras.layers.Concatenate()(parts)


def wide_and_deep(
    features: CTRFeatures,
    *,
    embedding_dim: int = 8,
    hidden_units: Sequence[int] = (64, 32),
    seed: int = 0,
    table_optimizer_fn: OptimizerFn | None = None,
) -> keras.Model:
    """Wide & deep: a linear model of the numeric columns and a one-wide embedding (a learned
    weight) of each id, plus an MLP over the numeric columns and the ids' embeddings."""
    columns = inputs(features)
    numeric = numeric_block(features, columns)
    wide_parts = embedded(
        features, columns, 1, seed + 1, prefix="wide_", table_optimizer_fn=table_optimizer_fn
    )
    deep_parts = embedded(
        features, columns, embedding_dim, seed, table_optimizer_fn=table_optimizer_fn
    )
    if numeric is not None:
        wide_parts.append(_logit(numeric, seed, 100, name="wide_numeric"))
        deep_parts.insert(0, numeric)
    deep = mlp(_joined(deep_parts), hidden_units, seed, 200, name="deep")
    wide_parts.append(_logit(deep, seed, 300))
    logit = wide_parts[0] if len(wide_parts) == 1 else keras.layers.Add()(wide_parts)
    return keras.Model(columns, logit, name="wide_and_deep")


class CrossLayer(keras.layers.Layer):
    """One DCN-v2 cross layer, full rank: (x0, x) -> x0 * (W x + b) + x."""

    def __init__(self, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.seed = seed

    def build(self, input_shape) -> None:
        width = input_shape[0][-1]
        self.dense = keras.layers.Dense(
            width, kernel_initializer=_initializer(self.seed, 0, "dense")
        )
        self.dense.build((None, width))
        self.built = True

    def call(self, inputs):
        first, current = inputs
        return first * self.dense(current) + current

    def compute_output_shape(self, input_shape):
        return input_shape[1]


def dcn_v2(
    features: CTRFeatures,
    *,
    embedding_dim: int = 8,
    cross_layers: int = 2,
    hidden_units: Sequence[int] = (64, 32),
    seed: int = 0,
    table_optimizer_fn: OptimizerFn | None = None,
) -> keras.Model:
    """DCN-v2, stacked: `cross_layers` full-rank cross layers over x0 (the numeric columns and
    the ids' embeddings side by side), x_{l+1} = x0 * (W_l x_l + b_l) + x_l, then an MLP."""
    columns = inputs(features)
    numeric = numeric_block(features, columns)
    parts = embedded(features, columns, embedding_dim, seed, table_optimizer_fn=table_optimizer_fn)
    first = _joined(parts if numeric is None else [numeric, *parts])
    crossed = first
    for index in range(cross_layers):
        crossed = CrossLayer(seed * 1000 + 100 + index, name=f"cross_{index}")([first, crossed])
    deep = mlp(crossed, hidden_units, seed, 200, name="deep")
    return keras.Model(columns, _logit(deep, seed, 300), name="dcn_v2")


def dlrm(
    features: CTRFeatures,
    *,
    embedding_dim: int = 8,
    bottom_units: Sequence[int] = (32,),
    top_units: Sequence[int] = (64, 32),
    seed: int = 0,
    table_optimizer_fn: OptimizerFn | None = None,
) -> keras.Model:
    """DLRM: a bottom MLP takes the numeric columns to an embedding-wide vector; the dot product
    of every pair of it and the ids' embeddings, beside it, feeds a top MLP.

    Raises:
        ValueError: the description has no numeric column (the bottom MLP's input).
    """
    if not features.numeric:
        raise ValueError(
            "dlrm's bottom MLP reads the numeric columns and the description has none; add a "
            "numeric column or use wide_and_deep or dcn_v2."
        )
    columns = inputs(features)
    bottom = mlp(numeric_block(features, columns), bottom_units, seed, 100, name="bottom")
    bottom = keras.layers.Dense(
        embedding_dim,
        activation="relu",
        kernel_initializer=_initializer(seed, 150, "dense"),
        name="bottom_out",
    )(bottom)
    ids = embedded(features, columns, embedding_dim, seed, table_optimizer_fn=table_optimizer_fn)
    vectors = [bottom, *ids]
    dots = PairwiseDots(name="interaction")(vectors)
    top = mlp(keras.layers.Concatenate()([bottom, dots]), top_units, seed, 200, name="top")
    return keras.Model(columns, _logit(top, seed, 300), name="dlrm")


class PairwiseDots(keras.layers.Layer):
    """n vectors [batch, width] -> [batch, n (n - 1) / 2]: the dot product of each pair i < j."""

    def call(self, vectors):
        stacked = tf.stack(vectors, axis=1)  # [batch, n, width]
        products = tf.matmul(stacked, stacked, transpose_b=True)  # [batch, n, n]
        count = len(vectors)
        first, second = np.triu_indices(count, k=1)
        flat = tf.reshape(products, [-1, count * count])
        return tf.gather(flat, (first * count + second).astype(np.int32), axis=1)

    def compute_output_shape(self, input_shape):
        count = len(input_shape)
        return (input_shape[0][0], count * (count - 1) // 2)


MODELS = ("wide_and_deep", "dcn_v2", "dlrm")


def build_model(
    name: str,
    features: CTRFeatures,
    *,
    embedding_dim: int = 8,
    hidden_units: int = 64,
    hidden_layers: int = 2,
    cross_layers: int = 2,
    seed: int = 0,
    table_optimizer_fn: OptimizerFn | None = None,
) -> keras.Model:
    """The model `name` (one of `MODELS`) over `features`, its MLP `hidden_layers` layers of
    `hidden_units` (dlrm: its top MLP; its bottom MLP one layer of `hidden_units`), as
    `loops-ctr`'s flags name them; its tables as the module docstring says.

    Raises:
        ValueError: an unknown name, or dlrm without a numeric column.
    """
    hidden = (hidden_units,) * hidden_layers
    common: dict[str, Any] = dict(
        embedding_dim=embedding_dim, seed=seed, table_optimizer_fn=table_optimizer_fn
    )
    if name == "wide_and_deep":
        return wide_and_deep(features, hidden_units=hidden, **common)
    if name == "dcn_v2":
        return dcn_v2(features, cross_layers=cross_layers, hidden_units=hidden, **common)
    if name == "dlrm":
        return dlrm(features, bottom_units=(hidden_units,), top_units=hidden, **common)
    raise ValueError(f"No click-through model {name!r}; use one of {', '.join(MODELS)}.")
