"""Loss scaling to the real global batch, and reductions of replica results.

A replica differentiates sum(per_example_loss) / global_count, where
global_count is the number of examples all replicas hold in this step,
all-reduced. Summing those scaled losses (and their gradients) over replicas
gives exactly the single-device mean, also for a partial final batch and for a
replica that holds no example. `tf.nn.compute_average_loss` with
`global_batch_size` divides by the configured size instead, and without it by
local_count * num_replicas, which differs per replica (BUILD.md fact 3).
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from loops.core import micro_batches
from loops.core.gradients import (  # noqa: F401  (re-exported: loops.reduction.X keeps working)
    all_finite,
    apply_gradients,
    apply_if_finite,
)


def global_count(local_count: tf.Tensor) -> tf.Tensor:
    """All-reduces a per-replica count (of examples, or a weight sum) to float32.

    Call in replica context (inside `strategy.run`). Under gradient
    accumulation the count is that of the micro-batch being computed; the
    `loops.Update` weights the micro-batch's gradients by the count given to
    `scale_to_global_batch`, so a loss function may take other counts too
    (for logging) without changing its update.
    """
    context = tf.distribute.get_replica_context()
    count = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(local_count, tf.float32))
    micro_batches.record_count(count)
    return count


def scale_to_global_batch(per_example_loss: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """Returns sum(per_example_loss) / count, and 0 when count is 0.

    The count is the loss's normalizer: under gradient accumulation the
    `loops.Update` weights each micro-batch's gradients by it. A loss function
    divides its loss by one count (terms with another normalizer, e.g. per
    token and per example, cannot be accumulated exactly and are refused).

    Args:
        per_example_loss: a vector, one loss per local example (reduction None).
        count: the global number of examples in the step (or the global sum of
            their weights, or of tokens), from `global_count`.
    """
    if per_example_loss.shape.rank != 1:
        raise ValueError(
            "Expected one loss per example (a vector), got shape "
            f"{per_example_loss.shape}. Build Keras losses with reduction=None; "
            "their default reduction averages per replica (BUILD.md fact 4)."
        )
    micro_batches.record_normalizer(count)
    total = tf.reduce_sum(tf.cast(per_example_loss, tf.float32))
    return tf.math.divide_no_nan(total, count)


def sum_over_replicas(
    strategy: tf.distribute.Strategy, per_replica: Mapping[str, tf.Tensor]
) -> dict[str, tf.Tensor]:
    """SUM-reduces each scalar of a `strategy.run` result dict to the host.

    SUM is the right reduction for losses already divided by the global batch
    and for counts; MEAN would be wrong by the replica count (fact 6).
    """
    return {
        name: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
        for name, value in per_replica.items()
    }
