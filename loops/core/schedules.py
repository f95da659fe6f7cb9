"""Learning-rate schedules by name, and schedules from a function of the step or epoch.

Every schedule is a Keras `LearningRateSchedule` of the optimizer's iteration
count, which is checkpointed with the optimizer, so a resumed run continues
the schedule where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from loops.vocabulary.whole_numbers import check_whole

SCHEDULE_NAMES = ("constant", "step", "cosine", "warmup_cosine")


class PerStep(keras.optimizers.schedules.LearningRateSchedule):
    """The rate `function(step)`; `function` takes a float32 scalar tensor, made of TF ops."""

    def __init__(self, function: Callable[[tf.Tensor], tf.Tensor]):
        self.function = function

    def __call__(self, step):
        return tf.cast(self.function(tf.cast(step, tf.float32)), tf.float32)


class PerEpoch(keras.optimizers.schedules.LearningRateSchedule):
    """The rate `function(epoch)`, epoch = step // steps_per_epoch (a float32 tensor)."""

    def __init__(self, function: Callable[[tf.Tensor], tf.Tensor], steps_per_epoch: int):
        check_whole("steps_per_epoch", steps_per_epoch)
        self.function = function
        self.steps_per_epoch = steps_per_epoch

    def __call__(self, step):
        epoch = tf.math.floordiv(tf.cast(step, tf.float32), float(self.steps_per_epoch))
        return tf.cast(self.function(epoch), tf.float32)


def make_schedule(
    name: str,
    *,
    learning_rate: float,
    total_steps: int,
    warmup_steps: int = 0,
    step_size: int = 1000,
    step_factor: float = 0.1,
    final_fraction: float = 0.0,
):
    """The schedule called `name`, or the constant `learning_rate` for "constant".

    Args:
        name: one of SCHEDULE_NAMES.
        learning_rate: the peak (and starting, without warm-up) rate.
        total_steps: the step where cosine decay ends (the run's length).
        warmup_steps: warmup_cosine: steps of linear warm-up from 0.
        step_size, step_factor: step: multiply the rate by step_factor every step_size steps.
        final_fraction: cosine, warmup_cosine: the final rate as a fraction of learning_rate.

    Raises:
        ValueError: an unknown name or a value out of range, with the fix.
    """
    if name not in SCHEDULE_NAMES:
        raise ValueError(
            f"Unknown learning-rate schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}."
        )
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}.")
    if name == "constant":
        return learning_rate
    if name == "step":
        if step_size < 1 or not 0 < step_factor <= 1:
            raise ValueError(
                f"The step schedule needs step_size >= 1 and 0 < step_factor <= 1, "
                f"got step_size={step_size!r}, step_factor={step_factor!r}."
            )
        return keras.optimizers.schedules.ExponentialDecay(
            learning_rate, decay_steps=step_size, decay_rate=step_factor, staircase=True
        )
    if not 0 <= final_fraction <= 1:
        raise ValueError(f"final_fraction must lie in [0, 1], got {final_fraction!r}.")
    if name == "cosine":
        warmup_steps = 0
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(
            f"warmup_steps must lie in [0, total_steps={total_steps}), got "
            f"{warmup_steps!r}; shorten the warm-up or train longer."
        )
    if warmup_steps:
        return keras.optimizers.schedules.CosineDecay(
            0.0,
            decay_steps=total_steps - warmup_steps,
            alpha=final_fraction,
            warmup_target=learning_rate,
            warmup_steps=warmup_steps,
        )
    return keras.optimizers.schedules.CosineDecay(
        learning_rate, decay_steps=total_steps, alpha=final_fraction
    )
