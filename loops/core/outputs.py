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
A train step may also return a `Flag`, 1 on a bad step (`loops.Update`'s
result carries one named `nonfinite`, set when the loss or a gradient was
not finite): it totals as a `Sum`, the executor recognises it by its type
(ending an inner loop after a flagged step where the run's policy acts on
it), and flagged steps do not count in a `Mean` or `Ratio` of an inner loop.

An eval step may also return arrays, which the run hands back from
`evaluate` but reports nowhere (the definition draws them): a `Sum` of any
fixed shape (a confusion matrix: `loops.Sum(counts)` of shape [classes,
classes]), and `Highest(scores, rows, keep)`, the `keep` rows of the
highest scores over the pass (the worst-classified images). A train step's
outputs are logged at every step and stay scalars.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from loops.core import reporting
from loops.vocabulary.whole_numbers import is_whole


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


class Flag(NamedTuple):
    """1 when a train step was bad (its update left out or to be acted on), else 0; totals as
    a Sum. The run's bad-step policy (`loops.run.faults.bad_steps`) reads it."""

    value: Any


class Highest(NamedTuple):
    """The `keep` rows with the highest scores over an eval pass, highest first (eval steps).

    `scores` holds one number per row of `rows` (e.g. each example's loss,
    gathered over replicas); of equal scores the earlier row in the pass
    wins, so any replica count keeps the same rows. The pass's result is the
    rows kept, fewer than `keep` when it held fewer. Its cost is a top-k of
    `keep` rows a batch.
    """

    scores: Any
    rows: Any
    keep: int


Output = Mean | Ratio | Sum | Last | Flag | Highest
KINDS = (Mean, Ratio, Sum, Last, Flag, Highest)
# A step's outputs as columns: name -> tensor, the second part of a Mean or
# Ratio under name + WEIGHT (its weight or denominator), a Highest's scores too.
WEIGHT = "/weight"
NONFINITE = "nonfinite"  # the update path's Flag's name: 1 when a step's update was left out


def flag_names(kinds: Mapping[str, type]) -> list[str]:
    """The outputs that are a `Flag`, marking a step as bad."""
    return [name for name, kind in kinds.items() if kind is Flag]


def columns(
    outputs: Any, hook: str, *, arrays: bool = False
) -> tuple[dict[str, tf.Tensor], dict[str, type]]:
    """Checks a step's outputs and flattens them into columns.

    Args:
        outputs: what the step returned: name -> Mean | Ratio | Sum | Last | Highest.
        hook: the step's name, for errors ("train_step").
        arrays: whether a Sum may be an array and a Highest is allowed (an eval step's).

    Returns:
        (name -> tensor, with name + WEIGHT for a Mean's weight, a Ratio's
        denominator or a Highest's scores; name -> kind).

    Raises:
        TypeError: outputs is not a dict of typed outputs of the shapes above.
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
        if isinstance(output, Flag) and arrays:
            raise TypeError(
                f"{hook} returned {name}=loops.Flag(...); a Flag marks a bad train step, and an "
                f"eval step makes no update: return loops.Sum({name}) to count such batches."
            )
        kinds[name] = type(output)
        if isinstance(output, Highest):
            flat[name + WEIGHT], flat[name] = _highest_columns(name, output, hook, arrays)
            continue
        parts = [tf.convert_to_tensor(part) for part in output]
        _check_shapes(name, output, parts, hook, arrays)
        flat[name] = parts[0]
        if len(parts) == 2:
            flat[name + WEIGHT] = tf.cast(parts[1], parts[0].dtype)
    return flat, kinds


def _check_shapes(name: str, output: Output, parts: list, hook: str, arrays: bool) -> None:
    """Raises TypeError unless every part is a scalar, or, where allowed, a Sum of fixed shape."""
    if arrays and isinstance(output, Sum) and parts[0].shape.rank:
        if not parts[0].shape.is_fully_defined():
            raise TypeError(
                f"{hook} returned {name}=loops.Sum of shape {parts[0].shape}; an array Sum "
                "needs a fixed shape (e.g. [classes, classes] from the model's output shape)."
            )
        return
    for part in parts:
        if part.shape.rank != 0:
            allowed = " (an eval step may return an array loops.Sum)" if not arrays else ""
            raise TypeError(
                f"{hook} returned {name}={output!r}; every value must be a scalar tensor "
                f"reduced over replicas (use loops.sum_over_replicas){allowed}."
            )


def _highest_columns(name: str, output: Highest, hook: str, arrays: bool):
    """A Highest's (scores, rows) columns: the batch's `keep` best, padded to `keep`."""
    if not arrays:
        raise TypeError(
            f"{hook} returned {name}=loops.Highest(...); only an eval step may (a train "
            "step's outputs are logged as one number a step)."
        )
    keep = output.keep
    if not is_whole(keep, 1):
        raise TypeError(f"{hook} returned {name}=loops.Highest with keep={keep!r}; use >= 1.")
    rows = tf.convert_to_tensor(output.rows)
    if rows.shape.rank is None or rows.shape.rank < 1 or not rows.shape[1:].is_fully_defined():
        raise TypeError(
            f"{hook} returned {name}=loops.Highest with rows of shape {rows.shape}; rows "
            "need a fixed shape after the first axis (e.g. images [n, 28, 28, 1])."
        )
    return top_rows(output.scores, rows, keep)


def top_rows(scores, rows, keep: int):
    """The `keep` rows of highest score, highest first; in-graph, any context.

    Rows missing (fewer than `keep`) are zeros with score -inf. Of equal
    scores the earlier row is kept first (a stable top-k).

    Args:
        scores: one number per row, shape [n].
        rows: a tensor, or a nest of tensors, whose first axis has n rows.

    Returns:
        (float32 scores of shape [keep], rows like `rows` with `keep` rows).
    """
    scores = tf.reshape(tf.cast(scores, tf.float32), [-1])
    padded = tf.concat([scores, tf.fill([keep], tf.constant(-np.inf, tf.float32))], axis=0)
    kept = tf.math.top_k(padded, k=keep).indices

    def pick(values):
        values = tf.convert_to_tensor(values)
        padding = tf.zeros(tf.concat([[keep], tf.shape(values)[1:]], axis=0), values.dtype)
        return tf.gather(tf.concat([values, padding], axis=0), kept)

    return tf.gather(padded, kept), tf.nest.map_structure(pick, rows)


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

    Steps a `Flag` marks (`nonfinite`: their loss is NaN or inf and their
    update was not applied) are left out of Means and Ratios.
    """
    kept = None
    for name in flag_names(kinds):
        unflagged = logs[name] == 0
        kept = unflagged if kept is None else kept & unflagged
    metrics: dict[str, float | int] = {}
    for name, kind in kinds.items():
        values = logs[name]
        if kind in (Sum, Flag):
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


def start_totals(kinds: Mapping[str, type], flat: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """The empty totals of every column an evaluation pass accumulates (in-graph).

    Zeros of each column's shape, and -inf for a Highest's scores (no row kept yet).
    """
    totals = {}
    for name, value in flat.items():
        if name.endswith(WEIGHT) and kinds.get(name[: -len(WEIGHT)]) is Highest:
            totals[name] = tf.fill(value.shape, tf.constant(-np.inf, value.dtype))
        else:
            totals[name] = tf.zeros(value.shape, value.dtype)
    return totals


def accumulate(
    kinds: Mapping[str, type], totals: Mapping[str, tf.Tensor], flat: Mapping[str, tf.Tensor]
) -> dict[str, tf.Tensor]:
    """Adds one batch's columns to an evaluation pass's totals (in-graph)."""
    updated = {}
    for name, kind in kinds.items():
        if kind is Last:
            updated[name] = flat[name]
            continue
        if kind is Highest:
            # The totals first: of equal scores, the earlier batch's rows stay.
            scores = tf.concat([totals[name + WEIGHT], flat[name + WEIGHT]], axis=0)
            rows = tf.concat([totals[name], flat[name]], axis=0)
            keep = totals[name + WEIGHT].shape[0]
            updated[name + WEIGHT], updated[name] = top_rows(scores, rows, keep)
            continue
        value = flat[name] * flat[name + WEIGHT] if kind is Mean else flat[name]
        updated[name] = totals[name] + value
        if kind is not Sum:
            updated[name + WEIGHT] = totals[name + WEIGHT] + flat[name + WEIGHT]
    return updated


def finish_totals(kinds: Mapping[str, type], totals: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """An evaluation pass's totals as one number per scalar output, an array per other.

    An array Sum gives its total (numpy, its dtype), a Highest the rows it kept.
    """
    metrics: dict[str, Any] = {}
    for name, kind in kinds.items():
        total = np.asarray(totals[name])
        if kind is Highest:
            metrics[name] = total[np.asarray(totals[name + WEIGHT]) > -np.inf]
        elif kind in (Sum, Last):
            metrics[name] = total if total.ndim else reporting.plain_number(total[()])
        else:
            metrics[name] = _ratio(total, np.asarray(totals[name + WEIGHT]), total.dtype)
    return metrics


def _ratio(numerator, denominator, dtype) -> float:
    """numerator / denominator in the outputs' own precision; NaN when nothing was counted."""
    if not denominator > 0:
        return float("nan")
    return reporting.plain_number(np.asarray(numerator / denominator).astype(dtype)[()])
