"""Keras optimizers' updates of an embedding table restricted to the rows a step touched, on
the optimizer's own slot variables, for the optimizers where that equals the dense update.

What each optimizer's row update promises, given the step's rows summed over
replicas with each id once (`loops.tables.table_rows`):
- `keras.optimizers.SGD` without momentum: exact. The dense update moves a
  row by -lr * g, and an untouched row's g is 0.
- `keras.optimizers.Adagrad`: exact. The dense update adds g**2 to a row's
  accumulator and moves it by -lr * g / sqrt(accumulator + epsilon); with
  g = 0 neither changes, so the touched rows are the whole update, computed
  with the same operations in the same order.
- `loops.RowwiseAdagrad`: exact. One accumulator per row: accumulator +=
  mean(g**2 over the row), then w -= lr * g / sqrt(accumulator + epsilon);
  g = 0 changes neither (`loops.tables.rowwise_adagrad`).
- `loops.LazyAdam`: exact. Adam's rule on the rows a step touched alone, their
  moments too (`loops.tables.lazy_adam`); a row whose summed gradient is all
  zero is left as it is, in its dense form and its row form alike.
- Keras' Adam (and AdamW, Lion, ...): no row update. Dense Adam decays every
  row's moments each step and so moves rows the step did not touch; no sparse
  update equals it, and loops keeps Adam dense rather than train another
  optimizer under its name (`why_dense` says so once per table).
- FTRL: none either: its dense update sets rows it never touched to the
  closed form of their zero linear term (0, for l1 >= 0), which a row update
  would not.
An optimizer configured with what acts on every weight (weight_decay,
clipnorm, clipvalue, global_clipnorm, use_ema, gradient_accumulation_steps,
loss_scale_factor) is also kept dense. `apply_rows` updates one variable (one
replica's copy, or one shard of a partitioned table), given its slots.

A rule is one entry of `RULES`: the optimizer class, its slots (each one's name, the
optimizer's list of it, its width and initial value) and its row update. The tables make
their slots from it (`slot_values`), so a new table optimizer is its class and one entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import keras
import tensorflow as tf

from loops import keras_private
from loops.tables import lazy_adam
from loops.tables.lazy_adam import LazyAdam
from loops.tables.rowwise_adagrad import RowwiseAdagrad

# A row rule: (optimizer, variable, its slot variables, unique ids, summed rows, rate).
RowUpdate = Callable[[Any, tf.Variable, Sequence[tf.Variable], tf.Tensor, tf.Tensor, Any], None]


class Slot(NamedTuple):
    """One slot variable a row rule reads and writes beside each table."""

    name: str  # a table's name for it: its attribute and checkpoint key ("accumulator")
    optimizer_list: str  # the optimizer's list of it, one a variable (Keras': private)
    one_a_row: bool  # one float a row (RowwiseAdagrad's), else the table's width
    initial: Callable[[Any], float]  # its initial value, of the optimizer


class RowRule(NamedTuple):
    """How one Keras optimizer class updates only the touched rows of a variable."""

    slots: tuple[Slot, ...]  # in the order `update` takes them
    update: RowUpdate


def _sgd_rows(optimizer, variable, slots, ids, rows, learning_rate) -> None:
    rate = tf.cast(learning_rate, variable.dtype)
    variable.scatter_sub(tf.IndexedSlices(rate * tf.cast(rows, variable.dtype), ids))


def _adagrad_rows(optimizer, variable, slots, ids, rows, learning_rate) -> None:
    (accumulator,) = slots
    rate = tf.cast(learning_rate, variable.dtype)
    rows = tf.cast(rows, variable.dtype)
    # Keras' Adagrad, row by row: accumulator += g * g, then w -= lr * g / sqrt(acc + eps).
    accumulated = accumulator.sparse_read(ids) + tf.square(rows)
    accumulator.scatter_update(tf.IndexedSlices(accumulated, ids))
    epsilon = tf.cast(optimizer.epsilon, variable.dtype)
    variable.scatter_sub(tf.IndexedSlices(rate * rows / tf.sqrt(accumulated + epsilon), ids))


def _rowwise_adagrad_rows(optimizer, variable, slots, ids, rows, learning_rate) -> None:
    (accumulator,) = slots  # one float a row
    rate = tf.cast(learning_rate, variable.dtype)
    rows = tf.cast(rows, variable.dtype)
    # accumulator += mean(g * g) over the row, then w -= lr * g / sqrt(acc + eps).
    squares = tf.reduce_mean(tf.square(rows), axis=1, keepdims=True)
    accumulated = accumulator.sparse_read(ids) + squares
    accumulator.scatter_update(tf.IndexedSlices(accumulated, ids))
    epsilon = tf.cast(optimizer.epsilon, variable.dtype)
    variable.scatter_sub(tf.IndexedSlices(rate * rows / tf.sqrt(accumulated + epsilon), ids))


def _accumulator(optimizer_list: str, one_a_row: bool) -> Slot:
    return Slot(
        "accumulator",
        optimizer_list,
        one_a_row,
        lambda optimizer: float(optimizer.initial_accumulator_value),
    )


RULES: dict[type, RowRule] = {
    keras.optimizers.SGD: RowRule((), _sgd_rows),
    keras.optimizers.Adagrad: RowRule(
        (_accumulator(keras_private.ADAGRAD_ACCUMULATORS, False),), _adagrad_rows
    ),
    RowwiseAdagrad: RowRule(
        (_accumulator(RowwiseAdagrad.ACCUMULATORS, True),), _rowwise_adagrad_rows
    ),
    LazyAdam: RowRule(
        tuple(Slot(name, lists, False, lambda _: 0.0) for name, lists in LazyAdam.SLOTS),
        lazy_adam.apply_rows,
    ),
}

# Options of every Keras optimizer that act on all of a variable's rows each step.
_WHOLE_VARIABLE_OPTIONS = (
    "weight_decay",
    "clipnorm",
    "clipvalue",
    "global_clipnorm",
    "gradient_accumulation_steps",
    "loss_scale_factor",
)


def why_dense(optimizer: Any) -> str | None:
    """Why `optimizer` has no exact row update, as a sentence; None when it has one."""
    kind = type(optimizer)
    if kind not in RULES:
        return (
            f"{kind.__name__} has no sparse update equal to its dense one (only SGD without "
            "momentum, Adagrad, loops.RowwiseAdagrad and loops.LazyAdam have: Keras' Adam "
            "moves the moments of rows a step does not touch)"
        )
    if kind is keras.optimizers.SGD and optimizer.momentum != 0:
        return "SGD with momentum moves every row by its momentum, touched or not"
    if getattr(optimizer, "use_ema", False):
        return f"{kind.__name__} with use_ema averages every row each step"
    for option in _WHOLE_VARIABLE_OPTIONS:
        if getattr(optimizer, option, None) not in (None, 0, 1):
            return f"{kind.__name__} with {option} acts on every row each step"
    return None


def _unwrapped(variable: Any) -> Any:
    """The tf.Variable a Keras variable wraps (itself for a tf.Variable)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def slots_of(optimizer: Any, variable: Any) -> list[Any]:
    """The optimizer's slot variables for `variable` that its row rule reads and writes."""
    rule = RULES[type(optimizer)]
    return [
        _unwrapped(keras_private.optimizer_slot(optimizer, slot.optimizer_list, variable))
        for slot in rule.slots
    ]


def slot_values(optimizer: Any) -> dict[str, tuple[float, int | None]]:
    """The slots a table keeps beside its rows for `optimizer`'s row rule, by name: each
    one's initial value and its columns (None: the table's).

    Raises:
        ValueError: an optimizer without an exact row update, saying why.
    """
    reason = why_dense(optimizer)
    if reason is not None:
        raise ValueError(
            f"EmbeddingTable(optimizer={type(optimizer).__name__}): {reason}; pass "
            "keras.optimizers.Adagrad, keras.optimizers.SGD without momentum, "
            "loops.RowwiseAdagrad or loops.LazyAdam."
        )
    return {
        slot.name: (slot.initial(optimizer), 1 if slot.one_a_row else None)
        for slot in RULES[type(optimizer)].slots
    }


def apply_rows(
    optimizer: Any,
    variable: Any,
    ids: tf.Tensor,
    rows: tf.Tensor,
    *,
    learning_rate: Any,
    slots: Sequence[Any] | None = None,
) -> None:
    """Applies `optimizer`'s row update to the rows `ids` of `variable`, and of its slots.

    Reads and writes only those rows. Works on one variable: a Keras or tf
    variable, one replica's copy of a mirrored one (inside
    `strategy.extended.update`), or one shard of a partitioned table given
    the shard's own slots and ids local to the shard.

    Args:
        optimizer: a Keras optimizer for which `why_dense` is None.
        variable: the table (or shard) to update.
        ids: the rows to update, each once (int32 or int64 [n]).
        rows: the gradient's rows for `ids`, summed over duplicates and
            replicas ([n, ...]; `loops.tables.table_rows.rows_over_replicas`).
        learning_rate: the rate of this step (`optimizer.learning_rate`, read
            before the optimizer counts the step).
        slots: the variable's slot variables, in `RULES`' order (Adagrad:
            [accumulator]); None: the optimizer's own for `variable`.

    Raises:
        ValueError: an optimizer with no row update (`why_dense` says why).
    """
    reason = why_dense(optimizer)
    if reason is not None:
        raise ValueError(f"loops cannot update rows of a table with this optimizer: {reason}.")
    if slots is None:
        slots = slots_of(optimizer, variable)
    RULES[type(optimizer)].update(
        optimizer, _unwrapped(variable), [_unwrapped(s) for s in slots], ids, rows, learning_rate
    )


def apply_table_rows(
    optimizer: Any, tables: Sequence[tuple[tf.IndexedSlices, Any]], *, count_step: bool
) -> None:
    """Applies each table's rows with `optimizer`'s row update; call in replica context.

    Every replica passes the same rows (`rows_over_replicas`), and each copy of
    a mirrored table (and of its slots) gets the same update, as the optimizer's
    own `apply_gradients` does with a dense gradient.

    Args:
        tables: (rows over replicas with unique ids, variable) pairs.
        count_step: add 1 to `optimizer.iterations`; the optimizer trains
            nothing else this step (its `apply_gradients` counts it otherwise).
    """
    variables = [variable for _, variable in tables]
    slots = [slots_of(optimizer, variable) for variable in variables]

    def update_all(strategy, ids, rows):
        # Cross-replica context: ids and rows hold every replica's (equal) values.
        rate = optimizer.learning_rate
        rate = rate.value if isinstance(rate, keras.Variable) else rate
        for variable, variable_slots, variable_ids, variable_rows in zip(
            variables, slots, ids, rows
        ):
            strategy.extended.update(
                _unwrapped(variable),
                lambda copy, i, r, s=variable_slots: apply_rows(
                    optimizer, copy, i, r, learning_rate=rate, slots=_beside(strategy, s, copy)
                ),
                args=(variable_ids, variable_rows),
                group=False,
            )
        if count_step:
            optimizer.iterations.assign_add(1)

    tf.distribute.get_replica_context().merge_call(
        update_all,
        args=([rows.indices for rows, _ in tables], [rows.values for rows, _ in tables]),
    )


def _beside(strategy: tf.distribute.Strategy, slots: Sequence[Any], copy: Any) -> list[Any]:
    """Each slot's copy on the device of the variable's `copy` (mirrored slots have one each)."""
    return [
        next(c for c in strategy.experimental_local_results(slot) if c.device == copy.device)
        for slot in slots
    ]
