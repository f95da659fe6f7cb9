"""What a `loops.Update` is given, typed: its strategy, its options, its registries, its applier.

A Trainer makes one `UpdateContext` for the definition it trains (its
`StepContext.update`), and every `loops.Update` the definition's `build`
makes takes it: `loops.Update(self, ...)` in a definition reads
`self.update_context`. Code that trains without a definition gives one it
made itself: `loops.Update(context, optimizer, model)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import tensorflow as tf

from loops.core import mixed_precision
from loops.core.nonfinite_updates import NonFiniteUpdates
from loops.core.weight_average import WeightAverages
from loops.placement import EXACT, Placement
from loops.vocabulary.run_config_tree import UpdateSettings


@dataclasses.dataclass(frozen=True)
class UpdateOptions(UpdateSettings):
    """The step options every `loops.Update` follows: the `update` section of a run's
    `loops.RunConfig`, its fields checked by their declarations when made.

    Each is declared, with its default, help and check, in
    loops/vocabulary/settings.py (the section's fields are generated from there);
    `loops.Update` says what each does to an update. A Trainer gives its run's
    `StepOptions`, which are these with the step section's, so that an Update option is
    its declaration and the line of `loops.Update` that reads it.

    Attributes:
        mixed_precision: "none", "mixed_bfloat16" or "mixed_float16" (a dynamic loss scale).
        loss_scale_growth_steps: under "mixed_float16", finite steps in a row
            after which the loss scale doubles; None: the default (2000).
        grad_accum_steps: micro-batches a replica's share of a step is cut into.
        ema_decay: the decay of a moving average of the trained weights; None: none.
        jit_compile: compile each replica's pass through the trained model with XLA.
        health_every: report the health metrics, the per-layer ratios every
            this many steps; None: none.

    Raises:
        ValueError: a bad option, named with the fix (its declaration's check).
    """


class UpdateStates(tf.Module):
    """What a run's `loops.Update`s create and must keep across a resume (their loss scales).

    The Trainer saves it under one reserved name, so that a definition lists
    only its own objects and a resumed float16 run keeps its scale.
    """

    def __init__(self) -> None:
        super().__init__(name="update_states")
        self.loss_scales: list[mixed_precision.DynamicLossScale] = []

    def add(self, loss_scale: mixed_precision.DynamicLossScale) -> None:
        self.loss_scales.append(loss_scale)

    def __bool__(self) -> bool:
        return bool(self.loss_scales)


@dataclasses.dataclass(frozen=True)
class UpdateContext:
    """Everything a `loops.Update` reads besides its optimizer and model.

    Attributes:
        strategy: runs the update on its replicas; make the context, and the
            Updates, in its scope.
        global_step: the index of the step being run (an int64 variable);
            the health metrics take their per-layer ratios on its multiples
            of `health_every`.
        nonfinite: how an update is applied, or left out where it is not finite.
        options: the step options the Updates follow (`UpdateOptions`).
        weight_averages: where Updates put their moving averages (under `ema_decay`).
        update_states: where Updates put their loss scales (under "mixed_float16").
        placement: where the run's variables live and steps run, with its global batch
            (`loops.placement`): the Trainer's; by default `strategy`'s in the exact
            mode with no global batch, for a context made by hand.
    """

    strategy: tf.distribute.Strategy
    global_step: tf.Variable
    nonfinite: NonFiniteUpdates
    options: UpdateOptions = UpdateOptions()
    weight_averages: WeightAverages = dataclasses.field(default_factory=WeightAverages)
    update_states: UpdateStates = dataclasses.field(default_factory=UpdateStates)
    # h-psexact (issue 44): where the gradients are computed when not on the strategy's
    # own replicas (the exact parameter-server mode's workers); None: on the replicas.
    slice_gradients: SliceGradients | None = None
    placement: Placement = None  # type: ignore[assignment]  # filled in by __post_init__

    def __post_init__(self) -> None:
        if self.placement is None:
            object.__setattr__(self, "placement", Placement.of(self.strategy, EXACT))


class SliceGradients(Protocol):
    """Computes a step's loss, logs and gradients elsewhere, a slice of the batch at a time,
    and returns them summed as one replica's would be
    (`loops.run.parameter_servers.exact_parameter_server`).

    `compute(step_rows, first_row, *sliced_args)` runs in replica context on one
    slice (`sliced_args`, rows `first_row` .. of a batch of `step_rows`) and
    returns (loss, logs, gradients, count): the slice's loss divided by its own
    count, its logs, its gradients (None where a variable has none) and that count.
    `slices` cuts the batch into that many slices (None: one a worker; 1: the whole
    batch computed in one place, for a loss over the whole batch). It returns what
    `then(loss, logs, gradients)` (the Update's apply) returns of the slices' sum, traced
    with the sum.
    """

    def __call__(
        self,
        compute: Callable[..., Any],
        args: Sequence[Any],
        *,
        slices: int | None = None,
        then: Callable[..., Any],
    ) -> Any: ...


class Bound(Protocol):
    """A definition bound by its Trainer (a `loops.Loop`), which holds its Updates' context."""

    update_context: UpdateContext


def of(given: UpdateContext | Bound) -> UpdateContext:
    """The context a `loops.Update` is given: `given` itself, or a definition's, at once.

    Raises:
        TypeError: `given` is neither an `UpdateContext` nor a definition.
        AttributeError: a definition not yet handed to a Trainer (its sentence says so).
    """
    if isinstance(given, UpdateContext):
        return given
    if not callable(getattr(given, "bind", None)):
        raise TypeError(
            f"loops.Update takes the UpdateContext it runs in, or in a definition's build "
            f"the definition itself (loops.Update(self, optimizer, model)); got a "
            f"{type(given).__name__}. Pass loops.UpdateContext(strategy=..., "
            f"global_step=..., nonfinite=...) or self."
        )
    # A definition: bound, it has its Trainer's context; unbound, it says why not.
    return given.update_context
