"""The run as its actions and its definition's evaluation see it: a `RunContext` made of the
run's parts, which the Controller builds and hands to them (`trainer.run_context`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from loops.core import reporting
from loops.core.weight_average import WeightAverages
from loops.definition.run_context import Definition
from loops.definition.run_state import RunState
from loops.model_dir.checkpoints import Checkpointer
from loops.run.checkpoint_keeper import CheckpointKeeper
from loops.run.controller_options import ControllerOptions
from loops.run.input_sources import EvalInput
from loops.run.reporter import Reporter


class ContextView:
    """What an action and a definition's `run_evaluation` may use of the run: its facts
    (definition, strategy, model_dir, is_chief ...), its state, where it reports, and the
    few things they may ask of it (stop, save, evaluate the eval data).

    Satisfies `loops.definition.run_context.RunContext` (mypy checks it where the
    Controller hands it over). Nothing of the Trainer or the Controller is
    reachable from it but the two calls it was given.

    Args:
        definition: the trained definition.
        strategy: where its steps run.
        global_step: the run's step counter (in-graph), checkpointed.
        state: the run's state (its step and last metrics).
        options: the run's options (its model_dir and eval_every).
        config: what the run was asked to do (recorded with its results).
        is_chief: whether this process writes the run's files.
        report: where the run's progress lines and summaries go.
        checkpoints: the run's checkpoints (their checkpointer, once restored).
        eval_input: the definition's eval data, as its executor reads it.
        weight_averages: the moving averages of the trained weights (empty without ema_decay).
        request_stop: ends `train` after the inner loop in progress (`Controller.request_stop`).
        save_checkpoint: saves the run's state now (`Controller.save_checkpoint`).
    """

    def __init__(
        self,
        *,
        definition: Definition,
        strategy: tf.distribute.Strategy,
        global_step: tf.Variable,
        state: RunState,
        options: ControllerOptions,
        config: Mapping[str, Any],
        is_chief: bool,
        report: Reporter,
        checkpoints: CheckpointKeeper,
        eval_input: EvalInput,
        weight_averages: WeightAverages,
        request_stop: Callable[[str], None],
        save_checkpoint: Callable[[], str | None],
    ):
        self.definition = definition
        self.strategy = strategy
        self.global_step = global_step
        self.state = state
        self.model_dir = options.model_dir
        self.eval_every = options.eval_every
        self.config = config
        self.is_chief = is_chief
        self._report = report
        self._checkpoints = checkpoints
        self._eval_input = eval_input
        self._weight_averages = weight_averages
        self._request_stop = request_stop
        self._save_checkpoint = save_checkpoint

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def progress(self) -> reporting.Progress:
        return self._report.progress

    @property
    def summaries(self) -> reporting.Summaries:
        """Where TensorBoard scalars go (the sidecar evaluator's own: `Controller.report_to`)."""
        return self._report.summaries

    @property
    def checkpointer(self) -> Checkpointer | None:
        """The run's checkpointer; None without a model_dir (and before the restore)."""
        return self._checkpoints.checkpointer

    @property
    def last_train_metrics(self) -> dict[str, float]:
        return self.state.last_train_metrics

    @property
    def last_eval_metrics(self) -> dict[str, float]:
        return self.state.last_eval_metrics

    def request_stop(self, reason: str) -> None:
        """Ends `train` after the inner loop in progress (every worker at the same step)."""
        self._request_stop(reason)

    def save_checkpoint(self) -> str | None:
        """Saves the run's state now (every worker must call it); returns the path."""
        return self._save_checkpoint()

    def averaged_weights(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the trained variables hold their moving averages (host only);
        without `ema_decay` it changes nothing."""
        return self._weight_averages.averaged()

    def evaluate_eval_data(self) -> dict[str, float]:
        """One pass of the definition's `eval_step` over the eval data; {} without any."""
        return self._eval_input.evaluate()

    def eval_step_output_names(self) -> set[str] | None:
        """The outputs `eval_step` returns, found by tracing it; None when unknown."""
        return self._eval_input.output_names()
