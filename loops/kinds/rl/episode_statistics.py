"""The count of finished episodes, their latest returns and the environment steps taken."""

from __future__ import annotations

import keras
import tensorflow as tf

from loops.kinds.rl.state_variables import StateVariables

RETURN_WINDOW = 100  # mean_return_100 averages the returns of this many latest episodes


class EpisodeStatistics(StateVariables):
    """Episodes finished, the returns of the latest RETURN_WINDOW of them, environment steps.

    Written in cross-replica context from the gathered steps of all
    environments, so every replica count keeps the same numbers.
    """

    recent_returns: keras.Variable
    episodes: keras.Variable
    env_steps: keras.Variable

    def __init__(self) -> None:
        super().__init__(name="episode_statistics")
        self.add("recent_returns", tf.zeros([RETURN_WINDOW]), "float32")
        self.add("episodes", 0, "int64")
        self.add("env_steps", 0, "int64")

    def mean_return(self) -> tf.Tensor:
        """Mean return of the last 100 finished episodes (0 before the first one ends)."""
        finished = tf.minimum(tf.convert_to_tensor(self.episodes), RETURN_WINDOW)
        return tf.math.divide_no_nan(
            tf.reduce_sum(self.recent_returns), tf.cast(finished, tf.float32)
        )

    def record(self, ended_return: tf.Tensor, ended: tf.Tensor, env_steps: int) -> tf.Tensor:
        """Adds the episodes that `ended` with their `ended_return`s; how many finished.

        Args:
            ended_return, ended: [T, num_envs], of all environments, time-major.
            env_steps: the environment steps these were.
        """
        # Row-major order (time, then environment): the same on any replica count.
        returns = tf.boolean_mask(ended_return, ended)
        finished = tf.size(returns, out_type=tf.int64)
        kept = returns[-RETURN_WINDOW:]
        kept_count = tf.size(kept, out_type=tf.int64)
        slots = (
            tf.convert_to_tensor(self.episodes) + finished - kept_count + tf.range(kept_count)
        ) % RETURN_WINDOW
        self.recent_returns.value.scatter_update(tf.IndexedSlices(kept, slots))
        self.episodes.assign_add(finished)
        self.env_steps.assign_add(env_steps)
        return finished
