"""The private Keras names loops relies on (`loops.core.keras_private`) are still there: a
Keras release that renames one fails here, by name, before the features built on it fail."""

import importlib

import keras

from loops.core import keras_private


def test_the_keras_variable_copy_that_background_checkpoints_replace_exists():
    module, owner, attribute = keras_private.KERAS_VARIABLE_COPY
    assert callable(getattr(getattr(importlib.import_module(module), owner), attribute))


def test_an_optimizer_reads_its_rate_from_the_attribute_the_finder_swaps():
    optimizer = keras.optimizers.SGD(0.5)
    variable = keras.Variable([1.0])
    optimizer.build([variable])
    assert hasattr(optimizer, keras_private.OPTIMIZER_RATE_ATTRIBUTE)
    with keras_private.learning_rates_read_from([optimizer], lambda: 0.25):
        optimizer.apply([keras.ops.convert_to_tensor([2.0])], [variable])
    assert float(variable.numpy()[0]) == 1.0 - 0.25 * 2.0  # the swapped rate
    optimizer.apply([keras.ops.convert_to_tensor([2.0])], [variable])
    assert float(variable.numpy()[0]) == 0.5 - 0.5 * 2.0  # its own again
    assert float(optimizer.learning_rate.numpy()) == 0.5
