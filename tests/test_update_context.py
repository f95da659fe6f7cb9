"""`loops.Update` from its typed context alone: no definition, no Trainer, the same update."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops

# Small whole numbers and a power-of-two learning rate: every product and sum
# of the step below is exact in float32, so the update is compared exactly.
FEATURES = np.array([[1, 2, 0], [0, 1, 1], [2, 0, 1], [1, 1, 1]], np.float32)
TARGETS = np.array([3, -1, 2, 0], np.float32)
KERNEL = np.array([[1], [0], [-1]], np.float32)
BIAS = np.array([1], np.float32)
LEARNING_RATE = 0.25


def sgd_step_by_hand():
    """The kernel, bias and loss after one SGD step on the mean squared error of all rows."""
    errors = FEATURES @ KERNEL[:, 0] + BIAS[0] - TARGETS
    loss = np.mean(errors**2)
    kernel_gradient = 2 * FEATURES.T @ errors / len(TARGETS)
    bias_gradient = 2 * np.sum(errors) / len(TARGETS)
    kernel = KERNEL - LEARNING_RATE * kernel_gradient[:, None]
    return kernel, BIAS - LEARNING_RATE * bias_gradient, loss


def replica_rows(strategy, values):
    """Each replica's consecutive share of `values`' rows."""
    share = len(values) // strategy.num_replicas_in_sync
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(values[context.replica_id_in_sync_group * share :][:share])
    )


@pytest.mark.parametrize("num_replicas,grad_accum_steps", [(1, 1), (2, 1), (2, 2)])
def test_an_update_made_from_a_context_alone_applies_the_exact_sgd_step(
    num_replicas, grad_accum_steps
):
    strategy = loops.testing.replica_strategy(num_replicas)
    with strategy.scope():
        context = loops.UpdateContext(
            strategy=strategy,
            global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
            nonfinite=loops.NonFiniteUpdates(strategy, skips=False),
            options=loops.UpdateOptions(grad_accum_steps=grad_accum_steps),
        )
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.set_weights([KERNEL, BIAS])
        optimizer = keras.optimizers.SGD(LEARNING_RATE)
        optimizer.build(model.trainable_variables)
        update = loops.Update(context, optimizer, model)

    def replica_loss(features, targets):
        count = loops.global_count(tf.shape(targets)[0])
        errors = tf.squeeze(model(features, training=True), -1) - targets
        return loops.scale_to_global_batch(errors**2, count), {}

    step = tf.function(lambda *args: update(replica_loss, args=args))
    result = step(replica_rows(strategy, FEATURES), replica_rows(strategy, TARGETS))

    kernel, bias, loss = sgd_step_by_hand()
    np.testing.assert_array_equal(model.get_weights()[0], kernel)
    np.testing.assert_array_equal(model.get_weights()[1], bias)
    assert float(result.sums["loss"]) == loss
    assert int(result.outputs["nonfinite"].value) == 0
    assert not context.update_states and not context.weight_averages


def test_an_update_is_refused_anything_but_a_context_or_a_definition():
    with pytest.raises(TypeError) as raised:
        loops.Update(tf.distribute.get_strategy(), None, lambda: [])
    assert str(raised.value) == (
        "loops.Update takes the UpdateContext it runs in, or in a definition's build the "
        "definition itself (loops.Update(self, optimizer, model)); got a "
        "_DefaultDistributionStrategy. "
        "Pass loops.UpdateContext(strategy=..., global_step=..., nonfinite=...) or self."
    )


def test_a_definition_not_handed_to_a_trainer_has_no_update_context_yet():
    with pytest.raises(AttributeError) as raised:
        loops.Update(loops.Loop(), None, lambda: [])
    assert str(raised.value) == (
        "Loop has no update_context yet: a definition gets its strategy, global_step and "
        "step options from the Trainer it is handed to (loops.Trainer(Loop(...), ...)), "
        "which then calls its build(); use them in build and the steps."
    )


def test_update_options_are_checked_by_their_declarations():
    with pytest.raises(ValueError) as raised:
        loops.UpdateOptions(grad_accum_steps=0)
    assert str(raised.value) == (
        "grad_accum_steps must be a whole number >= 1 (1: no accumulation), got 0."
    )


class Regression(loops.Loop):
    """A definition whose one Update is made the usual way: `loops.Update(self, ...)`."""

    def build(self):
        self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        self.optimizer = keras.optimizers.SGD(LEARNING_RATE)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model)


def test_a_definitions_updates_take_the_context_its_trainer_gives():
    trainer = loops.Trainer(
        Regression(),
        strategy=loops.testing.replica_strategy(2),
        on_nonfinite="skip",
        grad_accum_steps=2,
        ema_decay=0.5,
        health_every=3,
        progress=loops.testing.quiet_progress(),
    )
    definition = trainer.definition
    context = definition.update.context
    assert context is definition.update_context
    assert context.strategy is trainer.strategy
    assert context.global_step is trainer.global_step
    # The run's step options themselves: an UpdateOptions with the step section's beside.
    assert context.options is trainer.step_options
    assert isinstance(context.options, loops.UpdateOptions)
    assert context.options.values() == {
        **loops.UpdateOptions(
            mixed_precision="none",
            loss_scale_growth_steps=2000,
            grad_accum_steps=2,
            ema_decay=0.5,
            jit_compile=False,
            health_every=3,
        ).values(),
        **trainer.run_config.step.values(),
        "max_recoveries": 3,  # filled in by the step options (None: the default)
    }
    assert context.nonfinite.skips
    assert trainer.saved_items()["weight_averages"] is context.weight_averages
    assert context.weight_averages.updates == [definition.update.average]
