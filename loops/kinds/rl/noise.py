"""What each random number of the RL loops is for, and the stateless seed it is drawn from."""

from __future__ import annotations

import enum

import tensorflow as tf


class Noise(enum.IntEnum):
    """What a random number is for; each purpose has its own stateless stream."""

    ENVIRONMENT = 1  # the environment's own: its start states and any randomness of a step
    ACTION = 2
    EXPLORE = 3
    SHUFFLE = 4
    REPLAY = 5
    EVALUATION = 6  # the evaluation episodes' starts and steps, the same at every evaluation


def stateless_seed(seed: int, purpose: Noise, *data) -> tf.Tensor:
    """The [2] int64 seed of `purpose` under the run's `seed`, with each of `data` folded in."""
    folded = tf.constant([seed, int(purpose)], tf.int64)
    for value in data:
        folded = tf.random.experimental.stateless_fold_in(folded, tf.cast(value, tf.int64))
    return folded
