"""`loops.RowwiseAdagrad`: Adagrad with one accumulator per table row (FBGEMM's and MLPerf DLRM's
table optimizer), for `loops.EmbeddingTable` and the tables of a `loops.Update`.

The rule, exactly (it is not Keras' Adagrad, whose accumulator is per element):
for a row's summed gradient g of `dim` floats,
    accumulator += mean(g ** 2)          (one float for the row)
    row -= learning_rate * g / sqrt(accumulator + epsilon)
A row with g = 0 is left unchanged, so updating only the touched rows equals the
dense update (`loops.tables.row_updates`). Slot memory: one float a row, 1/dim of
Adagrad's; a row update reads and writes dim + 1 floats of state, against Adagrad's
2 dim.
"""

from __future__ import annotations

from typing import Any

import keras

from loops import keras_private
from loops.tables import table_optimizers


class RowwiseAdagrad(keras.optimizers.Optimizer):
    """Row-wise Adagrad (see the module docstring) for 2-D variables: embedding tables.

    Args:
        learning_rate: a float or a Keras schedule.
        initial_accumulator_value: each row's accumulator at the start.
        epsilon: added to the accumulator under the square root.
    """

    # Its list of accumulators, one a variable (`loops.tables.row_updates` reads it).
    ACCUMULATORS = "accumulators"

    def __init__(
        self,
        learning_rate: Any = 0.001,
        initial_accumulator_value: float = 0.1,
        epsilon: float = 1e-7,
        name: str = "rowwise_adagrad",
        **kwargs: Any,
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.initial_accumulator_value = initial_accumulator_value
        self.epsilon = epsilon

    def build(self, var_list) -> None:
        if self.built:
            return
        table_optimizers.check_tables(self, var_list)
        super().build(var_list)
        initializer = keras.initializers.Constant(self.initial_accumulator_value)
        self.accumulators = [
            self.add_variable(
                shape=(variable.shape[0], 1),
                initializer=initializer,
                dtype=variable.dtype,
                name="accumulator",
            )
            for variable in var_list
        ]

    def update_step(self, gradient, variable, learning_rate) -> None:
        """The dense form of the rule: rows whose gradient is 0 do not change."""
        ops = keras.ops
        rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        accumulator = keras_private.optimizer_slot(self, self.ACCUMULATORS, variable)
        self.assign_add(accumulator, ops.mean(ops.square(gradient), axis=1, keepdims=True))
        step = rate * gradient / ops.sqrt(accumulator + self.epsilon)
        self.assign_sub(variable, step)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            initial_accumulator_value=self.initial_accumulator_value, epsilon=self.epsilon
        )
        return config
