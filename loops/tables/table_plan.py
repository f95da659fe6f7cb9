"""`loops.TablePlan`: the plain `keras.layers.Embedding` layers of a model made in its scope
become `loops.EmbeddingTable`s placed by the strategy, the small ones staying replicated.

A model whose code its trainer does not write (a library's, a colleague's)
makes `keras.layers.Embedding(rows, dim)`: every replica holds the whole table
and its slots. Given to the Trainer (`loops.Trainer(definition,
table_plan=loops.TablePlan())`), the plan is in force while the definition's
`build` runs: each Embedding made there of `min_rows` rows or more is a
`PlacedEmbedding`, an Embedding whose rows live in an `EmbeddingTable` (`.table`)
split over the replicas of a MirroredStrategy or MultiWorkerMirroredStrategy,
over the servers of a ParameterServerStrategy, or whole on one replica: the same
lookups, trained by rows by the `loops.Update` that trains the model (with its
`table_optimizer`, else its optimizer, unless the plan names one).

The rule for small tables, stated: an Embedding of fewer than `min_rows` rows
stays a `keras.layers.Embedding`, whole on every replica, where a lookup needs
no collective and the Update's sparse path trains it; results.json's `tables`
lists each table with its split ("replicas", "servers", "whole" or "replicated").

What changes with the plan: a placed table draws its initial values from the
table's own uniform [-0.05, 0.05] rule (a function of the seed and the global
row, so every layout starts equal), not from the Embedding's initializer; the
k-th table the plan places takes seed `seed + k`. An Embedding with another
initializer, a regularizer, a constraint, LoRA, quantization or `weights=` is
refused (its rows could not be made or trained row by row), as is one made
outside the plan's block (the Trainer checks after `build`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from loops import keras_private
from loops.placement import Placement
from loops.tables.embedding_tables import FROM_UPDATE, EmbeddingTable, replicated_embeddings
from loops.vocabulary.whole_numbers import is_whole

# A table of fewer rows stays replicated by default: its copy on every replica costs little,
# and its lookups no collective (the Update trains tables under 10,000 rows densely alone).
DEFAULT_MIN_ROWS = 10_000


@dataclasses.dataclass(frozen=True)
class TablePlan:
    """Which Embedding layers become placed tables, and how they train.

    Attributes:
        min_rows: an Embedding of this many rows or more is placed; a smaller one stays a
            replicated `keras.layers.Embedding`.
        optimizer: makes each placed table's optimizer (called once a table: a Keras
            optimizer class, or a function of no argument); None: the optimizer of the
            `loops.Update` that trains it, its `table_optimizer`, else its `optimizer`.
            Either must have an exact row update (Adagrad, `loops.RowwiseAdagrad`, SGD
            without momentum).
        seed: the first placed table's initial values' seed; the k-th takes seed + k.
    """

    min_rows: int = DEFAULT_MIN_ROWS
    optimizer: Callable[[], keras.optimizers.Optimizer] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("min_rows", "seed"):
            value = getattr(self, name)
            least = 1 if name == "min_rows" else 0
            if not is_whole(value, least):
                raise ValueError(f"TablePlan({name}={value!r}) needs a whole number >= {least}.")
        if self.optimizer is not None and not callable(self.optimizer):
            raise ValueError(
                f"TablePlan(optimizer={self.optimizer!r}) takes what makes each table's "
                "optimizer (keras.optimizers.Adagrad, or lambda: "
                "keras.optimizers.Adagrad(0.1)), not an optimizer: each table keeps its own "
                "slots. None trains each with the Update's table optimizer."
            )

    def split_of(self, rows: int, where: Placement) -> str:
        """How the plan lays an Embedding of `rows` rows under placement `where`, before any
        is made: a small one as a plain Embedding ("replicated" or "whole"), the others as a
        placed table ("replicas", "servers" or "whole"; `Placement.table_split`), as
        results.json's `tables` states it after the build."""
        return where.table_split(rows, placed=rows >= self.min_rows)

    @contextlib.contextmanager
    def placing(self) -> Iterator[None]:
        """Inside (and on this thread alone), each `keras.layers.Embedding` made of
        `min_rows` rows or more is a `PlacedEmbedding`; make the model, and its Update,
        inside it (the Trainer enters it around the definition's `build`)."""
        state = _PlanState(self)
        token = _IN_FORCE.set(state)
        try:
            with keras_private.embeddings_made_as(state.chosen_class):
                yield
        finally:
            _IN_FORCE.reset(token)

    def check_placed(self, items: Any) -> None:
        """Refuses, with the fix, an Embedding of `min_rows` rows or more of the Keras models
        among `items` (a definition's checkpoint items) that the plan did not place: one
        made before its block (outside the definition's `build`)."""
        for layer in replicated_embeddings(items):
            if layer.input_dim >= self.min_rows:
                raise ValueError(
                    f"TablePlan(min_rows={self.min_rows}) places every keras.layers.Embedding "
                    f"of that many rows made while the definition builds, and "
                    f"{layer.name!r} ({layer.input_dim} rows) was made before: make the model "
                    "in the definition's build(), or raise min_rows above its rows to keep "
                    "it replicated."
                )


def changed_layout(prefix: str, saved: Mapping[str, Sequence[int]], items: Any) -> str | None:
    """Why checkpoint `prefix` (its keys and shapes, `saved`) does not restore into `items`
    (a definition's checkpoint items) where a `TablePlan` placed an Embedding in one and not
    in the other, naming it and how to resume; None where the placed tables agree.

    A placed table saves its rows under `<layer>/table/embeddings`, a plain Embedding under
    `<layer>/embeddings` (or its optimizer's list): a plan that changed changes the keys.
    """
    tables = [
        (key.split("/.ATTRIBUTES")[0], tuple(shape))
        for key, shape in saved.items()
        if _PLACED_ROWS_KEY.search(key)
    ]
    unclaimed = [shape for _, shape in tables]
    for layer in placed_embeddings(items):
        shape = (layer.input_dim, layer.output_dim)
        if shape in unclaimed:
            unclaimed.remove(shape)
            continue
        return (
            f"The checkpoint {prefix} holds no placed table of Embedding {layer.name!r} "
            f"({shape[0]} x {shape[1]}), which this loop's loops.TablePlan(min_rows="
            f"{layer.plan.min_rows}) places as a loops.EmbeddingTable: it was written without "
            "the plan (or with one that kept this Embedding a plain keras.layers.Embedding), "
            "and the plan changed the checkpoint's layout. Resume it as it was written (no "
            f"table_plan=, or TablePlan(min_rows={shape[0] + 1}) to keep this Embedding "
            "replicated), or train with the plan in a new model_dir."
        )
    for layer in replicated_embeddings(items):
        shape = (layer.input_dim, layer.output_dim)
        if shape in unclaimed:
            key = next(key for key, saved_shape in tables if saved_shape == shape)
            return (
                f"The checkpoint {prefix} holds the rows of a placed table of shape "
                f"({shape[0]}, {shape[1]}) under {key!r}, as a loops.TablePlan places an "
                f"Embedding, and this loop's Embedding {layer.name!r} of that shape is a "
                "plain keras.layers.Embedding: the plan changed the checkpoint's layout. "
                "Resume it with the plan it was written with (loops.Trainer(..., "
                f"table_plan=loops.TablePlan(min_rows=N)), N at most {shape[0]}), or train "
                "without it in a new model_dir."
            )
    return None


def placed_embeddings(items: Any) -> list[PlacedEmbedding]:
    """The built `PlacedEmbedding` layers of the Keras models among `items` (a definition's
    checkpoint items), nested ones included."""
    models = [item for item in items.values() if isinstance(item, keras.Model)]
    return [
        layer
        for model in models
        for layer in keras_private.nested_layers(model, include_self=True)
        if isinstance(layer, PlacedEmbedding) and layer.built
    ]


# A PlacedEmbedding's rows: its `table` attribute's `embeddings`.
_PLACED_ROWS_KEY = re.compile(r"(^|/)table/embeddings/\.ATTRIBUTES/VARIABLE_VALUE$")


class _PlanState:
    """A plan in force: which class an Embedding of some rows is made as, and the seeds."""

    def __init__(self, plan: TablePlan):
        self.plan, self.placed = plan, 0

    def chosen_class(self, rows: object) -> type | None:
        placed = is_whole(rows) and rows >= self.plan.min_rows
        return PlacedEmbedding if placed else None

    def next_seed(self) -> int:
        self.placed += 1
        return self.plan.seed + self.placed - 1


_IN_FORCE: contextvars.ContextVar[_PlanState | None] = contextvars.ContextVar(
    "table_plan", default=None
)


class PlacedEmbedding(keras.layers.Embedding):
    """A `keras.layers.Embedding` whose rows live in an `EmbeddingTable` placed by the
    strategy (`table`); made by a `TablePlan` in force, in place of the plain one.

    Its lookups equal the plain layer's (ids cast to int32 unless int64, a
    negative id counted from the end, the rows cast to the compute dtype).
    `embeddings` is not one variable here: read the rows with `table.whole()`.
    Its `weights` are the plain layer's one, the rows whole (`TableRows`), so that
    `model.get_weights()` and `set_weights()` copy weights to and from a model of plain
    Embeddings; its `trainable_variables` (and `trainable_weights`) leave the rows out, as
    an `EmbeddingTable`'s do: a Keras optimizer built on them would hold dense slots of
    every row on every replica, and the `loops.Update` trains the rows by rows
    (`table.shards` are their variables). Keras counts them non-trainable so.
    """

    def __init__(self, input_dim, output_dim, *args, **kwargs):
        if kwargs.get("name") is None:  # named as the plain layer would be: "embedding_3"
            uid = keras.backend.get_uid("embedding")
            kwargs["name"] = "embedding" if uid == 1 else f"embedding_{uid - 1}"
        super().__init__(input_dim, output_dim, *args, **kwargs)
        _check_placeable(self, kwargs)
        state = _IN_FORCE.get()
        if state is None:
            raise ValueError(
                "PlacedEmbedding is made by a loops.TablePlan in force (TablePlan().placing(), "
                "or the Trainer's table_plan=): make a keras.layers.Embedding inside it."
            )
        make = state.plan.optimizer
        self._table_optimizer = make() if make is not None else FROM_UPDATE
        self._table_seed = state.next_seed()
        self.plan = state.plan  # named when a checkpoint's layout is not the plan's

    def build(self, input_shape=None) -> None:
        self.table = EmbeddingTable(
            self.input_dim,
            self.output_dim,
            self._table_optimizer,
            seed=self._table_seed,
            name=self.name,
        )
        self.table.build()

    @property
    def embeddings(self):
        raise AttributeError(
            f"Embedding {self.name!r} was placed by a loops.TablePlan: its rows live in "
            f"{self.name}.table, split as the strategy places it; read them with "
            "table.whole(), or raise the plan's min_rows above its rows to keep it a "
            "keras.layers.Embedding."
        )

    @property
    def weights(self) -> list:
        return [TableRows(self)] if self.built else []

    def call(self, inputs):
        rows = keras_private.embedding_rows(inputs, self.input_dim)
        return tf.cast(self.table(rows), self.compute_dtype)

    def save_own_variables(self, store) -> None:
        del store
        raise ValueError(_NOT_IN_KERAS_FILES.format(name=self.name))

    def load_own_variables(self, store) -> None:
        del store
        raise ValueError(_NOT_IN_KERAS_FILES.format(name=self.name))


class TableRows:
    """A placed table's rows as the one weight of a `keras.layers.Embedding`: what Keras'
    `get_weights` reads (`numpy`: the rows whole, in row order) and `set_weights` writes
    (`assign`: each block its own rows), its shape, dtype and name the plain layer's. Split
    over several workers, every worker reads and writes them (a gather). It is no
    variable: a tape, or an optimizer, takes `table.shards`."""

    regularizer = constraint = None  # a plan refuses both
    # No Keras optimizer trains them (a tape could not watch this): the Update does, by rows.
    trainable = False

    def __init__(self, layer: PlacedEmbedding):
        self.table = layer.table
        self.name, self.path = "embeddings", f"{layer.name}/embeddings"
        self.shape, self.dtype = (layer.input_dim, layer.output_dim), "float32"

    def numpy(self) -> np.ndarray:
        return self.table.whole().numpy()

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self.numpy(), dtype)

    def assign(self, value) -> None:
        self.table.set_whole(value)

    def __repr__(self) -> str:
        return f"<TableRows path={self.path} shape={self.shape} of a placed table>"


# Keras' own files hold Keras variables, and a placed table's rows are TensorFlow variables
# split by the strategy: such a file would leave them out without a word.
_NOT_IN_KERAS_FILES = (
    "Embedding {name!r} was placed by a loops.TablePlan: a .keras or .weights.h5 file would "
    "leave its rows out. Save it with tf.train.Checkpoint (the Trainer's checkpoints) or as "
    "a SavedModel (loops' exports), which hold the rows whole on every layout."
)


def _check_placeable(layer: keras.layers.Embedding, kwargs: dict) -> None:
    """Refuses, with the fix, an Embedding whose rows a placed table could not make or train."""
    initializer = keras.initializers.serialize(layer.embeddings_initializer)
    config = initializer.get("config", {}) if isinstance(initializer, dict) else {}
    default = (
        isinstance(layer.embeddings_initializer, keras.initializers.RandomUniform)
        and config.get("minval") == -0.05
        and config.get("maxval") == 0.05
    )
    refused = {
        "embeddings_initializer": not default,
        "embeddings_regularizer": layer.embeddings_regularizer is not None,
        "embeddings_constraint": layer.embeddings_constraint is not None,
        "lora_rank": bool(layer.lora_rank),
        "quantization_config": kwargs.get("quantization_config") is not None,
        "weights": kwargs.get("weights") is not None,
    }
    for name, is_refused in refused.items():
        if is_refused:
            raise ValueError(
                f"keras.layers.Embedding({layer.input_dim}, {layer.output_dim}, {name}=...) "
                "cannot be placed by the loops.TablePlan in force: a placed table draws "
                "uniform [-0.05, 0.05] rows of its own and trains by rows. Drop "
                f"{name}, or raise the plan's min_rows above {layer.input_dim} to keep this "
                "Embedding replicated."
            )
