"""Generalized advantage estimation (GAE): the advantages and value targets of a rollout."""

from __future__ import annotations

import tensorflow as tf


def advantages_and_returns(
    *,
    rewards: tf.Tensor,
    values: tf.Tensor,
    next_values: tf.Tensor,
    terminated: tf.Tensor,
    truncated: tf.Tensor,
    gamma: float,
    lambda_: float,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Generalized advantage estimates and the value targets (returns) they give.

    All arguments are time-major, [T, num_envs]. `next_values[t]` is the value
    of the state the action at t led to (before any reset), so an episode cut
    by the time limit is bootstrapped from its real last state, while a
    terminated one is not bootstrapped at all. No estimate reaches across the
    end of an episode. lambda_ = 1 gives the discounted returns, 0 the
    one-step TD errors.

        delta[t] = rewards[t] + gamma * (1 - terminated[t]) * next_values[t] - values[t]
        advantage[t] = delta[t] + gamma * lambda_ * (1 - ended[t]) * advantage[t + 1]
        return[t] = advantage[t] + values[t]

    Returns:
        (advantages, returns), each [T, num_envs] float32.
    """
    rewards = tf.convert_to_tensor(rewards, tf.float32)
    values = tf.convert_to_tensor(values, tf.float32)
    continues = 1.0 - tf.cast(terminated, tf.float32)
    ended = tf.cast(
        tf.logical_or(tf.cast(terminated, tf.bool), tf.cast(truncated, tf.bool)), tf.float32
    )
    deltas = rewards + gamma * continues * tf.convert_to_tensor(next_values, tf.float32) - values
    advantages = tf.scan(
        lambda later, inputs: inputs[0] + gamma * lambda_ * (1.0 - inputs[1]) * later,
        (deltas, ended),
        initializer=tf.zeros_like(deltas[0]),
        reverse=True,
    )
    return advantages, advantages + values
