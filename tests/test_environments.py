"""The RL loops on an environment of the user's own: the interface of loops.environments."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import make_trainer
from loops.input import environments
from loops.kinds import rl
from loops_data import cartpole

PAYOFF = (0.2, 0.8)  # the chance that each arm pays a reward of 1


class TwoArmedBandit:
    """One-step episodes: pulling arm a pays 1 with chance PAYOFF[a], else 0.

    The observation is a constant 1; the reward's coin is the step's uniform
    noise, as the interface asks, so 1 and N replicas see the same rewards.
    """

    observation_size = 1
    num_actions = 2
    noise_size = 1

    def reset(self, uniform_noise):
        count = tf.shape(uniform_noise)[0]
        return environments.State(tf.ones([count, 1]), tf.zeros([count], tf.int32))

    def step(self, state, actions, uniform_noise):
        chance = tf.gather(tf.constant(PAYOFF), actions)
        reward = tf.cast(uniform_noise[:, 0] < chance, tf.float32)
        # Every episode ends after its one step, for good: terminated, not truncated.
        terminated = tf.ones_like(actions, tf.bool)
        return self.reset(uniform_noise), environments.Transition(
            reward=reward,
            terminated=terminated,
            truncated=tf.logical_not(terminated),
            final_observation=state.observation,
        )


def policy_value_network():
    """observation -> (2 logits, value), all zero at first: a uniform policy."""
    observations = keras.Input((1,))
    logits = keras.layers.Dense(2, kernel_initializer="zeros")(observations)
    value = keras.layers.Dense(1, kernel_initializer="zeros")(observations)
    return keras.Model(observations, [logits, keras.layers.Reshape(())(value)])


def q_network():
    """observation -> the 2 arms' values, 0 at first."""
    observations = keras.Input((1,))
    return keras.Model(
        observations, keras.layers.Dense(2, kernel_initializer="zeros")(observations)
    )


def bandit_ppo(**args):
    return make_trainer(
        rl.ActorCriticLoop,
        environment=TwoArmedBandit(),
        model_fn=policy_value_network,
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        num_envs=8,
        rollout_length=8,
        global_batch_size=32,
        epochs=2,
        seed=1,
        progress=loops.testing.quiet_progress(),
        **args,
    )


def test_ppo_learns_to_pull_the_better_arm():
    loop = bandit_ppo(steps_per_loop=20)
    loop.train(40)
    results = loop.definition.results_extra()
    # Every step of every environment ends an episode.
    assert results["episodes"] == results["env_steps"] == 40 * 8 * 8
    logits, _ = loop.definition.model(tf.ones([1, 1]))
    better_arm = float(tf.nn.softmax(logits)[0, 1])
    assert better_arm > 0.99, better_arm
    # The uniform policy it starts from earns 0.5 a pull, the better arm 0.8.
    assert results["mean_return_100"] >= 0.7, results


def test_dqn_learns_the_value_of_each_arm():
    loop = loops.Trainer(
        rl.DQNLoop(
            environment=TwoArmedBandit(),
            model_fn=q_network,
            optimizer_fn=lambda: keras.optimizers.Adam(0.05),
            num_envs=8,
            rollout_length=4,
            global_batch_size=32,
            buffer_capacity=1024,
            learning_starts=64,
            exploration_steps=640,
        ),
        steps_per_loop=20,
        seed=1,
        progress=loops.testing.quiet_progress(),
    )
    loop.train(40)
    # An episode of one step has no future: each arm's value is its chance of paying.
    values = loop.definition.model(tf.ones([1, 1])).numpy()[0]
    np.testing.assert_allclose(values, PAYOFF, atol=0.08)
    # Greedy on the better arm after exploring, with epsilon 0.05 it earns about 0.785.
    assert loop.definition.results_extra()["mean_return_100"] >= 0.65


def test_a_users_environment_gives_the_same_numbers_on_1_and_2_replicas():
    runs = loops.testing.assert_replica_parity(
        lambda strategy: bandit_ppo(strategy=strategy, steps_per_loop=2),
        num_steps=4,
        replica_counts=(1, 2),
        # As for CartPole: the policy loss cancels to rounding, compared absolutely below.
        compare_logs=["value_loss", "entropy", "mean_return_100", "episodes_finished"],
    )
    np.testing.assert_allclose(
        runs[2]["logs"]["policy_loss"], runs[1]["logs"]["policy_loss"], rtol=0, atol=1e-6
    )
    np.testing.assert_array_equal(runs[1]["logs"]["episodes_finished"], [64] * 4)


# ---- Objects that are not environments. ----


class NoStep:
    observation_size = 1
    num_actions = 2
    noise_size = 1

    def reset(self, uniform_noise):
        return TwoArmedBandit().reset(uniform_noise)


class TextSize(TwoArmedBandit):
    observation_size = "1"


class NegativeNoise(TwoArmedBandit):
    noise_size = -1


def test_a_wrong_environment_is_named_before_anything_is_built():
    built = []

    def model_fn():
        built.append("model")
        return q_network()

    with pytest.raises(
        TypeError,
        match=r"NoStep object .* is not an environment: it has no "
        r"step\. .*step\(state, actions, uniform_noise\)",
    ):
        rl.DQNLoop(environment=NoStep(), model_fn=model_fn)
    with pytest.raises(
        TypeError, match="has no observation_size, num_actions, noise_size, reset, step"
    ):
        rl.ActorCriticLoop(environment=object(), model_fn=model_fn)
    with pytest.raises(TypeError, match="observation_size of .* must be a whole number, got '1'"):
        rl.DQNLoop(environment=TextSize(), model_fn=model_fn)
    with pytest.raises(ValueError, match="noise_size of .* must be >= 0, got -1"):
        rl.DQNLoop(environment=NegativeNoise(), model_fn=model_fn)
    with pytest.raises(TypeError, match="model_fn must be a function of no arguments .* got None"):
        rl.ActorCriticLoop(environment=TwoArmedBandit(), model_fn=None)
    assert built == []


def test_cartpole_and_the_bandit_satisfy_the_interface():
    for environment in (cartpole.CartPole(), TwoArmedBandit()):
        environments.check_environment(environment)
        assert isinstance(environment, loops.Environment)
    assert not isinstance(NoStep(), loops.Environment)
