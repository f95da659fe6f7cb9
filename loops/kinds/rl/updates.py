"""The gradient updates of an RL train step, run in a loop and reported with their flags."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import tensorflow as tf

from loops.core import health, outputs
from loops.core.update import Update, any_bad


def run_updates(
    update: Update,
    replica_loss: Callable,
    *,
    count,
    args: Callable[[tf.Tensor], tuple],
    names: Iterable[str],
) -> tuple[dict[str, tf.Tensor], dict[str, outputs.Output]]:
    """Makes `count` updates of `replica_loss(*args(index))` (cross-replica context).

    Args:
        update: the kind's `loops.core.update.Update`.
        replica_loss: (*args) -> (loss, sums), run in replica context.
        count: how many updates (an int or a scalar int tensor; may be 0).
        args: the update's index -> the arguments of `replica_loss`.
        names: the entries of `sums` to add up over the updates.

    Returns:
        (totals, flags): each named sum added over the updates, and the step
        outputs of the updates: any not finite, their health metrics
        (`loops.core.health`), and the loss scale and its overflows when
        there is one.
    """
    totals = {name: tf.constant(0.0) for name in names}
    loss_scale = _loss_scale_value(update)
    nonfinite, overflows = tf.constant(0.0), tf.constant(0.0)
    health_totals = update.empty_health_totals()
    for index in tf.range(count):
        result = update(replica_loss, args=args(index))
        totals = {name: totals[name] + result.sums[name] for name in totals}
        nonfinite = tf.maximum(nonfinite, result.nonfinite)
        overflows += result.overflow
        health_totals = health.add(health_totals, result.health_totals())
    flags = _update_flags(nonfinite, overflows, loss_scale)
    return totals, {**flags, **health.step_outputs(health_totals)}


def _loss_scale_value(update: Update) -> tf.Tensor | None:
    """The loss scale a step begins with; None without one."""
    return None if update.loss_scale is None else update.loss_scale.scale.read_value()


def _update_flags(nonfinite, overflows, loss_scale) -> dict[str, outputs.Output]:
    """The step outputs of its updates: any not finite, and the loss scale's overflows."""
    flags = any_bad(nonfinite)
    if loss_scale is not None:
        flags["loss_scale"] = outputs.Last(loss_scale)
        flags["overflow"] = outputs.Sum(tf.cast(overflows, tf.int32))
    return flags
