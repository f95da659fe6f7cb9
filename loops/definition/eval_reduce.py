"""An eval step's sums over the replicas as the outputs a kind reports: each ratio to one count,
the count, and whole-number totals (written once for the kinds' `eval_step`s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from loops.core import outputs, reduction


def reduced_eval(
    strategy: tf.distribute.Strategy,
    replica_sums: Any,
    *,
    count: str,
    ratios: Mapping[str, str] | Sequence[str] | None = None,
    totals: Sequence[str] = (),
) -> dict[str, Any]:
    """`replica_sums` (a dict of float sums, strategy.run's per-replica output) summed over
    the replicas, as eval-step outputs.

    Args:
        count: the sum the ratios divide by (examples, tokens, users), reported under its
            name as an int64 `outputs.Sum`.
        ratios: output name -> the sum it reports as its ratio to `count` (a sequence: the
            same names); None: every sum but `count` and `totals`, in their order.
        totals: sums reported as int64 `outputs.Sum`s (histograms, a confusion matrix); one
            a replica did not give is left out.

    Returns the ratios (`outputs.Ratio`, in order), then the count, then the totals: an
    evaluation's pass averages each ratio over every eval example, whatever the replicas.
    """
    sums = reduction.sum_over_replicas(strategy, replica_sums)
    counted = sums[count]
    if ratios is None:
        ratios = [name for name in sums if name != count and name not in totals]
    named = ratios if isinstance(ratios, Mapping) else {name: name for name in ratios}
    results: dict[str, Any] = {
        output: outputs.Ratio(sums[name], counted) for output, name in named.items()
    }
    results[count] = outputs.Sum(tf.cast(counted, tf.int64))
    for name in totals:
        if name in sums:
            results[name] = outputs.Sum(tf.cast(sums[name], tf.int64))
    return results
