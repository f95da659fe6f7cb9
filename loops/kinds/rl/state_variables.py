"""Named non-trainable variables of an RL loop, checkpointed like a model's."""

from __future__ import annotations

import keras
import tensorflow as tf


class StateVariables(keras.layers.Layer):
    """Named non-trainable variables of a loop, mirrored and written by the first replica.

    A Keras layer, so the variables are checkpointed and listed (`.variables`)
    like a model's.
    """

    def add(self, name: str, value, dtype: str) -> keras.Variable:
        value = tf.cast(value, dtype)
        variable = self.add_weight(
            shape=tuple(value.shape),
            dtype=dtype,
            trainable=False,
            name=name,
            initializer=lambda shape, dtype=None: tf.cast(value, dtype),
            # Every replica computes (or is handed) the same value; any one copy will do.
            aggregation="only_first_replica",
        )
        # An attribute, because that is what a checkpoint of a Keras layer saves.
        setattr(self, name, variable)
        return variable
