"""The places where loops reaches into Keras through a private name or changes what a Keras
object does, each in one function, because Keras 3 leaves no public way;
`tests/test_keras_private.py` fails when a Keras release renames what they rely on. It
imports nothing of the framework: it stands on the ground floor, beside `loops.tf_private`. No
other module of loops names a private Keras name (`tests/test_private_names.py` checks).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# What each adapter relies on, checked by the test: (module, class, attribute).
KERAS_VARIABLE_COPY = ("keras.src.backend.tensorflow.core", "Variable", "_copy_trackable_to_cpu")
OPTIMIZER_RATE_ATTRIBUTE = "_learning_rate"
# An optimizer's slot lists, indexed by this method of a variable.
OPTIMIZER_VARIABLE_INDEX = "_get_variable_index"
# Adagrad's slot list: each variable's accumulated squared gradients.
ADAGRAD_ACCUMULATORS = "_accumulators"
# Every layer of a model, nested ones included (the Keras 3 method `nested_layers` calls).
LAYER_WALK = "_flatten_layers"
# The tf.Variable a Keras variable wraps: its public `value` is a cast copy inside a layer
# call under a mixed precision policy.
KERAS_VARIABLE_WRAPPED = "_value"


def copy_keras_variables_once() -> None:
    """Lets TensorFlow's asynchronous checkpoints copy Keras 3 variables more than once.

    A save in the background first copies each variable to a host copy: the
    first save makes the copies, each later one assigns them in a tf.function.
    Keras 3's `Variable._copy_trackable_to_cpu` makes a new tf.Variable every
    time, which a tf.function refuses ("only supports singleton tf.Variables")
    at the second save (measured, Keras 3.13). Its copy is the wrapped
    variable's own copy, which saves the same tensors: that one is used.
    Process-wide, and the same however often it is called.
    """
    from keras.src.backend.tensorflow import core

    def copy_once(variable, object_map):
        variable.value._copy_trackable_to_cpu(object_map)
        object_map[variable] = object_map[variable.value]

    core.Variable._copy_trackable_to_cpu = copy_once


@contextlib.contextmanager
def learning_rates_read_from(optimizers: Sequence[Any], rate: Callable[[], Any]) -> Iterator[None]:
    """Inside, every optimizer's update reads its learning rate from `rate`; after, its own.

    Keras 3 reads `_learning_rate` on each update: a variable, a schedule of the
    iterations, or a function it calls. A function is tracked neither by Keras nor
    by TensorFlow's checkpoints, so the optimizers' variables and saved state stay
    what they were (the public setter would untrack the optimizer's own variable).
    """
    own_rates = [getattr(optimizer, OPTIMIZER_RATE_ATTRIBUTE) for optimizer in optimizers]
    for optimizer in optimizers:
        setattr(optimizer, OPTIMIZER_RATE_ATTRIBUTE, rate)
    try:
        yield
    finally:
        for optimizer, own in zip(optimizers, own_rates):
            setattr(optimizer, OPTIMIZER_RATE_ATTRIBUTE, own)


def optimizer_slot(optimizer: Any, slots: str, variable: Any) -> Any:
    """The optimizer's slot variable in its list `slots` (`ADAGRAD_ACCUMULATORS`...) for `variable`.

    A sparse row update (`loops.tables.row_updates`) writes the rows of the very
    slots the Keras optimizer built, so its checkpoints stay the optimizer's;
    Keras 3 keeps them in private lists, by the variable's index.

    Raises:
        ValueError: the optimizer was not built on `variable`, naming it and the fix.
    """
    try:
        index = getattr(optimizer, OPTIMIZER_VARIABLE_INDEX)(variable)
    except KeyError:
        name = getattr(variable, "path", None) or variable.name
        raise ValueError(
            f"the optimizer {optimizer.name} was not built on the variable {name}, which it "
            f"is given to update; build it on every variable it trains "
            f"(optimizer.build(variables)) before making the loops.Update."
        ) from None
    return getattr(optimizer, slots)[index]


def slot_name_start(variable: Any) -> str:
    """How the name of each slot a Keras optimizer makes for `variable` starts: its path with
    "/" as "_", then "_" (`add_variable_from_reference`, e.g. "city_embedding_embeddings_"
    for Adam's "city_embedding_embeddings_momentum"); None-safe for a variable of no path."""
    return str(getattr(variable, "path", "")).replace("/", "_") + "_"


def nested_layers(model: Any, *, include_self: bool) -> list[Any]:
    """Every layer of `model`, those of nested models and layers included (and `model` itself
    with `include_self`); Keras 3's `Model.layers` lists the top level alone."""
    return list(getattr(model, LAYER_WALK)(include_self=include_self, recursive=True))


def embedding_layers(model: Any) -> list[Any]:
    """Every `keras.layers.Embedding` in `model` (nested models and layers included), of
    that class exactly: a subclass may look up its rows another way."""
    import keras

    layers = nested_layers(model, include_self=True)
    return [layer for layer in layers if type(layer) is keras.layers.Embedding]


def embedding_rows(inputs: Any, rows: int) -> Any:
    """The rows a `keras.layers.Embedding` of `rows` rows reads for `inputs`, as its own call
    does: ids cast to int32 unless int64, a negative id counted from the end."""
    import tensorflow as tf

    ids = tf.convert_to_tensor(inputs)
    if ids.dtype not in (tf.int32, tf.int64):
        ids = tf.cast(ids, tf.int32)
    return tf.where(ids < 0, ids + tf.cast(rows, ids.dtype), ids)


def read_rows_sparsely(layer: Any, lookup: Callable[[Any, Any], Any]) -> bool:
    """Makes a `keras.layers.Embedding` look its ids up with `lookup(table, ids)`; returns
    whether it did.

    Keras' own call reads the whole table (`ops.take` converts the variable to
    a tensor) and gathers from the copy. Once a step has written rows of the
    table with a scatter, TensorFlow copies the whole variable on every such
    read (measured: 1M x 32 rows, 634 -> 23 steps/s), so a sparse update is
    only fast with a sparse read. The replacement does what Keras' call does
    (ids cast to int32, negative ids counted from the end, the output cast to
    the layer's compute dtype) with `lookup`; a layer with LoRA or
    quantization, or sparse or ragged ids, keeps Keras' call.
    """
    if getattr(layer.call, "reads_rows_sparsely", False):
        return True  # already (a second Update of the same model)
    if layer.lora_enabled or getattr(layer, "quantization_mode", None):
        return False
    keras_call = layer.call

    def call(inputs):
        import tensorflow as tf

        if isinstance(inputs, (tf.SparseTensor, tf.RaggedTensor)):
            return keras_call(inputs)
        table = getattr(layer.embeddings, KERAS_VARIABLE_WRAPPED)
        rows = lookup(table, embedding_rows(inputs, table.shape[0]))
        if rows is None:  # no sparse read here (not in a replica's step)
            return keras_call(inputs)
        return tf.cast(rows, layer.compute_dtype)

    call.reads_rows_sparsely = True  # type: ignore[attr-defined]
    layer.call = call
    return True


# The class a `keras.layers.Embedding(...)` call makes, chosen by its rows, where a block of
# `embeddings_made_as` is in force in this thread (or task); None: a plain Embedding.
_EMBEDDING_CHOICE: contextvars.ContextVar[Callable[[Any], type | None] | None] = (
    contextvars.ContextVar("embedding_choice", default=None)
)
# The blocks in force in any thread, while `Embedding.__new__` is loops' own.
_HOOK_LOCK = threading.Lock()
_hook_users = 0


@contextlib.contextmanager
def embeddings_made_as(choose: Callable[[Any], type | None]) -> Iterator[None]:
    """Inside (in this thread alone), `keras.layers.Embedding(input_dim, ...)` makes an
    instance of `choose(input_dim)` (a subclass of Embedding, given the same arguments) where
    that is not None, and a plain Embedding otherwise (`choose` is given input_dim as passed,
    None where it is missing); outside, and in every other thread, nothing changes. Blocks
    nest: the innermost chooses.

    Keras 3 offers no hook where a layer is made, and a built Embedding already holds its
    whole table; a class of its own from the start lets a plan place the rows before any
    exist. So `Embedding.__new__` is loops' own while any block is in force in any thread
    (Keras' Layer defines the one every layer inherits; Embedding none of its own), and it
    asks this thread's choice, a context variable: a model another thread makes meanwhile
    gets plain Embeddings.
    """
    token = _EMBEDDING_CHOICE.set(choose)
    try:
        _use_hook(+1)
        try:
            yield
        finally:
            _use_hook(-1)
    finally:
        _EMBEDDING_CHOICE.reset(token)


def _use_hook(change: int) -> None:
    """Counts a block of `embeddings_made_as` in (+1) or out (-1): the first in sets loops'
    `Embedding.__new__`, the last out takes it away."""
    import keras

    global _hook_users
    embedding = keras.layers.Embedding
    with _HOOK_LOCK:
        own = vars(embedding).get("__new__")
        if change > 0 and _hook_users == 0:
            if own is not None:
                raise RuntimeError(
                    "keras.layers.Embedding already has a __new__ of its own (a Keras release "
                    "added one, or other code set it): loops cannot place its tables by a "
                    "plan; make the tables loops.EmbeddingTable layers instead."
                )
            embedding.__new__ = _chosen_embedding(embedding)
        _hook_users += change
        if _hook_users == 0:
            del embedding.__new__


def _chosen_embedding(embedding: type) -> Callable[..., Any]:
    """loops' `Embedding.__new__`: the class this thread's choice gives, else Embedding."""
    inherited = embedding.__mro__[1].__new__

    def made(cls, *args, **kwargs):
        choose = _EMBEDDING_CHOICE.get()
        if cls is embedding and choose is not None:
            # Keras refuses a bad input_dim itself, as the plain layer is made.
            cls = choose(args[0] if args else kwargs.get("input_dim")) or cls
        return inherited(cls, *args, **kwargs)

    return made
