"""Applies replica gradients: clipped by the global norm of their sum, only when all are finite."""

from __future__ import annotations

import tensorflow as tf


def apply_gradients(optimizer, gradients, variables, *, clip_norm: float | None = None) -> None:
    """Applies one replica's gradients; call in replica context.

    The Keras 3 optimizer all-reduces (sums) the gradients itself. Clipping by
    global norm must see the summed gradient, not one replica's share, so with
    `clip_norm` the gradients are summed here, clipped, and handed on divided by
    the replica count (the optimizer's own sum then restores them).
    """
    gradients = list(gradients)
    if clip_norm is not None:
        context = tf.distribute.get_replica_context()
        present = [i for i, g in enumerate(gradients) if g is not None]
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [gradients[i] for i in present])
        clipped, _ = tf.clip_by_global_norm(summed, clip_norm)
        share = 1.0 / context.num_replicas_in_sync
        for i, gradient in zip(present, clipped):
            gradients[i] = gradient * share
    optimizer.apply_gradients(zip(gradients, variables))


def all_finite(tensors) -> tf.Tensor:
    """True on every replica when every value on EVERY replica is finite.

    Call in replica context. The flag is all-reduced: Keras 3's own check in
    LossScaleOptimizer reads replica 0 only, so an inf on another replica
    reached the weights (BUILD.md fact 8).
    """
    checks = []
    for value in tensors:
        if value is None:
            continue
        if isinstance(value, tf.IndexedSlices):
            value = value.values
        checks.append(tf.reduce_all(tf.math.is_finite(value)))
    local_bad = 1.0 - tf.cast(tf.reduce_all(tf.stack(checks)), tf.float32)
    context = tf.distribute.get_replica_context()
    return tf.equal(context.all_reduce(tf.distribute.ReduceOp.SUM, local_bad), 0.0)


def apply_if_finite(strategy: tf.distribute.Strategy, finite, apply_fn, *args) -> tf.Tensor:
    """Runs `strategy.run(apply_fn, args)` only when `finite` holds; call in cross-replica context.

    Args:
        finite: the per-replica result of `all_finite` (the same on every replica).
        apply_fn: the replica function that applies the update.

    Returns:
        1.0 when the update was skipped, 0.0 when it was applied.
    """
    flag = strategy.experimental_local_results(finite)[0]

    def apply():
        strategy.run(apply_fn, args=args)
        return tf.constant(0.0)

    # The update runs in a branch taken in cross-replica context: a cond in replica
    # context cannot contain the optimizer's merge_call.
    return tf.cond(flag, apply, lambda: tf.constant(1.0))
