"""Target-network updates (hard copy every K steps, soft Polyak averaging) for any step.

Call them in cross-replica context (in `train_step`, outside `strategy.run`):
an assignment there writes every replica's copy of a mirrored variable with
the same value, so the target stays identical on all replicas.

Example, at the end of a train_step:

    loops.target_networks.copy_every(
        self.target, self.online, step=self.global_step + 1, every=100)
"""

from __future__ import annotations

import tensorflow as tf


def _variables(network) -> list:
    """The variables of a Keras model / layer, or a list of variables as given."""
    variables = getattr(network, "variables", network)
    return list(variables)


def _pairs(target, online) -> list[tuple]:
    targets, onlines = _variables(target), _variables(online)
    if len(targets) != len(onlines):
        raise ValueError(
            f"The target has {len(targets)} variables and the online network "
            f"{len(onlines)}; build the target with the same architecture as the "
            "online network.")
    for target_variable, online_variable in zip(targets, onlines):
        if tuple(target_variable.shape) != tuple(online_variable.shape):
            raise ValueError(
                f"Target variable {target_variable.name} has shape {target_variable.shape} "
                f"but online variable {online_variable.name} has {online_variable.shape}; "
                "build both networks from the same function.")
    return list(zip(targets, onlines))


def copy(target, online) -> None:
    """Sets every target variable to the online network's value now."""
    for target_variable, online_variable in _pairs(target, online):
        target_variable.assign(online_variable)


def copy_every(target, online, *, step: tf.Tensor | int, every: int) -> tf.Tensor:
    """Copies the online weights into the target when `step` is a multiple of `every`.

    Args:
        target, online: Keras models (or equal-length lists of variables).
        step: the number of updates made so far, counting the current one
            (`self.global_step + 1` inside train_step), so the target changes
            exactly after updates every, 2*every, ...
        every: the copy period K, >= 1.

    Returns:
        A bool scalar: whether this call copied.
    """
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be a whole number >= 1, got {every!r}.")
    pairs = _pairs(target, online)
    due = tf.equal(tf.math.floormod(tf.cast(step, tf.int64), every), 0)

    def assign():
        for target_variable, online_variable in pairs:
            target_variable.assign(online_variable)
        return tf.constant(True)

    return tf.cond(due, assign, lambda: tf.constant(False))


def soft_update(target, online, *, tau: float | tf.Tensor) -> None:
    """Moves the target towards the online network: target = tau * online + (1 - tau) * target.

    The online network is only read.

    Args:
        target, online: Keras models (or equal-length lists of variables).
        tau: the fraction of the online weights taken, in (0, 1].
    """
    if isinstance(tau, (int, float)) and not 0 < tau <= 1:
        raise ValueError(f"tau must be in (0, 1], got {tau!r}; 0.005 is a common choice.")
    for target_variable, online_variable in _pairs(target, online):
        target_variable.assign(
            tau * tf.convert_to_tensor(online_variable)
            + (1 - tau) * tf.convert_to_tensor(target_variable))

