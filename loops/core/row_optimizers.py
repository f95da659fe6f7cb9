"""Row-wise optimizers for embedding tables: each reads and writes only the rows a step touched.

A table's gradient is, per shard, the looked-up rows' gradients (an
`IndexedSlices` with an index per lookup). `apply_row_gradients` sums the
duplicates first, then the optimizer updates only those rows of the shard and
of its slots (gathers and scatters that run where the shard lives, a parameter
server under ParameterServerStrategy), so a step costs what its batch touched,
not what the table holds. Both are exact: they equal Keras' SGD and Adagrad on
the dense gradient (the untouched rows of which are zero and change nothing),
in the same float32 operations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf


class RowSGD:
    """Plain SGD on the touched rows: row -= learning_rate * gradient."""

    slot_names: tuple[str, ...] = ()

    def __init__(self, learning_rate: float = 0.01):
        self.learning_rate = _positive("RowSGD", "learning_rate", learning_rate)

    def slot_initial_value(self, name: str) -> float:
        raise KeyError(name)

    def update_rows(
        self, shard: tf.Variable, slots: Mapping[str, tf.Variable], rows: tf.Tensor, gradient
    ) -> None:
        """Applies `gradient` (one row per entry of `rows`, no repeats) to those rows of `shard`."""
        del slots
        step = tf.multiply(tf.cast(self.learning_rate, gradient.dtype), gradient)
        shard.scatter_sub(tf.IndexedSlices(step, rows))


class RowAdagrad:
    """Keras' Adagrad on the touched rows, with its defaults.

    accumulator += gradient**2; row -= learning_rate * gradient / sqrt(accumulator + epsilon)
    """

    slot_names: tuple[str, ...] = ("accumulator",)

    def __init__(
        self,
        learning_rate: float = 0.001,
        initial_accumulator_value: float = 0.1,
        epsilon: float = 1e-7,
    ):
        self.learning_rate = _positive("RowAdagrad", "learning_rate", learning_rate)
        self.initial_accumulator_value = _positive(
            "RowAdagrad", "initial_accumulator_value", initial_accumulator_value, zero=True
        )
        self.epsilon = _positive("RowAdagrad", "epsilon", epsilon)

    def slot_initial_value(self, name: str) -> float:
        if name != "accumulator":
            raise KeyError(name)
        return self.initial_accumulator_value

    def update_rows(
        self, shard: tf.Variable, slots: Mapping[str, tf.Variable], rows: tf.Tensor, gradient
    ) -> None:
        """Applies `gradient` (one row per entry of `rows`, no repeats) to those rows of `shard`."""
        accumulator = slots["accumulator"]
        summed = tf.add(tf.gather(accumulator, rows), tf.square(gradient))
        accumulator.scatter_update(tf.IndexedSlices(summed, rows))
        dtype = gradient.dtype
        step = tf.divide(
            tf.multiply(tf.cast(self.learning_rate, dtype), gradient),
            tf.sqrt(tf.add(summed, tf.cast(self.epsilon, dtype))),
        )
        shard.scatter_sub(tf.IndexedSlices(step, rows))


RowOptimizer = RowSGD | RowAdagrad


def apply_row_gradients(
    optimizer: RowOptimizer,
    shards: Sequence[tf.Variable],
    slots: Mapping[str, Sequence[tf.Variable]],
    gradients: Sequence[tf.IndexedSlices | tf.Tensor | None],
) -> None:
    """Updates each shard's touched rows by its gradient (a shard without one stays as it is).

    `slots[name][i]` is shard i's slot `name`. Duplicate ids of a gradient are
    summed before the update, as Keras does when it makes the gradient dense.

    Raises:
        ValueError: a gradient count that is not the shard count.
    """
    if len(gradients) != len(shards):
        raise ValueError(
            f"{len(gradients)} gradients for a table of {len(shards)} shards: take the "
            "gradient with respect to table.shards, one per shard."
        )
    for index, (shard, gradient) in enumerate(zip(shards, gradients, strict=True)):
        if gradient is None:
            continue
        rows, summed = unique_rows(gradient)
        shard_slots = {name: slot[index] for name, slot in slots.items()}
        optimizer.update_rows(shard, shard_slots, rows, summed)


def unique_rows(gradient: tf.IndexedSlices | tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The distinct rows of a gradient and each one's summed gradient."""
    if not isinstance(gradient, tf.IndexedSlices):
        # A dense gradient (a table looked up by a dense matmul): every row is touched.
        gradient = tf.IndexedSlices(gradient, tf.range(tf.shape(gradient)[0]))
    rows, positions = tf.unique(gradient.indices)
    summed = tf.math.unsorted_segment_sum(gradient.values, positions, tf.shape(rows)[0])
    return rows, summed


def _positive(owner: str, name: str, value: float, *, zero: bool = False) -> float:
    number = float(value)
    if not (number >= 0.0 if zero else number > 0.0) or number == float("inf"):
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"{owner}({name}={value!r}) needs a finite number {bound}.")
    return number
