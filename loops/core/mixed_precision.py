"""Mixed precision: the dtype policy a model is built under, and an all-reduced loss scale."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import keras
import tensorflow as tf

from loops.vocabulary import settings
from loops.vocabulary.whole_numbers import check_whole

DEFAULT_GROWTH_STEPS = settings.DEFAULT_LOSS_SCALE_GROWTH_STEPS


def check_policy(name: str) -> str:
    """Returns `name` if it is one of PRECISION_POLICIES.

    Raises:
        ValueError: naming the bad value and the choices.
    """
    return settings.BY_NAME["mixed_precision"].checked(name)


def needs_loss_scale(name: str) -> bool:
    """Whether policy `name` computes in float16, whose small range needs loss scaling."""
    return check_policy(name) == "mixed_float16"


@contextlib.contextmanager
def dtype_policy_scope(name: str) -> Iterator[None]:
    """Makes Keras layers created inside take policy `name`, then restores the old one.

    Keras' default dtype policy is global (per thread) state; setting it only
    while the model is built keeps it from leaking into the caller's models.
    Layers given an explicit `dtype` keep theirs, so a model can pin its last
    layer to float32. Variables stay float32 under both mixed policies.

    Args:
        name: one of PRECISION_POLICIES; "none" builds float32 layers.
    """
    check_policy(name)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32" if name == "none" else name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


class DynamicLossScale(tf.Module):
    """A loss scale for float16 training, the same on every replica and checkpointed.

    The replica multiplies its loss by `scale` before differentiating and
    divides the gradients by it, so small float16 gradients do not flush to
    zero. After each step, in cross-replica context, `update` halves the scale
    (never below 1) when the step was skipped as not finite on some replica,
    and doubles it after `growth_steps` finite steps in a row. The flag must be
    all-reduced (`loops.all_finite`): Keras' LossScaleOptimizer reads replica
    0's gradients only, so an overflow on another replica reached the weights
    (BUILD.md fact 8).

    Create it in the strategy's scope, and checkpoint it so a resumed run
    continues with its scale.
    """

    MIN_SCALE = 1.0

    def __init__(self, *, initial_scale: float = 2.0**15, growth_steps: int = DEFAULT_GROWTH_STEPS):
        """
        Args:
            initial_scale: the scale of the first step (>= 1).
            growth_steps: finite steps in a row after which the scale doubles.

        Raises:
            ValueError: initial_scale below 1 or growth_steps below 1.
        """
        super().__init__(name="loss_scale")
        if not initial_scale >= self.MIN_SCALE:
            raise ValueError(
                f"initial_scale must be >= 1 (2**15 is the usual start), got {initial_scale!r}."
            )
        check_whole(
            "growth_steps", growth_steps, note=" (finite steps before the loss scale doubles)"
        )
        self.growth_steps = growth_steps
        # Written once per step in cross-replica context; every replica reads its own copy.
        self.scale = tf.Variable(
            float(initial_scale),
            dtype=tf.float32,
            trainable=False,
            name="scale",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        self.finite_steps = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="finite_steps",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )

    def scale_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """loss * scale (float32); call in replica context inside the gradient tape."""
        return tf.cast(loss, tf.float32) * self.scale

    def unscale(self, gradients: Sequence[tf.Tensor | None]) -> list[tf.Tensor | None]:
        """Divides each gradient (dense or IndexedSlices; None stays None) by the scale."""
        inverse = 1.0 / self.scale
        unscaled: list[tf.Tensor | None] = []
        for gradient in gradients:
            if gradient is None:
                unscaled.append(None)
            elif isinstance(gradient, tf.IndexedSlices):
                unscaled.append(
                    tf.IndexedSlices(
                        gradient.values * tf.cast(inverse, gradient.dtype),
                        gradient.indices,
                        gradient.dense_shape,
                    )
                )
            else:
                unscaled.append(gradient * tf.cast(inverse, gradient.dtype))
        return unscaled

    def update(self, *, skipped: tf.Tensor, loss: tf.Tensor) -> dict[str, tf.Tensor]:
        """Applies the dynamic rule after one step; call in cross-replica context.

        A skipped step whose loss was finite, at a scale above 1, is an
        overflow of the scaled gradients: halving the scale is the remedy, and
        the step is reported as `overflow`, not as `nonfinite`. A non-finite
        loss (bad input, a diverged model) or non-finite gradients at scale 1
        are no matter of scale: those are `nonfinite`, for the Loop's
        `on_nonfinite` policy.

        Args:
            skipped: 1.0 when the step's update was skipped on every replica
                (from `loops.apply_if_finite`), else 0.0.
            loss: the step's loss summed over replicas (not scaled).

        Returns:
            Logs of the step: `loss_scale` (the scale it used), `overflow` and
            `nonfinite` (each 1.0 or 0.0; at most one of them is 1.0).
        """
        used = self.scale.read_value()
        finite = tf.equal(skipped, 0.0)
        finite_steps = tf.where(finite, self.finite_steps + 1, tf.zeros_like(self.finite_steps))
        doubled = used * 2.0
        # Growing into inf would stick there: inf / 2 is inf.
        grow = tf.logical_and(finite_steps >= self.growth_steps, tf.math.is_finite(doubled))
        self.scale.assign(
            tf.where(finite, tf.where(grow, doubled, used), tf.maximum(used * 0.5, self.MIN_SCALE))
        )
        self.finite_steps.assign(tf.where(grow, tf.zeros_like(finite_steps), finite_steps))
        absorbed = tf.logical_and(tf.math.is_finite(loss), used > self.MIN_SCALE)
        overflow = skipped * tf.cast(absorbed, skipped.dtype)
        return {"loss_scale": used, "overflow": overflow, "nonfinite": skipped - overflow}
