"""`loops.LazyAdam`: Adam whose moments and rows move only where a step's gradient is not zero,
so that updating the touched rows of a table alone is its whole update.

The rule, exactly: for each row whose gradient g in this step is not all zero,
with t the optimizer's step (its `iterations` + 1), as Keras' Adam computes it,
    m += (g - m) * (1 - beta_1)
    v += (g ** 2 - v) * (1 - beta_2)
    row -= (m * lr * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)) / (sqrt(v) + epsilon)
and every other row, its m and v, are left as they are. Where every row has a
gradient each step (a dense layer, or a table every batch touches whole) it is
Keras' Adam, bit for bit; on a table it is the "lazy" Adam of sparse training
(TensorFlow Addons' LazyAdam, TorchRec's row-wise Adam without the row-wise
moments): a row's moments decay only on the steps that look it up. Slot memory:
two floats an element, as Adam's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from loops import keras_private
from loops.tables import table_optimizers


class LazyAdam(keras.optimizers.Optimizer):
    """Lazy Adam (see the module docstring) for 2-D variables: embedding tables.

    Args:
        learning_rate: a float or a Keras schedule.
        beta_1, beta_2: the decays of the first and second moments.
        epsilon: added to the second moment's square root.
    """

    # (a table's name for the slot, the optimizer's list of it), in the row update's order.
    SLOTS = (("momentum", "momentums"), ("velocity", "velocities"))

    def __init__(
        self,
        learning_rate: Any = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        name: str = "lazy_adam",
        **kwargs: Any,
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

    def build(self, var_list) -> None:
        if self.built:
            return
        table_optimizers.check_tables(self, var_list)
        super().build(var_list)
        for slot, lists in self.SLOTS:
            made = [self.add_variable_from_reference(v, name=slot) for v in var_list]
            setattr(self, lists, made)

    def update_step(self, gradient, variable, learning_rate) -> None:
        """The dense form of the rule: rows whose gradient is all zero do not change."""
        ops = keras.ops
        if isinstance(gradient, tf.IndexedSlices):  # a gather's: every row, its own or 0
            gradient = tf.convert_to_tensor(gradient)
        gradient = ops.cast(gradient, variable.dtype)
        momentum, velocity = (
            keras_private.optimizer_slot(self, lists, variable) for _, lists in self.SLOTS
        )
        alpha = _step_size(self, learning_rate, variable.dtype)
        moved = ops.any(ops.not_equal(gradient, 0), axis=1, keepdims=True)
        m = momentum + ops.multiply(ops.subtract(gradient, momentum), 1 - self.beta_1)
        v = velocity + ops.multiply(ops.subtract(ops.square(gradient), velocity), 1 - self.beta_2)
        self.assign(momentum, ops.where(moved, m, momentum))
        self.assign(velocity, ops.where(moved, v, velocity))
        step = ops.divide(ops.multiply(m, alpha), ops.add(ops.sqrt(v), self.epsilon))
        self.assign_sub(variable, ops.where(moved, step, ops.zeros_like(step)))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        return config


def _step_size(optimizer: LazyAdam, learning_rate: Any, dtype: Any) -> Any:
    """lr * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t) at t = iterations + 1, as Keras' Adam."""
    ops = keras.ops
    rate = ops.cast(learning_rate, dtype)
    local_step = ops.cast(optimizer.iterations + 1, dtype)
    beta_1_power = ops.power(ops.cast(optimizer.beta_1, dtype), local_step)
    beta_2_power = ops.power(ops.cast(optimizer.beta_2, dtype), local_step)
    return rate * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)


def apply_rows(
    optimizer: LazyAdam,
    variable: tf.Variable,
    slots: Sequence[tf.Variable],
    ids: tf.Tensor,
    rows: tf.Tensor,
    learning_rate: Any,
) -> None:
    """The rule on the rows `ids` of `variable` and its moments (`slots`: momentum, velocity),
    given their gradient `rows` summed over duplicates and replicas
    (`loops.tables.row_updates`' entry for LazyAdam)."""
    momentum, velocity = slots
    rows = tf.cast(rows, variable.dtype)
    alpha = _step_size(optimizer, learning_rate, variable.dtype)
    moved = tf.reduce_any(tf.not_equal(rows, 0), axis=1, keepdims=True)
    before_m, before_v = momentum.sparse_read(ids), velocity.sparse_read(ids)
    m = before_m + (rows - before_m) * (1 - optimizer.beta_1)
    v = before_v + (tf.square(rows) - before_v) * (1 - optimizer.beta_2)
    momentum.scatter_update(tf.IndexedSlices(tf.where(moved, m, before_m), ids))
    velocity.scatter_update(tf.IndexedSlices(tf.where(moved, v, before_v), ids))
    step = (m * alpha) / (tf.sqrt(v) + optimizer.epsilon)
    variable.scatter_sub(tf.IndexedSlices(tf.where(moved, step, tf.zeros_like(step)), ids))
