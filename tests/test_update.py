"""The one update path: every loop (classifier, GAN, PPO, DQN) follows on_nonfinite the same way."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_environments import TwoArmedBandit, policy_value_network, q_network

import loops
from conftest import OneWeight, make_trainer
from loops.kinds import gan, rl
from loops_data.ring import Ring
from loops_models import gan as gan_models

BAD_STEP = 2  # the global step's value while the poisoned step runs: "Step 3" to the user


def poisoned(loop_class, method):
    """`loop_class` whose replica loss `method` is inf on replica 1 of 2 at BAD_STEP only."""

    def replica_loss(self, *args):
        loss, logs = getattr(loop_class, method)(self, *args)
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        bad = tf.logical_and(tf.equal(self.global_step, BAD_STEP), tf.equal(replica, 1))
        return loss + tf.where(bad, np.inf, 0.0), logs

    return type("Poisoned" + loop_class.__name__, (loop_class,), {method: replica_loss})


def make(kind, **args):
    common = dict(
        strategy=loops.testing.replica_strategy(2),
        steps_per_loop=2,
        progress=loops.testing.quiet_progress(),
        **args,
    )
    if kind == "ppo":
        return make_trainer(
            poisoned(rl.ActorCriticLoop, "_replica_loss"),
            environment=TwoArmedBandit(),
            model_fn=policy_value_network,
            optimizer_fn=lambda: keras.optimizers.Adam(0.05),
            num_envs=8,
            rollout_length=4,
            global_batch_size=16,
            epochs=1,
            seed=1,
            **common,
        )
    if kind == "dqn":
        return make_trainer(
            poisoned(rl.DQNLoop, "_replica_loss"),
            environment=TwoArmedBandit(),
            model_fn=q_network,
            optimizer_fn=lambda: keras.optimizers.Adam(0.05),
            num_envs=8,
            rollout_length=2,
            global_batch_size=16,
            buffer_capacity=256,
            learning_starts=16,
            seed=1,
            **common,
        )
    return make_trainer(
        poisoned(gan.GANLoop, "_replica_generator_loss"),
        generator_fn=lambda: gan_models.ring_generator(hidden_units=(16,), seed=4),
        discriminator_fn=lambda: gan_models.ring_discriminator(hidden_units=(16,), seed=4),
        generator_optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        discriminator_optimizer_fn=lambda: keras.optimizers.Adam(0.02),
        n_critic=1,
        train_data=lambda: Ring().global_batches(8, seed=3),
        seed=11,
        **common,
    )


def finite(loop):
    return all(np.all(np.isfinite(value)) for value in loops.testing.loop_weights(loop).values())


@pytest.mark.parametrize("kind", ["ppo", "dqn", "gan"])
def test_skip_leaves_out_the_update_an_inf_on_one_replica_poisons(kind):
    loop = make(kind, on_nonfinite="skip")
    logs = loop.train(4)
    assert logs["nonfinite"].tolist() == [0, 0, 1, 0]
    assert loop.state.skipped_steps == 1 and loop.write_results()["skipped_steps"] == 1
    assert finite(loop)


@pytest.mark.parametrize("kind", ["ppo", "dqn", "gan"])
def test_stop_names_the_step_and_goes_back_to_the_checkpoint(kind, tmp_path):
    loop = make(kind, on_nonfinite="stop", model_dir=str(tmp_path), checkpoint_every=2)
    with pytest.raises(
        loops.NonFiniteError,
        match=f"Step {BAD_STEP + 1}: the loss or the gradients .* back at its "
        f"last checkpoint \\(step {BAD_STEP}\\)",
    ):
        loop.train(4)
    assert loop.state.step == BAD_STEP and finite(loop)
    loop.close()


def test_an_update_clips_the_summed_gradient_and_adds_regularization_once():
    # One Dense weight, loss = w * x summed over the examples / count, plus an L2 term.
    strategy = loops.testing.replica_strategy(2)

    x = np.array([[1.0], [2.0], [3.0], [6.0]], np.float32)
    for clip_norm, expected_step in [(None, 3.0 + 1.0), (0.5, 0.5)]:
        # Gradient: mean(x) = 3, plus d(0.5 * w^2)/dw = 1 at w = 1.
        loop = loops.Trainer(
            OneWeight(clip_norm=clip_norm, l2=0.5),
            strategy=strategy,
            train_data=lambda: tf.data.Dataset.from_tensors(x),
            progress=loops.testing.quiet_progress(),
        )
        logs = loop.train(1)
        assert logs["loss"].tolist() == [3.0 + 0.5]
        assert float(loop.definition.model.weights[0].numpy()[0, 0]) == pytest.approx(
            1.0 - expected_step
        )
