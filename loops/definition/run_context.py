"""The surfaces between a definition and its run: what each is given of the other.

A Trainer gives its definition a `StepContext` before `build`; it and its
Controller need of the definition only `Definition`; actions and a
definition's evaluation see the run as a `RunContext` (the Controller's
`loops.run.context_view.ContextView`). mypy checks that `loops.Loop` and the run view
satisfy them, and no module of the run imports the Loop or the Trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import tensorflow as tf

from loops.core import reporting
from loops.core.update_context import UpdateContext
from loops.definition.bad_step_rules import BadStepRule
from loops.definition.run_state import RunState
from loops.definition.step_options import StepOptions
from loops.model_dir.checkpoints import Checkpointer
from loops.placement import Placement


@dataclass(frozen=True)
class StepContext:
    """What a Trainer gives the definition it trains, before its `build`.

    Attributes:
        strategy: where the steps run.
        placement: where the variables live and the steps run, read once from the
            strategy and the parameter-server mode (`loops.placement`).
        options: how the steps and their `loops.Update`s compute (checked).
        global_step: the index of the step being run (in-graph), checkpointed.
        data_offset: the steps `on_nonfinite="recover"` moved past (`Loop.data_step`).
        update: what the definition's `loops.Update`s are given: the strategy,
            the global step, the update options, how an update is applied under
            `on_nonfinite`, and where the Updates put their moving averages and
            loss scales (saved unlisted).
    """

    strategy: tf.distribute.Strategy
    placement: Placement
    options: StepOptions
    global_step: tf.Variable
    data_offset: tf.Variable
    update: UpdateContext


class RunContext(Protocol):
    """What an Action, and a definition's `run_evaluation`, may use of the run
    (`trainer.run_context`)."""

    @property
    def definition(self) -> Any: ...  # the trained `loops.Loop`

    @property
    def state(self) -> RunState: ...  # the run's step, last metrics, how it ended

    @property
    def strategy(self) -> tf.distribute.Strategy: ...

    @property
    def global_step(self) -> tf.Variable: ...

    @property
    def step(self) -> int: ...

    @property
    def model_dir(self) -> str | None: ...

    @property
    def eval_every(self) -> int | None: ...

    @property
    def config(self) -> Mapping[str, Any]: ...  # what the run was asked to do

    @property
    def is_chief(self) -> bool: ...

    @property
    def progress(self) -> reporting.Progress: ...

    @property
    def summaries(self) -> reporting.Summaries: ...

    @property
    def checkpointer(self) -> Checkpointer | None: ...

    @property
    def last_train_metrics(self) -> dict[str, float]: ...

    @property
    def last_eval_metrics(self) -> dict[str, float]: ...

    def request_stop(self, reason: str) -> None:
        """Ends `train` after the inner loop in progress."""

    def save_checkpoint(self) -> str | None:
        """Saves the run's state now (every worker must call it); returns the path."""

    def averaged_weights(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the trained variables hold their moving averages."""

    def evaluate_eval_data(self) -> dict[str, float]:
        """One pass of the definition's `eval_step` over the eval data; {} without any."""

    def eval_step_output_names(self) -> set[str] | None:
        """The outputs `eval_step` returns as numbers (not arrays), found by tracing it; None
        when unknown."""


class Definition(Protocol):
    """What a Trainer and its Controller need of the definition they train (a `loops.Loop`)."""

    name: str
    batches_per_step: int
    needs_train_data: bool
    throughput_unit: tuple[str, str]
    watched_loss: str | None
    config_free_to_change: frozenset[str]

    def check_can_train(
        self, strategy: tf.distribute.Strategy, options: StepOptions, *, has_train_data: bool
    ) -> None: ...

    def check_unbound(self) -> None: ...

    def bind(self, context: StepContext) -> None: ...

    def build(self) -> None: ...

    def checkpoint_items(self) -> Mapping[str, Any]: ...

    def train_step(self, iterator) -> Mapping[str, tf.Tensor]: ...

    def eval_step(self, batch) -> Mapping[str, tf.Tensor]: ...

    def evaluates_eval_data_only(self) -> bool: ...

    def run_evaluation(self, run: RunContext) -> dict[str, float]: ...

    def eval_metric_names(self, run: RunContext) -> set[str] | None: ...

    def results_extra(self) -> dict[str, Any]: ...

    def bad_step_rules(self) -> Sequence[BadStepRule]: ...
