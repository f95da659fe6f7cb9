"""The private Keras names loops relies on (`loops.keras_private`) are still there: a
Keras release that renames one fails here, by name, before the features built on it fail."""

import importlib

import keras

from loops import keras_private


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


def test_the_embedding_layers_of_a_model_are_found_nested_and_read_sparsely_the_same():
    import numpy as np
    import tensorflow as tf

    from loops.tables import table_rows

    inner = keras.Sequential([keras.Input((2,), dtype="int32"), keras.layers.Embedding(7, 3)])
    ids = keras.Input((2,), dtype="int32")
    model = keras.Model(ids, keras.layers.Embedding(5, 3)(ids) + inner(ids))
    found = keras_private.embedding_layers(model)
    assert sorted(layer.input_dim for layer in found) == [5, 7]

    layer = keras.layers.Embedding(6, 2, dtype="mixed_float16")
    layer.build((None,))
    given = tf.constant([[0, 5, -1], [2, -6, 3]])
    keras_rows = layer(given)
    assert keras_private.read_rows_sparsely(layer, table_rows.lookup)
    patched = layer.call
    assert keras_private.read_rows_sparsely(layer, table_rows.lookup) and layer.call is patched
    rows = layer(given)
    assert rows.dtype == keras_rows.dtype == tf.float16
    np.testing.assert_array_equal(rows.numpy(), keras_rows.numpy())  # -1 is row 5, -6 row 0
    traced = tf.function(lambda: layer(given)).get_concrete_function()
    assert "ResourceGather" in {node.op for node in traced.graph.as_graph_def().node}


def test_a_keras_variable_wraps_its_tf_variable_where_the_sparse_read_finds_it():
    import tensorflow as tf

    variable = keras.Variable([[1.0, 2.0]])
    assert isinstance(getattr(variable, keras_private.KERAS_VARIABLE_WRAPPED), tf.Variable)


def test_the_layer_walk_finds_nested_layers_with_or_without_the_model():
    inner = keras.Sequential(
        [keras.Input((3,), name="inner_features"), keras.layers.Dense(2, name="inner_dense")],
        name="inner",
    )
    inputs = keras.Input((3,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(inner(inputs)), name="outer")
    names = [layer.name for layer in keras_private.nested_layers(model, include_self=False)]
    # model.layers stops at "inner"; the walk goes into it, the model itself left out.
    assert sorted(names) == ["features", "head", "inner", "inner_dense", "inner_features"]
    with_self = keras_private.nested_layers(model, include_self=True)
    assert with_self[0] is model and len(with_self) == len(names) + 1


def test_adagrads_accumulators_are_the_slot_the_row_update_writes():
    optimizer = keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.5)
    variable = keras.Variable([1.0, 2.0])
    optimizer.build([variable])
    accumulator = keras_private.optimizer_slot(
        optimizer, keras_private.ADAGRAD_ACCUMULATORS, variable
    )
    optimizer.apply([keras.ops.convert_to_tensor([3.0, 4.0])], [variable])
    # Keras' own update grew it by the squared gradient: the very variable it keeps.
    assert accumulator.numpy().tolist() == [0.5 + 9.0, 0.5 + 16.0]


def test_each_slot_an_optimizer_makes_for_a_variable_is_named_from_its_path():
    """A warm start finds a keras Embedding's Adam moments, which the optimizer holds, by the
    start of their names (`slot_name_start`); Adagrad's accumulator and SGD's momentum too."""
    layer = keras.layers.Embedding(5, 3, name="city_embedding")
    layer.build((None,))
    other = keras.layers.Embedding(5, 3, name="city_embedding_2")
    other.build((None,))
    variables = [layer.embeddings, other.embeddings]
    start = keras_private.slot_name_start(layer.embeddings)
    assert start == "city_embedding_embeddings_"
    for optimizer, count in (
        (keras.optimizers.Adam(), 2),
        (keras.optimizers.Adagrad(), 1),
        (keras.optimizers.SGD(momentum=0.9), 1),
    ):
        optimizer.build(variables)
        mine = [v for v in optimizer.variables if v.name.startswith(start)]
        assert len(mine) == count, [v.name for v in optimizer.variables]
        assert all(tuple(v.shape) == (5, 3) for v in mine)
