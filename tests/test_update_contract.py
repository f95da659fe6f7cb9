"""The contract of `loops.Update`: the loss's normalizer is the count it is divided by, and
what the Update creates is saved without the definition listing it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import make_trainer


class SampleWeighted(loops.Loop):
    """sum(w * e^2) / sum(w) over the global batch; `variant`: how its loss function is written."""

    def __init__(self, *, variant, **kwargs):
        self.variant = variant
        super().__init__(**kwargs)

    def build(self):
        init = keras.initializers.GlorotUniform
        self.model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(4, activation="tanh", kernel_initializer=init(seed=1)),
                keras.layers.Dense(1, kernel_initializer=init(seed=2)),
            ]
        )
        self.optimizer = keras.optimizers.SGD(0.2)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model)

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def replica_loss(self, x, y, w):
        # First a count of examples (for a log), then the sum of weights the loss divides by.
        examples = loops.global_count(tf.shape(y)[0])
        weight_sum = loops.global_count(tf.reduce_sum(w))
        error = tf.squeeze(tf.cast(self.model(x, training=True), tf.float32), -1) - y
        if self.variant == "scaled":
            loss = loops.scale_to_global_batch(w * error**2, weight_sum)
        elif self.variant == "by_hand":
            loss = tf.math.divide_no_nan(tf.reduce_sum(w * error**2), weight_sum)
        else:  # "two_normalizers": a per-example term and a per-weight term
            loss = loops.scale_to_global_batch(w * error**2, weight_sum)
            loss += loops.scale_to_global_batch(0.01 * error**2, examples)
        return loss, {"examples": tf.cast(tf.shape(y)[0], tf.float32)}

    def train_step(self, iterator):
        result = self.update(self.replica_loss, args=next(iterator))
        return {
            "loss": loops.Mean(result.sums["loss"]),
            "examples": loops.Sum(result.sums["examples"]),
        }


def weighted_data():
    rng = np.random.default_rng(11)
    x = rng.normal(size=(30, 3)).astype(np.float32)
    y = (x @ np.array([0.5, -1.0, 2.0], np.float32)).astype(np.float32)
    # Weights far from 1, so that a count of examples is a wrong normalizer.
    w = rng.uniform(0.0, 4.0, size=30).astype(np.float32) ** 2
    # Batches of 8: the fourth holds 6 rows.
    return lambda: tf.data.Dataset.from_tensor_slices((x, y, w)).batch(8)


def build(strategy, variant="scaled", **kwargs):
    return make_trainer(
        SampleWeighted,
        variant=variant,
        strategy=strategy,
        train_data=weighted_data(),
        steps_per_loop=4,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def test_accumulation_weights_by_the_count_the_loss_is_divided_by_not_the_first_taken():
    whole = loops.testing.train_run(build, loops.testing.replica_strategy(1), num_steps=12)
    for replicas in (1, 2):
        accumulated = loops.testing.train_run(
            lambda strategy: build(strategy, grad_accum_steps=2),
            loops.testing.replica_strategy(replicas),
            num_steps=12,
        )
        loops.testing.assert_runs_agree(
            accumulated, whole, rtol=1e-5, label=f"{replicas} replicas x 2 micro-batches vs 1 x 1"
        )
    assert whole["logs"]["loss"][-1] < 0.5 * whole["logs"]["loss"][0]


@pytest.mark.parametrize(
    "variant, says",
    [
        (
            "by_hand",
            "this loss function took 2 different loops.global_count values and called no "
            "loops.scale_to_global_batch, so which count its loss was divided by is not known",
        ),
        (
            "two_normalizers",
            "this loss function divided parts of its loss by 2 different counts",
        ),
    ],
)
def test_an_ambiguous_normalizer_under_accumulation_is_an_error_naming_the_fix(variant, says):
    loop = build(loops.testing.replica_strategy(2), variant=variant, grad_accum_steps=2)
    with pytest.raises(ValueError) as refused:
        loop.train(1)
    message = str(refused.value)
    assert "grad_accum_steps=2 weights each micro-batch's gradients by" in message
    assert says in message
    assert "divide it once, by loops.scale_to_global_batch(per_example_loss, count)" in message
    assert loop.state.step == 0


def test_without_accumulation_the_normalizer_does_not_matter_and_nothing_is_refused():
    loop = build(loops.testing.replica_strategy(2), variant="by_hand")
    logs = loop.train(4)
    assert logs["examples"].tolist() == [8, 8, 8, 6]


class Float16Regression(loops.Loop):
    """The README's Regression under mixed_float16: it lists only its model and optimizer."""

    def build(self):
        self.model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")]
        )
        self.optimizer = keras.optimizers.SGD(0.01)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model)

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def replica_loss(self, x, y):
        count = loops.global_count(tf.shape(y)[0])
        error = tf.squeeze(tf.cast(self.model(x, training=True), tf.float32), -1) - y
        return loops.scale_to_global_batch(error**2, count), {}

    def train_step(self, iterator):
        result = self.update(self.replica_loss, args=next(iterator))
        return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}


def test_a_float16_definition_that_lists_only_its_own_objects_resumes_with_its_loss_scale(
    tmp_path,
):
    x = np.random.default_rng(2).normal(size=(64, 3)).astype(np.float32)
    y = x.sum(axis=1)

    def make(model_dir):
        return loops.Trainer(
            Float16Regression(),
            strategy=loops.testing.replica_strategy(2),
            train_data=lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
            steps_per_loop=3,
            model_dir=str(model_dir),
            mixed_precision="mixed_float16",
            loss_scale_growth_steps=2,
            progress=loops.testing.quiet_progress(),
        )

    first = make(tmp_path)
    logs = first.train(5)
    first.close()
    # Doubled after steps 2 and 4, one finite step since.
    assert logs["loss_scale"].tolist() == [2.0**15] * 2 + [2.0**16] * 2 + [2.0**17]
    assert logs["overflow"].tolist() == [0] * 5
    resumed = make(tmp_path)
    assert resumed.state.step == 5
    assert resumed.definition.update.loss_scale.scale.numpy() == 2.0**17
    assert resumed.definition.update.loss_scale.finite_steps.numpy() == 1
    assert resumed.train(6)["loss_scale"].tolist() == [2.0**17]
    assert resumed.definition.update.loss_scale.scale.numpy() == 2.0**18
    resumed.close()
