"""Training health from the one update path: the gradient's global norm, clipping, update sizes.

Every `loops.Update` (with the run's `health_every` set) measures at each
step the global norm of the summed gradient, before clipping (unscaled
under a float16 loss scale, of the accumulated gradient under
`grad_accum_steps`), and whether it was clipped; and every `health_every`
steps the update norm over the weight norm, ||w_after - w_before|| /
||w_before||, over its variables and per layer. Since the gradient is the
all-reduced one and the variables are mirrored, every number is the same on
any replica count.

As step outputs they are named `health/<prefix><metric>` (`step_outputs`):
Means weighted so that an inner loop's report averages them over the steps
whose update was computed (a float16 overflow is left out), the ratios over
the steps that measured them. On the host, `reported` moves them out of the
train metrics and keeps the few layers whose ratios are largest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from loops.core import outputs
from loops.vocabulary import settings

PREFIX = "health/"  # step outputs under it are health metrics: TensorBoard's health/ section
GRAD_NORM = "grad_norm"
CLIPPED = "clipped"
UPDATE_RATIO = "update_ratio"  # of a model; of a layer: "update_ratio.<layer path, dotted>"
LOSS_SCALE = "loss_scale"  # `update_outputs`' name (with its prefix) for a float16 loss scale
# Per Update: the layers with the largest ratios, reported where they were measured.
LAYERS_REPORTED = settings.DEFAULT_HEALTH_LAYERS

# Sums over a step's updates: name -> (sum of weight * value, sum of weights).
Totals = dict[str, tuple[tf.Tensor, tf.Tensor]]


class UpdateHealth(NamedTuple):
    """The health of one update, in cross-replica context (float32 scalars)."""

    grad_norm: tf.Tensor  # the global norm of the summed gradient, before clipping
    clipped: tf.Tensor | None  # 1.0 when grad_norm > clip_norm; None without clip_norm
    # ||w_after - w_before|| / ||w_before|| over the Update's variables, and over each
    # layer's; 0 on the steps that do not measure them.
    update_ratio: tf.Tensor
    layer_ratios: dict[str, tf.Tensor]
    ratio_step: tf.Tensor  # 1.0 on a step that measures the ratios


def layer_name(variable) -> str:
    """The layer a variable belongs to: its path less its own name, dotted ("model.dense_1").

    Dots, not slashes: an output name must not contain "/weight", which a
    layer called "weighted_sum" after a slash would.
    """
    path = getattr(variable, "path", None) or variable.name.split(":")[0]
    return (path.rpartition("/")[0] or path).replace("/", ".")


def layer_names(variables: Sequence[tf.Variable]) -> list[str]:
    """The layers of `variables`, in the order of their first variable: the model's own order."""
    return list(dict.fromkeys(layer_name(variable) for variable in variables))


def is_ratio_step(global_step: tf.Variable, health_every: int) -> tf.Tensor:
    """Whether the step being taken (global step + 1) is a multiple of `health_every`."""
    return tf.equal((global_step + 1) % health_every, 0)


def read_weights(variables: Sequence[tf.Variable], when: tf.Tensor) -> list[tf.Tensor]:
    """The variables' values before an update where `when` holds (else empty); cross-replica
    context.

    Only then: kept alive across the update, they cost a copy of the weights
    (TensorFlow copies a variable's buffer before writing it while a read of it is alive).
    """
    return tf.cond(
        when,
        lambda: [tf.identity(tf.convert_to_tensor(variable)) for variable in variables],
        lambda: [tf.zeros([0], variable.dtype) for variable in variables],
    )


def measure(
    variables: Sequence[tf.Variable],
    before: Sequence[tf.Tensor],
    grad_norm: tf.Tensor,
    *,
    clip_norm: float | None,
    ratio_step: tf.Tensor,
) -> UpdateHealth:
    """The health of the update that took `variables` from `before`; cross-replica context.

    Args:
        variables: the Update's variables, after its update.
        before: `read_weights(variables, ratio_step)` before it.
        grad_norm: the global norm of the summed gradient.
        clip_norm: the Update's clip norm, or None.
        ratio_step: whether the step measures the update/weight ratios.
    """
    layers = layer_names(variables)

    def ratios() -> tuple[tf.Tensor, list[tf.Tensor]]:
        changes: dict[str, list[tf.Tensor]] = {layer: [] for layer in layers}
        sizes: dict[str, list[tf.Tensor]] = {layer: [] for layer in layers}
        for variable, old in zip(variables, before):
            old = tf.cast(old, tf.float32)
            new = tf.cast(tf.convert_to_tensor(variable), tf.float32)
            changes[layer_name(variable)].append(tf.reduce_sum(tf.square(new - old)))
            sizes[layer_name(variable)].append(tf.reduce_sum(tf.square(old)))
        every_change = [value for layer in layers for value in changes[layer]]
        every_size = [value for layer in layers for value in sizes[layer]]
        return _ratio(every_change, every_size), [
            _ratio(changes[layer], sizes[layer]) for layer in layers
        ]

    zero = tf.constant(0.0)
    update_ratio, layer_ratios = tf.cond(ratio_step, ratios, lambda: (zero, [zero] * len(layers)))
    return UpdateHealth(
        grad_norm=grad_norm,
        clipped=None if clip_norm is None else tf.cast(grad_norm > clip_norm, tf.float32),
        update_ratio=update_ratio,
        layer_ratios=dict(zip(layers, layer_ratios)),
        ratio_step=tf.cast(ratio_step, tf.float32),
    )


def _ratio(change: list[tf.Tensor], size: list[tf.Tensor]) -> tf.Tensor:
    """The norm of a change over the norm of the weights, from their sums of squares."""
    return tf.math.divide_no_nan(tf.sqrt(tf.add_n(change)), tf.sqrt(tf.add_n(size)))


def totals(health: UpdateHealth, counted: tf.Tensor | None = None) -> Totals:
    """One update's health as sums to add over a step's updates (`add`, `step_outputs`).

    Args:
        counted: under a loss scale, 1.0 when its update was computed and 0.0
            for an overflow, whose gradient is inf; None: it counts (a step that
            is not finite is left out on the host).
    """
    metrics = {GRAD_NORM: health.grad_norm}
    if health.clipped is not None:
        metrics[CLIPPED] = health.clipped
    # Zero where not measured: as a total it needs no product with its weight.
    ratios = {UPDATE_RATIO: health.update_ratio}
    ratios.update(
        {f"{UPDATE_RATIO}.{layer}": value for layer, value in health.layer_ratios.items()}
    )
    if counted is None:
        # Fewer ops than the weighting below: on a small model they are what costs.
        one, step = tf.constant(1.0), health.ratio_step
        return {
            **{name: (value, one) for name, value in metrics.items()},
            **{name: (value, step) for name, value in ratios.items()},
        }
    counted = tf.cast(counted, tf.float32)
    weights = {
        **dict.fromkeys(metrics, counted),
        **dict.fromkeys(ratios, counted * health.ratio_step),
    }
    # An overflow's inf times its weight 0 would be NaN: left out instead.
    return {
        name: (tf.where(weights[name] > 0, value * weights[name], 0.0), weights[name])
        for name, value in {**metrics, **ratios}.items()
    }


def empty_totals(variables: Sequence[tf.Variable], *, clipped: bool) -> Totals:
    """Zero totals of the metrics an Update with `variables` measures: where a loop of
    updates (`tf.range`) starts."""
    zero = (tf.constant(0.0), tf.constant(0.0))
    names = [GRAD_NORM, UPDATE_RATIO, *([CLIPPED] if clipped else [])]
    names += [f"{UPDATE_RATIO}.{layer}" for layer in layer_names(variables)]
    return {name: zero for name in names}


def add(first: Totals, second: Totals) -> Totals:
    """The totals of two sets of updates (of the same or other variables)."""
    summed = dict(first)
    for name, (total, weight) in second.items():
        if name in summed:
            summed[name] = (summed[name][0] + total, summed[name][1] + weight)
        else:
            summed[name] = (total, weight)
    return summed


def step_outputs(health_totals: Totals, prefix: str = "") -> dict[str, outputs.Output]:
    """Totals as step outputs `health/<prefix><name>`: Means of the updates they counted."""
    return {
        f"{PREFIX}{prefix}{name}": outputs.Mean(tf.math.divide_no_nan(total, weight), weight)
        for name, (total, weight) in health_totals.items()
    }


# ---- On the host. ----


def reported(metrics: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """An inner loop's metrics as (train metrics, health metrics), the latter without `health/`.

    Health metrics are left out where no step counted them (NaN: no health
    step, or no update); of each Update's per-layer ratios the
    `LAYERS_REPORTED` largest are kept. A loss scale is also a health metric
    (and stays a train metric too).
    """
    train = {name: value for name, value in metrics.items() if not name.startswith(PREFIX)}
    found = {
        name[len(PREFIX) :]: value
        for name, value in metrics.items()
        if name.startswith(PREFIX) and not math.isnan(value)
    }
    found.update({name: value for name, value in train.items() if name.endswith(LOSS_SCALE)})
    layers: dict[str, list[str]] = {}
    for name in filter(_is_layer, found):
        layers.setdefault(name.partition(".")[0], []).append(name)
    for names in layers.values():
        for name in sorted(names, key=found.__getitem__, reverse=True)[LAYERS_REPORTED:]:
            del found[name]
    return train, found


def latest(previous: Mapping[str, float], new: Mapping[str, float]) -> dict[str, float]:
    """The health metrics after a report: `new`, and the update/weight ratios last measured
    where `new` has none."""
    measured = any(map(_is_ratio, new))
    kept = {name: value for name, value in previous.items() if _is_ratio(name) and not measured}
    return {**kept, **new}


def in_progress(health: Mapping[str, float]) -> dict[str, float]:
    """What a progress line shows of the health metrics: each gradient norm."""
    return {name: value for name, value in health.items() if name.endswith(GRAD_NORM)}


def by_position(logs: Mapping[str, Any]) -> dict[str, Any]:
    """Step outputs with each layer's ratio named by its position in its Update instead
    ("health/update_ratio.#0"), to compare two runs: two builds of one model in a process
    give its layers other automatic names (dense_3, dense_7), in the same order."""
    positions: dict[str, int] = {}
    renamed = {}
    for name, value in logs.items():
        if name.startswith(PREFIX) and _is_layer(name[len(PREFIX) :]):
            group = name.partition(".")[0]
            positions[group] = positions.get(group, -1) + 1
            name = f"{group}.#{positions[group]}"
        renamed[name] = value
    return renamed


def _is_ratio(name: str) -> bool:
    """Whether a health metric is an update/weight ratio ("<prefix>update_ratio[.<layer>]")."""
    return name.partition(".")[0].endswith(UPDATE_RATIO)


def _is_layer(name: str) -> bool:
    """Whether a health metric is a layer's ratio ("<prefix>update_ratio.<layer>")."""
    return "." in name and _is_ratio(name)
