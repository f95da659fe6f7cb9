"""Evaluation episodes of an RL loop: a greedy policy played from seeded starts until all end."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from loops.input import environments


def play_greedy_episodes(
    environment: environments.Environment,
    greedy_actions: Callable[[tf.Tensor], tf.Tensor],
    *,
    count: int,
    max_steps: int,
    seed: Callable[[tf.Tensor | int], tf.Tensor],
) -> tuple[tf.Tensor, tf.Tensor]:
    """Plays `count` episodes until every one has ended or `max_steps` have passed.

    Args:
        environment: what to step.
        greedy_actions: observations [count, observation_size] -> actions [count] int32.
        count: episodes, played side by side.
        max_steps: steps after which an episode that has not ended counts with
            the return it has.
        seed: t -> the stateless seed of the environment noise of step t (-1: the starts).

    Returns:
        (returns [count] float32, ended [count] bool).
    """

    def noise(t):
        return tf.random.stateless_uniform([count, environment.noise_size], seed(t))

    start = environment.reset(noise(-1))

    def play(t, observation, elapsed, returns, ended):
        state = environments.State(observation, elapsed)
        state, transition = environment.step(state, greedy_actions(observation), noise(t))
        live = tf.logical_not(ended)
        returns += tf.where(live, tf.cast(transition.reward, tf.float32), 0.0)
        ended = tf.logical_or(ended, tf.logical_or(transition.terminated, transition.truncated))
        return t + 1, state.observation, state.elapsed_steps, returns, ended

    def unfinished(t, observation, elapsed, returns, ended):
        return tf.logical_and(t < max_steps, tf.logical_not(tf.reduce_all(ended)))

    _, _, _, returns, ended = tf.while_loop(
        unfinished,
        play,
        (
            tf.constant(0),
            start.observation,
            start.elapsed_steps,
            tf.zeros([count]),
            tf.zeros([count], tf.bool),
        ),
    )
    return returns, ended
