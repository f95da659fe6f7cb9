"""Slowly moving copies of a network's weights: target networks and moving averages.

Target networks are updated by a hard copy every K steps or softly (Polyak
averaging); `MovingAverage` keeps an early-debiased exponential moving average.
Call them in cross-replica context (in `train_step`, outside `strategy.run`):
an assignment there writes every replica's copy of a mirrored variable with
the same value, so the copy stays identical on all replicas.

Example, at the end of a train_step:

    loops.core.target_networks.copy_every(
        self.target, self.online, step=self.global_step + 1, every=100)
"""

from __future__ import annotations

import tensorflow as tf

from loops.vocabulary.whole_numbers import check_whole


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
            "online network."
        )
    for target_variable, online_variable in zip(targets, onlines):
        if tuple(target_variable.shape) != tuple(online_variable.shape):
            raise ValueError(
                f"Target variable {target_variable.name} has shape {target_variable.shape} "
                f"but online variable {online_variable.name} has {online_variable.shape}; "
                "build both networks from the same function."
            )
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
    check_whole("every", every)
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
            + (1 - tau) * tf.convert_to_tensor(target_variable)
        )


class MovingAverage:
    """An exponential moving average of some variables, debiased early in training.

    Update k (counting from 0) moves each average towards its variable with the
    decay min(decay, (1 + k) / (10 + k)), as `tf.train.ExponentialMovingAverage`
    does with `num_updates`. The averages start as a copy of the variables.

    Why this schedule and not Adam-style bias correction (a zero-initialized
    average divided by 1 - decay^k): while k is much smaller than
    1 / (1 - decay), the bias-corrected average weighs all updates since the
    first about equally, so it keeps the early weights of a network that has
    since moved far, and an average of far-apart weights is a poor network
    (a GAN generator on the ring at 0.999 covered 1 mode of 8 after 2,000
    steps, against 8 with this schedule; benchmarks/RESULTS.md). Here the average spans
    about the last (10 + k) / 9 updates, a tenth of the history, so it
    follows the trained weights early on (the initial weights' share is below
    1e-6 after 15 updates; a plain 0.999 average keeps 74% after 300), and it
    is the plain average with `decay` once (1 + k) / (10 + k) reaches it
    (k = 8990 for 0.999).

    The update count is a variable: checkpoint `num_updates` with the averages
    and a resumed run averages exactly as an uninterrupted one. Create the
    object in the strategy's scope; call `update` in cross-replica context.

    Example, with a cloned model to hold the average:

        average_model = keras.models.clone_model(model)
        average = MovingAverage(average_model.weights, model.weights, decay=0.999)
        ...  # in train_step, after each optimizer step:
        average.update()
    """

    def __init__(self, averages, variables, *, decay: float, name: str = "moving_average"):
        """
        Args:
            averages: a Keras model (or list of variables) that holds the
                averages, shaped like `variables`; overwritten with their values.
            variables: the Keras model (or list of variables) to average; only read.
            decay: the decay once the average is debiased, in (0, 1), e.g. 0.999.
            name: prefixes the name of the update counter.

        Raises:
            ValueError: `decay` is out of range, or the two do not match.
        """
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), e.g. 0.999; got {decay!r}.")
        self.decay = float(decay)
        pairs = _pairs(averages, variables)
        self.averages = [average for average, _ in pairs]
        self.variables = [variable for _, variable in pairs]
        copy(self.averages, self.variables)
        # One count for all replicas, written in cross-replica context.
        self.num_updates = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name=f"{name}_num_updates",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )

    def current_decay(self) -> tf.Tensor:
        """The decay the next `update` uses: min(decay, (1 + k) / (10 + k)), float32."""
        count = tf.cast(self.num_updates, tf.float32)
        return tf.minimum(tf.constant(self.decay, tf.float32), (1.0 + count) / (10.0 + count))

    def update(self, weight: float | tf.Tensor = 1.0) -> None:
        """Moves every average towards its variable's current value and counts the update.

        Args:
            weight: 1.0, or a float32 0.0 / 1.0 tensor: 0.0 leaves the averages
                and the count as they are (an update that was skipped).
        """
        if isinstance(weight, (int, float)) and weight == 1.0:
            soft_update(self.averages, self.variables, tau=1.0 - self.current_decay())
            self.num_updates.assign_add(1)
            return
        weight = tf.cast(weight, tf.float32)
        tau = weight * (1.0 - self.current_decay())
        for average, variable in _pairs(self.averages, self.variables):
            # Written as a step towards the variable, so that a weight of 0 adds exactly 0.
            step = tf.cast(tau, average.dtype) * (tf.convert_to_tensor(variable) - average)
            average.assign_add(step)
        self.num_updates.assign_add(tf.cast(weight, tf.int64))
