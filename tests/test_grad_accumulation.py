"""Gradient accumulation: K micro-batches make the update of the whole batch; any replicas."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import test_parity as parity
from test_gan import make_gan

import loops

STEPS = 7


def classifier_builder(grad_accum_steps, *, dropout=0.0, optimizer="sgd_momentum"):
    # 17 examples, batch 8: every third step holds 1 example, so some
    # micro-batches are short and some, on some replicas, empty. No batch
    # norm: it normalizes each micro-batch by its own statistics.
    return parity.classifier_builder(
        optimizer,
        batch_norm=False,
        clip_norm=0.5,
        dropout=dropout,
        grad_accum_steps=grad_accum_steps,
    )


def one_replica_run(build):
    return loops.testing.train_run(build, loops.testing.replica_strategy(1), num_steps=STEPS)


@pytest.mark.parametrize("grad_accum_steps", [2, 3])
def test_classifier_micro_batches_equal_the_whole_batch_on_one_replica(grad_accum_steps):
    whole = one_replica_run(classifier_builder(1, dropout=0.3))
    accumulated = one_replica_run(classifier_builder(grad_accum_steps, dropout=0.3))
    loops.testing.assert_runs_agree(
        accumulated, whole, rtol=1e-5, label=f"{grad_accum_steps} micro-batches vs 1"
    )
    # Summed logs are whole-step counts, and the partial steps were partial.
    np.testing.assert_array_equal(accumulated["logs"]["num_examples"], [8, 8, 1, 8, 8, 1, 8])


def test_classifier_micro_batches_keep_replica_parity_with_dropout():
    # 4 replicas x 4 micro-batches of a batch of 8: micro-batches of 1 row and
    # empty ones on every replica; dropout masks keyed by the example's row.
    reference = one_replica_run(classifier_builder(1, dropout=0.3, optimizer="adam"))
    for replicas, grad_accum_steps in [(2, 2), (4, 4)]:
        run = loops.testing.train_run(
            classifier_builder(grad_accum_steps, dropout=0.3, optimizer="adam"),
            loops.testing.replica_strategy(replicas),
            num_steps=STEPS,
        )
        loops.testing.assert_runs_agree(
            run, reference, rtol=1e-5, label=f"{replicas} replicas x {grad_accum_steps} vs 1 x 1"
        )


def test_dropout_masks_really_differ_per_example():
    # Without the per-row keys, micro-batches would reuse the first rows' masks:
    # the run with dropout differs from the run without it.
    with_dropout = one_replica_run(classifier_builder(2, dropout=0.3))
    without = one_replica_run(classifier_builder(2))
    assert np.min(np.abs(with_dropout["logs"]["loss"] - without["logs"]["loss"])) > 1e-3


def test_gan_micro_batches_equal_the_whole_batch_and_keep_parity():
    # Ring batches of 4, 4, 3: micro-batches of 2, 2 / 2, 1, and on 2 replicas
    # of 1 and empty ones. The noise and the penalty's interpolation are keyed
    # by the example's row in the step, as without accumulation.
    def build(grad_accum_steps):
        return lambda strategy: make_gan(
            strategy, gan_loss="wgan_gp", grad_accum_steps=grad_accum_steps
        )

    whole = loops.testing.train_run(build(1), loops.testing.replica_strategy(1), num_steps=4)
    for replicas, grad_accum_steps in [(1, 2), (2, 2), (1, 4)]:
        run = loops.testing.train_run(
            build(grad_accum_steps), loops.testing.replica_strategy(replicas), num_steps=4
        )
        loops.testing.assert_runs_agree(
            run, whole, rtol=1e-5, label=f"GAN {replicas} replicas x {grad_accum_steps} vs 1 x 1"
        )
    assert whole["logs"]["gradient_penalty"].shape == (4,)
    assert np.all(whole["logs"]["gradient_penalty"] > 0)


def test_bad_grad_accum_steps_is_refused_before_building():
    with pytest.raises(
        ValueError,
        match=r"grad_accum_steps must be a whole number >= 1 \(1: no accumulation\), got 0",
    ):
        classifier_builder(0)(loops.testing.replica_strategy(1))


def test_a_replica_function_without_a_global_count_is_refused():
    class Unnormalized(loops.Loop):
        def build(self):
            self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            self.optimizer = keras.optimizers.SGD(0.1)
            self.optimizer.build(self.model.trainable_variables)
            self.update = loops.Update(self, self.optimizer, self.model)

        def train_step(self, iterator):
            x, y = next(iterator)
            result = self.update(
                lambda x, y: (tf.reduce_mean((self.model(x)[:, 0] - y) ** 2), {}), args=(x, y)
            )
            return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}

    data = tf.data.Dataset.from_tensor_slices(
        (np.ones((8, 3), np.float32), np.ones((8,), np.float32))
    ).batch(4)
    loop = loops.Trainer(
        Unnormalized(),
        train_data=lambda: data.repeat(),
        grad_accum_steps=2,
        progress=loops.testing.quiet_progress(),
    )
    with pytest.raises(
        ValueError,
        match="this loss function took no loops.global_count and called no "
        "loops.scale_to_global_batch, so which count its loss was divided by is not known",
    ):
        loop.train(1)
