"""Typed step outputs: how each value a step returns aggregates over an inner loop or an eval pass.

A train or eval step returns a dict of these, each holding scalar tensors
already reduced over replicas:

    return {"loss": loops.Mean(loss, weight=count),        # weighted mean
            "accuracy": loops.Ratio(correct, count),       # sum of numerators / sum of denominators
            "num_examples": loops.Sum(count),              # total
            "learning_rate": loops.Last(learning_rate)}    # the latest value

Over the steps of an inner loop (and over the batches of an evaluation) a
`Mean` is sum(value * weight) / sum(weight), a `Ratio` sum(numerator) /
sum(denominator), a `Sum` the total and a `Last` the last step's value. A
weighted evaluation is one line: `loops.Ratio(sum(w * loss), sum(w))`.
Steps whose update was left out as not finite (their `nonfinite` output is
set) do not count in a `Mean` or `Ratio` of an inner loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from loops.core import reporting


class Mean(NamedTuple):
    """sum(value * weight) / sum(weight) over steps or batches; `weight` 1 is a plain mean."""

    value: Any
    weight: Any = 1.0


class Ratio(NamedTuple):
    """sum(numerator) / sum(denominator) over steps or batches: a rate, a weighted mean of sums."""

    numerator: Any
    denominator: Any


class Sum(NamedTuple):
    """The total over steps or batches; reported as an int when its dtype is an integer."""

    value: Any


class Last(NamedTuple):
    """The value at the last step or batch: a learning rate, an exploration rate, a window mean."""

    value: Any


Output = Mean | Ratio | Sum | Last
KINDS = (Mean, Ratio, Sum, Last)
# A step's outputs as scalar columns: name -> tensor, the second part of a
# Mean or Ratio under name + WEIGHT (its weight or denominator).
WEIGHT = "/weight"
NONFINITE = "nonfinite"  # the update path's flag: 1 when a step's update was left out


def columns(outputs: Any, hook: str) -> tuple[dict[str, tf.Tensor], dict[str, type]]:
    """Checks a step's outputs and flattens them into scalar columns.

    Args:
        outputs: what the step returned: name -> Mean | Ratio | Sum | Last.
        hook: the step's name, for errors ("train_step").

    Returns:
        (name -> scalar tensor, with name + WEIGHT for a Mean's weight or a
        Ratio's denominator; name -> kind).

    Raises:
        TypeError: outputs is not a dict of typed outputs of scalars.
    """
    if not isinstance(outputs, Mapping):
        raise TypeError(
            f"{hook} must return a dict of loops.Mean / Ratio / Sum / Last outputs, "
            f"got {outputs!r}."
        )
    flat: dict[str, tf.Tensor] = {}
    kinds: dict[str, type] = {}
    for name, output in outputs.items():
        if not isinstance(output, KINDS):
            raise TypeError(
                f"{hook} returned {name}={output!r}; say how it aggregates over steps and "
                f"batches: loops.Mean({name}) (or Mean(value, weight=count)), "
                f"loops.Ratio(total, count), loops.Sum({name}) or loops.Last({name})."
            )
        if WEIGHT in name:
            raise TypeError(
                f"{hook} returned an output named {name!r}; names must not contain "
                f"{WEIGHT!r} (it names a Mean's weight)."
            )
        parts = [tf.convert_to_tensor(part) for part in output]
        for part in parts:
            if part.shape.rank != 0:
                raise TypeError(
                    f"{hook} returned {name}={output!r}; every value must be a scalar tensor "
                    "reduced over replicas (use loops.sum_over_replicas)."
                )
        kinds[name] = type(output)
        flat[name] = parts[0]
        if len(parts) == 2:
            flat[name + WEIGHT] = tf.cast(parts[1], parts[0].dtype)
    return flat, kinds


def per_step_values(
    kinds: Mapping[str, type], logs: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Each output's value at each step (a Ratio's numerator over its denominator)."""
    values = {}
    for name, kind in kinds.items():
        if kind is Ratio:
            with np.errstate(divide="ignore", invalid="ignore"):
                values[name] = logs[name] / logs[name + WEIGHT]
        else:
            values[name] = logs[name]
    return values


def aggregate_steps(
    kinds: Mapping[str, type], logs: Mapping[str, np.ndarray]
) -> dict[str, float | int]:
    """The outputs of an inner loop's steps (columns, a row a step) as one number each.

    Steps flagged `nonfinite` are left out of Means and Ratios: their loss is
    NaN or inf and their update was not applied.
    """
    kept = None
    if NONFINITE in logs:
        kept = logs[NONFINITE] == 0
    metrics: dict[str, float | int] = {}
    for name, kind in kinds.items():
        values = logs[name]
        if kind is Sum:
            metrics[name] = reporting.plain_number(np.sum(values).astype(values.dtype))
        elif kind is Last:
            metrics[name] = reporting.plain_number(values[-1])
        else:
            weights = logs[name + WEIGHT]
            if kept is not None:
                values, weights = values[kept], weights[kept]
            numerators = values * weights if kind is Mean else values
            metrics[name] = _ratio(np.sum(numerators), np.sum(weights), values.dtype)
    return metrics


def start_totals(flat: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Zeros for every column an evaluation pass accumulates (in-graph)."""
    return {name: tf.zeros([], value.dtype) for name, value in flat.items()}


def accumulate(
    kinds: Mapping[str, type], totals: Mapping[str, tf.Tensor], flat: Mapping[str, tf.Tensor]
) -> dict[str, tf.Tensor]:
    """Adds one batch's columns to an evaluation pass's totals (in-graph)."""
    updated = {}
    for name, kind in kinds.items():
        if kind is Last:
            updated[name] = flat[name]
            continue
        value = flat[name] * flat[name + WEIGHT] if kind is Mean else flat[name]
        updated[name] = totals[name] + value
        if kind is not Sum:
            updated[name + WEIGHT] = totals[name + WEIGHT] + flat[name + WEIGHT]
    return updated


def finish_totals(
    kinds: Mapping[str, type], totals: Mapping[str, np.ndarray]
) -> dict[str, float | int]:
    """An evaluation pass's totals as one number per output."""
    metrics: dict[str, float | int] = {}
    for name, kind in kinds.items():
        total = np.asarray(totals[name])
        if kind in (Sum, Last):
            metrics[name] = reporting.plain_number(total[()])
        else:
            metrics[name] = _ratio(total, np.asarray(totals[name + WEIGHT]), total.dtype)
    return metrics


def _ratio(numerator, denominator, dtype) -> float:
    """numerator / denominator in the outputs' own precision; NaN when nothing was counted."""
    if not denominator > 0:
        return float("nan")
    return reporting.plain_number(np.asarray(numerator / denominator).astype(dtype)[()])
