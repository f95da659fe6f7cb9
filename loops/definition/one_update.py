"""The train step of a definition with one `loops.Update` (`Loop.build_one_update`): the update
of one batch, reported as its loss, its count and the learning rate it used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from loops.core import outputs
from loops.tables import dynamic_tables


def one_update_train_step(
    loop: Any, replica_loss: Callable[..., Any], iterator: Any, *, count: str, reported_as: str
) -> dict[str, Any]:
    """One step of `loop.update` on `next(iterator)`, as a kind's `train_step` returns it.

    Args:
        loop: a Loop that called `build_one_update` (its `optimizer` and `update`).
        replica_loss: the Update's replica loss; its logs hold `count`, a float32 tally of
            what the loss averages over (examples, tokens, pairs), summed over replicas.
        count: that log's name.
        reported_as: the name of the tally in the step's outputs (an int64 Sum).

    Returns `loss` (a Mean weighted by the tally), the tally, `learning_rate` (the rate
    this step applied), the Update's own outputs (its flag, health) and, for a model with
    `loops.DynamicTable`s, their `dynamic_tables.STEP_COUNTERS` after the step (Lasts).
    """
    # Read before the update: the rate this step uses (a schedule moves with iterations).
    learning_rate = tf.cast(loop.optimizer.learning_rate, tf.float32)
    result = loop.update(replica_loss, args=next(iterator))
    tally = result.sums[count]
    # A model's dynamic tables: their resident ids, evictions and refusals after the step.
    counted = dynamic_tables.summed_counters(loop.update.tables.own_tables)
    return {
        "loss": outputs.Mean(result.sums["loss"], weight=tally),
        reported_as: outputs.Sum(tf.cast(tally, tf.int64)),
        "learning_rate": outputs.Last(learning_rate),
        **result.outputs,
        **{name: outputs.Last(value) for name, value in counted.items()},
    }
