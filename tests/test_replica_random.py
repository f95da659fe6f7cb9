"""StatelessDropout: masks differ across replicas and steps, and match for 1 and N replicas."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import tiny_batches
from loops.core.replica_random import StatelessDropout, keyed_on

RATE = 0.5
WIDTH = 64


def dropout_outputs(strategy, layer, *, step, rows_per_replica):
    """Each replica's output of `layer` on the SAME all-ones rows, in training."""

    @tf.function
    def run():
        def replica_fn():
            ones = tf.ones([rows_per_replica, WIDTH])
            count = loops.global_count(rows_per_replica)
            with keyed_on(step=tf.constant(step, tf.int64), global_rows=count):
                return layer(ones, training=True)

        return strategy.run(replica_fn)

    return [np.asarray(t) for t in strategy.experimental_local_results(run())]


def test_replicas_with_the_same_rows_drop_different_units():
    layer = StatelessDropout(RATE, seed=7)
    outputs = dropout_outputs(loops.testing.replica_strategy(4), layer, step=3, rows_per_replica=2)
    assert [o.shape for o in outputs] == [(2, WIDTH)] * 4
    everything = np.concatenate(outputs)
    # Kept units are scaled by 1 / (1 - rate); the rest are 0.
    assert set(np.unique(everything)) == {0.0, 2.0}
    assert 0.4 < np.mean(everything == 0.0) < 0.6
    masks = [tuple(row) for row in (everything > 0)]
    assert len(set(masks)) == 8  # no two rows share a mask, on one replica or across


def test_one_replica_draws_the_rows_of_four():
    layer = StatelessDropout(RATE, seed=7)
    four = dropout_outputs(loops.testing.replica_strategy(4), layer, step=3, rows_per_replica=2)
    one = dropout_outputs(loops.testing.replica_strategy(1), layer, step=3, rows_per_replica=8)
    np.testing.assert_array_equal(np.concatenate(four), one[0])


def test_masks_change_with_the_step_and_the_seed_and_repeat_for_them():
    strategy = loops.testing.replica_strategy(2)

    def mask(seed, step):
        return (
            np.concatenate(
                dropout_outputs(
                    strategy, StatelessDropout(RATE, seed=seed), step=step, rows_per_replica=4
                )
            )
            > 0
        )

    reference = mask(seed=7, step=3)
    np.testing.assert_array_equal(mask(seed=7, step=3), reference)
    for other in (mask(seed=7, step=4), mask(seed=8, step=3)):
        assert 0.3 < np.mean(other != reference) < 0.7  # about half the units flip


def test_the_classifier_loop_draws_new_masks_every_step():
    # One fixed batch and a learning rate of 0: only the masks can change the loss.
    def model():
        return keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Flatten(),
                StatelessDropout(RATE, seed=2),
                keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(seed=0)),
            ]
        )

    loop = loops.Trainer(
        loops.ClassifierLoop(model_fn=model, optimizer_fn=lambda: keras.optimizers.SGD(0.0)),
        strategy=loops.testing.replica_strategy(2),
        train_data=tiny_batches(8, 8),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
    )
    losses = loop.train(7)["loss"]
    assert len(np.unique(losses)) == 7, losses


def test_inference_passes_inputs_through_and_training_needs_keys():
    layer = StatelessDropout(RATE, seed=1)
    inputs = tf.reshape(tf.range(12, dtype=tf.float32), [3, 4])
    np.testing.assert_array_equal(layer(inputs, training=False), inputs)
    with pytest.raises(
        ValueError, match="called with training=True outside loops.replica_random.keyed_on"
    ):
        layer(inputs, training=True)


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_a_rate_outside_zero_to_one_is_refused(rate):
    with pytest.raises(ValueError, match=f"Dropout rate must lie in \\[0, 1\\), got {rate}"):
        StatelessDropout(rate, seed=0)
