"""CartPole-v1 as batched TensorFlow ops, so rollouts run inside a tf.function.

The dynamics, thresholds, reward and 500-step time limit are those of
Gymnasium's CartPole-v1 (Barto, Sutton and Anderson's cart-pole with Euler
integration). Every function works on a batch of environments and is pure:
state in, state out, with the randomness passed in as uniform noise so the
caller decides how it is keyed (the RL loops key it on the global environment
index, which makes 1 and N replicas step identical environments).

`CartPole()` is these functions as a `loops.environments.Environment`, the
object the RL loops take.

Example:

    state = cartpole.reset(tf.random.uniform([8, cartpole.OBSERVATION_SIZE]))
    for _ in range(10):
        state, step = cartpole.step(
            state, actions=tf.ones([8], tf.int32),
            reset_noise=tf.random.uniform([8, cartpole.OBSERVATION_SIZE]))
"""

from __future__ import annotations

import math

import tensorflow as tf

from loops.input import environments

GRAVITY = 9.8
CART_MASS = 1.0
POLE_MASS = 0.1
TOTAL_MASS = CART_MASS + POLE_MASS
POLE_HALF_LENGTH = 0.5
POLE_MASS_LENGTH = POLE_MASS * POLE_HALF_LENGTH
FORCE_MAGNITUDE = 10.0
TIME_STEP = 0.02  # seconds between state updates
# An episode terminates when the pole leans more than 12 degrees or the cart
# leaves the track (|x| > 2.4), and is truncated after 500 steps.
ANGLE_LIMIT = 12 * 2 * math.pi / 360
POSITION_LIMIT = 2.4
MAX_EPISODE_STEPS = 500
# A fresh episode starts with every state component uniform in [-0.05, 0.05].
RESET_RANGE = 0.05

OBSERVATION_SIZE = 4  # cart position, cart velocity, pole angle, pole angular velocity
NUM_ACTIONS = 2  # 0 pushes the cart left, 1 pushes it right


# The batch types of the loops' environment interface, which CartPole implements.
State = environments.State
Transition = environments.Transition


def reset(noise: tf.Tensor) -> State:
    """Fresh episodes from uniform [0, 1) noise of shape [num_envs, 4]."""
    observation = (2.0 * tf.convert_to_tensor(noise, tf.float32) - 1.0) * RESET_RANGE
    return State(observation, tf.zeros(tf.shape(observation)[:1], tf.int32))


def dynamics(observation: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
    """One Euler step of the cart-pole equations: the next [num_envs, 4] observation."""
    x, x_dot, theta, theta_dot = tf.unstack(tf.convert_to_tensor(observation, tf.float32), axis=-1)
    force = tf.where(tf.equal(actions, 1), FORCE_MAGNITUDE, -FORCE_MAGNITUDE)
    cos_theta, sin_theta = tf.cos(theta), tf.sin(theta)
    temp = (force + POLE_MASS_LENGTH * tf.square(theta_dot) * sin_theta) / TOTAL_MASS
    theta_acc = (GRAVITY * sin_theta - cos_theta * temp) / (
        POLE_HALF_LENGTH * (4.0 / 3.0 - POLE_MASS * tf.square(cos_theta) / TOTAL_MASS)
    )
    x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos_theta / TOTAL_MASS
    # Gymnasium's "euler" integrator: positions move with the old velocities.
    return tf.stack(
        [
            x + TIME_STEP * x_dot,
            x_dot + TIME_STEP * x_acc,
            theta + TIME_STEP * theta_dot,
            theta_dot + TIME_STEP * theta_acc,
        ],
        axis=-1,
    )


def step(state: State, actions: tf.Tensor, reset_noise: tf.Tensor) -> tuple[State, Transition]:
    """Steps every environment once and resets those whose episode ended.

    Args:
        state: the environments' current state.
        actions: [num_envs] int, 0 (push left) or 1 (push right).
        reset_noise: [num_envs, 4] uniform [0, 1) noise; the start state of an
            environment whose episode ends in this step.

    Returns:
        (next state, with ended episodes already reset; the step's Transition).
        The reward is 1 for every step taken, the terminal one included; an
        episode terminates when the pole leans past 12 degrees or the cart
        leaves the track, and is truncated at its 500th step (both flags are
        set when that step also terminates it).
    """
    final_observation = dynamics(state.observation, actions)
    elapsed_steps = state.elapsed_steps + 1
    x, theta = final_observation[:, 0], final_observation[:, 2]
    terminated = (tf.abs(x) > POSITION_LIMIT) | (tf.abs(theta) > ANGLE_LIMIT)
    # As Gymnasium's TimeLimit: a step that both terminates and hits the limit
    # reports both flags; `terminated` decides that the episode has no future.
    truncated = elapsed_steps >= MAX_EPISODE_STEPS
    ended = terminated | truncated
    fresh = reset(reset_noise)
    next_state = State(
        tf.where(ended[:, None], fresh.observation, final_observation),
        tf.where(ended, fresh.elapsed_steps, elapsed_steps),
    )
    reward = tf.ones_like(x)
    return next_state, Transition(reward, terminated, truncated, final_observation)


class CartPole:
    """CartPole-v1 as the environment of the RL loops (a `loops.environments.Environment`).

    Observations are (x, x_dot, theta, theta_dot); action 0 pushes the cart
    left, 1 right. Each reset or step takes 4 uniform numbers per environment:
    the start state of an episode that begins.
    """

    observation_size = OBSERVATION_SIZE
    num_actions = NUM_ACTIONS
    noise_size = OBSERVATION_SIZE

    def reset(self, uniform_noise: tf.Tensor) -> State:
        return reset(uniform_noise)

    def step(
        self, state: State, actions: tf.Tensor, uniform_noise: tf.Tensor
    ) -> tuple[State, Transition]:
        return step(state, actions, uniform_noise)

    def __repr__(self) -> str:
        return "CartPole()"
