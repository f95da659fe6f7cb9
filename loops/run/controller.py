"""The Controller: the lifecycle of one run of a Trainer, from its restore to results.json."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from loops import topology
from loops.core import reporting
from loops.model_dir import run_config
from loops.model_dir.checkpoints import Checkpointer
from loops.run import profiling
from loops.run.actions import watched_metrics
from loops.run.inner_loops import InnerLoops
from loops.run.loop_schedule import LoopSchedule
from loops.run.preemption import PreemptionWatcher
from loops.run.recovery import Recoveries
from loops.run.run_checkpoints import RunCheckpoints, action_state
from loops.run.run_context import Run
from loops.run.run_options import RunOptions
from loops.run.run_report import RunReport, TimedCall, TrainHistory
from loops.run.train_input import TrainInput
from loops.vocabulary.whole_numbers import check_whole


class Controller:
    """Runs a Trainer's steps to a step count in inner loops through its executor, and
    between them evaluates, checkpoints, writes summaries and progress, runs the actions,
    and handles preemption and the non-finite policy; writes results.json.

    A `loops.Trainer` makes it before its definition's `build`, then has it
    `restore` the newest checkpoint in `model_dir`: a restarted job goes on from there.

    Actions run on the host on every worker and get the Trainer: `before_train`,
    then `after_loop` after inner loops, `after_eval` after each evaluation, and
    `after_train` at the end (not when preempted). An action may call
    `run.request_stop(reason)`: the inner loop in progress is the last, then the
    Controller evaluates (unless it just did), saves, writes results.json with
    the `stop_reason`, and `train` returns. It evaluates before it saves, so a
    checkpoint holds what the actions concluded from the evaluation at its step.
    """

    def __init__(self, *, trainer: Run, options: RunOptions):
        """Builds nothing (`restore` does, once the Trainer has its `executor` and `global_step`).

        options: how to run it, checked (`loops.run.run_options.RunOptions`).
        """
        self.trainer = trainer
        self.options = options
        self.is_chief = topology.is_chief(trainer.strategy)
        model_dir = options.model_dir
        summaries = os.path.join(model_dir, "summaries") if model_dir and self.is_chief else None
        self.report = RunReport(
            progress=options.progress or reporting.Progress(),
            summaries=reporting.Summaries(summaries),
            throughput_unit=trainer.definition.throughput_unit,
        )
        self.actions = tuple(options.actions)
        self.config = dict(options.config or {})
        self._profiler = _profiler(options, is_chief=self.is_chief, say=self.progress.line)
        self._checkpoints = RunCheckpoints(
            model_dir=model_dir,
            max_checkpoints=options.max_checkpoints,
            asynchronous=options.async_checkpoints,
            is_chief=self.is_chief,
            say=self.progress.line,
        )
        # The run's state; the trainer forwards what code outside reads (and `report`'s).
        self.preempted = False
        self.stop_reason: str | None = None
        self._evaluated_step: int | None = None
        # The run's recoveries from non-finite steps, checkpointed; they set the input's offset.
        self.recoveries = Recoveries()
        self._train_input = TrainInput(trainer, self.recoveries)
        self._inner_loops = InnerLoops(
            trainer=trainer,
            train_input=self._train_input,
            checkpoints=self._checkpoints,
            recoveries=self.recoveries,
            report=self.report,
            profiler=self._profiler,
        )

    def restore(self, items: Mapping[str, Any]) -> None:
        """Builds the actions, then restores the newest checkpoint in model_dir under its lock.

        The trainer calls it once, right after its `build`.

        Args:
            items: name -> trackable a checkpoint holds: the definition's
                `checkpoint_items` and its global step.

        Raises:
            ValueError: a checkpoint in model_dir that does not match the
                definition, two actions with state under one name, or an action
                that does not fit the options.
            OSError: model_dir cannot be written or read.
        """
        trainer = self.trainer
        with topology.variable_scope(trainer.strategy):
            for action in self.actions:
                action.build(trainer)
        # Optional: a checkpoint without the recovery record or spike watch restores as none.
        optional_items = {
            **action_state(self.actions),
            **self._inner_loops.bad_steps.saved_state,
        }
        model_dir = self.options.model_dir
        if model_dir is None:
            return
        restored = self._checkpoints.open(
            strategy=trainer.strategy,
            items=items,
            step_counter=trainer.global_step,
            optional_items=optional_items,
            # The run's own settings an evaluator must share, also when no config was given.
            config={**run_config.loop_settings(trainer.step_options), **self.config},
            config_items=trainer.definition.checkpoint_items(),
            config_free_to_change=trainer.definition.config_free_to_change,
        )
        if restored:
            self.progress.line(f"restored {restored} at step {trainer.step}")
            self.report.eval_history = reporting.previous_history(
                model_dir, up_to_step=trainer.step
            )

    # ---- The run. ----

    def train(self, num_steps: int) -> dict[str, np.ndarray]:
        """Trains until the global step reaches `num_steps`.

        `num_steps` is a total, so a run restored at step k trains only the
        remaining num_steps - k steps. Evaluates and checkpoints at the end;
        an action's `request_stop` ends it earlier, the same way.

        Returns:
            name -> array of the per-step values `train_step` returned, one
            entry per step trained in this call (a recovery drops the entries
            of the steps it undid; the steps trained again add theirs).

        Raises:
            NonFiniteError: a step or the weights were not finite (see the
                `on_nonfinite` step option).
            ValueError: a bad `num_steps`, no train_data where the definition needs it.
        """
        self._check_can_train(num_steps)
        self.stop_reason = None
        self.preempted = False
        # SIGTERM is only noted from here to the end of train, and acted on at
        # the next boundary (after an inner loop, an evaluation or the final
        # save): whatever moment it comes, every completed step gets saved.
        history = TrainHistory()
        calls: list[TimedCall] = []  # the executor calls that training went on from
        with PreemptionWatcher(self.trainer.strategy) as preemption:
            self._before_train(num_steps)
            schedule = LoopSchedule.of_run(
                self.options,
                self.actions,
                trainer=self.trainer,
                profiler=self._profiler,
                recovers=self._inner_loops.bad_steps.recovers,
            )
            between = functools.partial(self._between_loops, preemption, num_steps)
            try:
                if self.stop_reason is None:  # an action's before_train may stop it
                    calls = self._inner_loops.run(schedule, num_steps, history, between)
            finally:
                if self._profiler is not None:
                    self._profiler.close()  # a trace cut short by an error or a stop
            self._after_train(preemption, trained=bool(calls))
        return history.arrays()

    def _check_can_train(self, num_steps: int) -> None:
        """Raises before any step when `train(num_steps)` cannot run (see `train`)."""
        trainer = self.trainer
        check_whole("num_steps", num_steps)
        self._inner_loops.bad_steps.check_can_train()
        if trainer.train_data is None and trainer.definition.needs_train_data:
            raise ValueError(
                f"{type(trainer.definition).__name__} has no train_data; pass train_data= to "
                "the Trainer."
            )
        names = trainer.definition.eval_metric_names(trainer)
        if names is not None:
            watched_metrics(self.actions, names)

    def _before_train(self, num_steps: int) -> None:
        """Records the config, runs the actions' `before_train`; saves where "recover" needs it."""
        trainer = self.trainer
        self.summaries.hparams(self.config)
        for action in self.actions:
            action.before_train(trainer)
        if trainer.step >= num_steps:
            self.progress.line(
                f"already at step {trainer.step} >= {num_steps}: nothing to train "
                "(the model_dir holds a finished run; raise the step count to continue)."
            )
        if self._inner_loops.bad_steps.recovers and not self._checkpoints.on_disk:
            self.save_checkpoint()  # where a recovery before the first save goes back to

    def _between_loops(self, preemption: PreemptionWatcher, num_steps: int, step: int) -> bool:
        """After the inner loops that ended at `step`: the actions, evaluation and checkpoint.

        Returns whether training goes on: False when preempted, stopped or
        done (then `_after_train` evaluates and saves instead).
        """
        if preemption.should_stop():
            self.preempted = True
            return False
        for action in self.actions:
            if not action.every or step % action.every == 0:
                action.after_loop(self.trainer, step, self.report.last_train_metrics)
        if step >= num_steps or self.stop_reason is not None:
            return False
        if self.options.eval_every and step % self.options.eval_every == 0:
            self.evaluate()
            if preemption.should_stop():
                self.preempted = True
                return False
        if self.options.checkpoint_every and step % self.options.checkpoint_every == 0:
            self.save_checkpoint()
        return self.stop_reason is None  # an action's after_eval may have stopped it

    def _after_train(self, preemption: PreemptionWatcher, *, trained: bool) -> None:
        """Evaluates and saves at the end (unless done there), writes results, ends the actions."""
        trainer = self.trainer
        if not self.preempted and self._evaluated_step != trainer.step:
            self.evaluate()
            self.preempted = preemption.should_stop()
        if self._checkpoints.saved_step != trainer.step and (trained or self.preempted):
            self.save_checkpoint()
        # A SIGTERM during the final save or results leaves the export (often
        # the longest part) to the rerun, which finds nothing to train.
        self.preempted = self.preempted or preemption.should_stop()
        self.write_results()
        if not self.preempted and preemption.should_stop():
            self.preempted = True
            self.write_results()
        if self.preempted:
            self.progress.line(
                f"preempted ({preemption.received}) at step {trainer.step}: every completed step "
                "is saved; run the same command again to continue from it"
            )
            return
        for action in self.actions:
            action.after_train(trainer)

    def evaluate(self) -> dict[str, float]:
        """Runs the definition's `run_evaluation`, reports it, runs the actions' `after_eval`."""
        trainer = self.trainer
        # With ema_decay, evaluation sees the averaged weights; every save, the trained ones.
        with trainer.averaged_weights():
            metrics = trainer.definition.run_evaluation(trainer)
        step = trainer.step
        self._evaluated_step = step
        self.report.evaluation(step, metrics)
        for action in self.actions:
            action.after_eval(trainer, step, metrics)
        return metrics

    @property
    def checkpointer(self) -> Checkpointer | None:
        return self._checkpoints.checkpointer

    @property
    def progress(self) -> reporting.Progress:
        return self.report.progress

    @property
    def summaries(self) -> reporting.Summaries:
        """Where TensorBoard scalars go; the sidecar evaluator sets its own."""
        return self.report.summaries

    @summaries.setter
    def summaries(self, summaries: reporting.Summaries) -> None:
        self.report.summaries = summaries

    @property
    def skipped_steps(self) -> int:
        """Steps whose update was left out because it was not finite."""
        return self._inner_loops.bad_steps.nonfinite.skipped_steps

    def request_stop(self, reason: str) -> None:
        """Ends `train` after the inner loop in progress; see the class docstring.

        Every worker must request it at the same step: decide from the
        metrics the action hooks get, which are the same on every worker.
        """
        if self.stop_reason is None:
            self.stop_reason = reason
            self.progress.line(f"stopping at step {self.trainer.step}: {reason}")

    def close(self) -> None:
        """Releases the train input and the model_dir lock (a kill leaves its file, unlocked)."""
        self.release_train_input()
        self._checkpoints.close()

    def release_train_input(self) -> None:
        """Drops the train iterator now, while Python runs (`failed_frames` says why)."""
        self._train_input.release()

    def save_checkpoint(self) -> str | None:
        """Saves the run's state now (every worker must call it); returns the path.

        Raises:
            NonFiniteWeightsError: a variable is not finite; nothing is saved.
            OSError: the checkpoint cannot be written; the earlier ones are intact.
        """
        return self._checkpoints.save(self.trainer.step)

    def write_results(self) -> dict[str, Any]:
        """Writes model_dir/results.json (chief only) and returns its contents."""
        self._checkpoints.wait()  # results.json names no step whose checkpoint is unwritten
        results = self.report.results(
            self.trainer,
            skipped_steps=self.skipped_steps,
            recoveries=self.recoveries.entries,
            preempted=self.preempted,
            stop_reason=self.stop_reason,
            config={**self.config, **self._checkpoints.changed_on_resume},
        )
        model_dir = self.options.model_dir
        if model_dir and self.is_chief:
            reporting.write_json_atomic(os.path.join(model_dir, "results.json"), results)
        return results


def _profiler(
    options: RunOptions, *, is_chief: bool, say: Callable[[str], None]
) -> profiling.StepProfiler | None:
    """The profiler of `options.profile_steps`, tracing on the chief only; None without them."""
    if options.profile_steps is None:
        return None
    model_dir = options.model_dir
    trace_dir = os.path.join(model_dir, "summaries", "train") if model_dir else None
    return profiling.StepProfiler(options.profile_steps, trace_dir if is_chief else None, say=say)
