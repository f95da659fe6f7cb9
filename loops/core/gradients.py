"""Applies replica gradients: clipped by the global norm of their sum, only when all are finite."""

from __future__ import annotations

import tensorflow as tf


def apply_gradients(optimizer, gradients, variables, *, clip_norm: float | None = None) -> None:
    """Applies one replica's gradients; call in replica context.

    The Keras 3 optimizer all-reduces (sums) the gradients itself. Clipping by
    global norm must see the summed gradient, not one replica's share, so with
    `clip_norm` the gradients are summed here and applied by `apply_summed`.
    """
    if clip_norm is None:
        optimizer.apply_gradients(zip(gradients, variables))
        return
    apply_summed(optimizer, sum_over_replicas(gradients), variables, clip_norm=clip_norm)


def sum_over_replicas(gradients) -> list:
    """Every replica's gradients summed (None stays None), the same on every replica.

    Call in replica context.
    """
    gradients = list(gradients)
    context = tf.distribute.get_replica_context()
    if context.num_replicas_in_sync == 1:
        return gradients  # the sum of one: no collective ops to run
    present = [i for i, g in enumerate(gradients) if g is not None]
    summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [gradients[i] for i in present])
    for i, gradient in zip(present, summed):
        gradients[i] = gradient
    return gradients


def apply_summed(
    optimizer, summed, variables, *, clip_norm: float | None, norm: tf.Tensor | None = None
) -> None:
    """Applies the replicas' summed gradient (`sum_over_replicas`), clipped; replica context.

    Args:
        clip_norm: clip it to this global norm; None does not.
        norm: its global norm, when already computed (`tf.linalg.global_norm`).

    The optimizer gets it divided by the replica count: it sums the replicas' again.
    """
    if clip_norm is not None:
        summed, _ = tf.clip_by_global_norm(summed, clip_norm, use_norm=norm)
    share = 1.0 / tf.distribute.get_replica_context().num_replicas_in_sync
    optimizer.apply_gradients(zip([None if g is None else g * share for g in summed], variables))


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
