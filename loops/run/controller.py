"""The Controller: the lifecycle of one run of a definition, from its restore to results.json."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from loops import topology
from loops.core import reporting
from loops.definition import executors
from loops.definition.run_context import Definition, StepContext
from loops.model_dir import run_config
from loops.run.actions import action_records, action_state, watched_metrics
from loops.run.controller_options import ControllerOptions
from loops.run.controller_parts import ControllerParts
from loops.run.execution.loop_schedule import LoopSchedule
from loops.run.faults.preemption import PreemptionWatcher
from loops.run.input_sources import InputSources
from loops.run.reporter import TimedCall, TrainHistory
from loops.vocabulary.whole_numbers import check_whole


class Controller:
    """Runs a definition's steps to a step count in inner loops through its executor, and
    between them evaluates, checkpoints, writes summaries and progress, runs the actions,
    and handles preemption and the bad-step policy; writes results.json.

    A `loops.Trainer` makes it once its definition is built, from the pieces
    the run is made of, then has it `restore` the newest checkpoint in
    `model_dir`: a restarted job goes on from there. It records what happens
    in `state` (`trainer.state`).

    Actions run on the host on every worker and get `run_context` (a
    `loops.definition.run_context.RunContext`): `before_train`, then `after_loop`
    after inner loops, `after_eval` after each evaluation, and `after_train` at
    the end (not when preempted). An action may call `run.request_stop(reason)`:
    the inner loop in progress is the last, then the Controller evaluates
    (unless it just did), saves, writes results.json with the `stop_reason`,
    and `train` returns. It evaluates before it saves, so a checkpoint holds
    what the actions concluded from the evaluation at its step.
    """

    def __init__(
        self,
        *,
        definition: Definition,
        step_context: StepContext,
        executor: executors.Executor,
        inputs: InputSources,
        options: ControllerOptions,
    ):
        """Builds the run's parts; `restore` then builds the actions and restores.

        Args:
            definition: the definition, built (bound to `step_context`).
            step_context: its strategy, step options, global step, data offset and updates.
            executor: what runs its steps.
            inputs: the train and eval data, and the coordinator that runs steps, if any.
            options: how to run it, checked (`loops.run.controller_options.ControllerOptions`).
        """
        self.definition, self.options = definition, options
        self.strategy, self.step_options = step_context.strategy, step_context.options
        self.placement = step_context.placement
        self._global_step = step_context.global_step
        self._train_data = inputs.train_data
        self.is_chief = topology.is_chief(self.strategy)
        self.actions = tuple(options.actions)
        self.config = dict(options.config or {})
        parts = ControllerParts.make(
            definition=definition,
            step_context=step_context,
            executor=executor,
            inputs=inputs,
            options=options,
            is_chief=self.is_chief,
            config=self.config,
            request_stop=self.request_stop,
            save_checkpoint=self.save_checkpoint,
        )
        self.state, self.report, self.recoveries = parts.state, parts.report, parts.recoveries
        self._profiler, self._checkpoints = parts.profiler, parts.checkpoints
        self._train_input, self._eval_input = parts.train_input, parts.eval_input
        self._inner_loops, self.run_context = parts.inner_loops, parts.context_view
        self._evaluated_step: int | None = None
        # Several workers or a ps would have to agree on every inner loop's length; in the
        # exact parameter-server mode the chief alone runs the loop.
        self._one_process = self.placement.loop_run_alone

    def restore(self, items: Mapping[str, Any]) -> str | None:
        """Builds the actions, then restores the newest checkpoint in model_dir under its lock;
        returns its path (None: none there, or no model_dir).

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
        with topology.variable_scope(self.strategy):
            for action in self.actions:
                action.build(self.run_context)
        # Optional: a checkpoint without the recovery record or spike watch restores as none.
        optional_items = {
            **action_state(self.actions),
            **self._inner_loops.bad_steps.saved_state,
        }
        model_dir = self.options.model_dir
        if model_dir is None:
            return None
        restored = self._checkpoints.open(
            placement=self.placement,
            items=items,
            step_counter=self._global_step,
            optional_items=optional_items,
            # The run's own settings an evaluator must share, also when no config was given.
            config={**run_config.loop_settings(self.step_options), **self.config},
            config_items=self.definition.checkpoint_items(),
            config_free_to_change=self.definition.config_free_to_change,
        )
        if restored:
            step = self.state.step
            self.report.progress.line(f"restored {restored} at step {step}")
            self.report.eval_history = reporting.previous_history(model_dir, up_to_step=step)
        return restored

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
        self.state.record(stop_reason=None, preempted=False)
        # SIGTERM is only noted from here to the end of train, and acted on at
        # the next boundary (after an inner loop, an evaluation or the final
        # save): whatever moment it comes, every completed step gets saved.
        history = TrainHistory()
        calls: list[TimedCall] = []  # the executor calls that training went on from
        with PreemptionWatcher(self.placement) as preemption:
            self._before_train(num_steps)
            schedule = LoopSchedule.of_run(
                self.options,
                self.actions,
                one_process=self._one_process,
                profiler=self._profiler,
                recovers=self._inner_loops.bad_steps.recovers,
            )
            between = functools.partial(self._between_loops, preemption, num_steps)
            try:
                if self.state.stop_reason is None:  # an action's before_train may stop it
                    calls = self._inner_loops.run(schedule, num_steps, history, between)
            finally:
                if self._profiler is not None:
                    self._profiler.close()  # a trace cut short by an error or a stop
            self._after_train(preemption, trained=bool(calls))
        return history.arrays()

    def _check_can_train(self, num_steps: int) -> None:
        """Raises before any step when `train(num_steps)` cannot run (see `train`)."""
        definition = self.definition
        check_whole("num_steps", num_steps)
        self._inner_loops.bad_steps.check_can_train()
        if self._train_data is None and definition.needs_train_data:
            raise ValueError(
                f"{type(definition).__name__} has no train_data; pass train_data= to the Trainer."
            )
        names = definition.eval_metric_names(self.run_context)
        if names is not None:
            watched_metrics(self.actions, names)

    def _before_train(self, num_steps: int) -> None:
        """Records the config, runs the actions' `before_train`; saves where "recover" needs it."""
        self.report.summaries.hparams(self.config)
        for action in self.actions:
            action.before_train(self.run_context)
        step = self.state.step
        if step >= num_steps:
            self.report.progress.line(
                f"already at step {step} >= {num_steps}: nothing to train "
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
            self.state.record(preempted=True)
            return False
        for action in self.actions:
            if not action.every or step % action.every == 0:
                action.after_loop(self.run_context, step, self.state.last_train_metrics)
        if step >= num_steps or self.state.stop_reason is not None:
            return False
        if self.options.eval_every and step % self.options.eval_every == 0:
            self.evaluate()
            if preemption.should_stop():
                self.state.record(preempted=True)
                return False
        if self.options.checkpoint_every and step % self.options.checkpoint_every == 0:
            self.save_checkpoint()
        return self.state.stop_reason is None  # an action's after_eval may have stopped it

    def _after_train(self, preemption: PreemptionWatcher, *, trained: bool) -> None:
        """Evaluates and saves at the end (unless done there), writes results, ends the actions."""
        state = self.state
        records_changed = False
        if not state.preempted and self._evaluated_step != state.step:
            before = action_records(self.actions)
            self.evaluate()
            records_changed = action_records(self.actions) != before
            state.record(preempted=preemption.should_stop())
        # A rerun of a run preempted at its last step evaluates here, after that step's
        # checkpoint: a record the evaluation changed (the kept best's) is saved with it, or
        # a continuation would compare against the stale one.
        if self._checkpoints.saved_step != state.step and (
            trained or state.preempted or records_changed
        ):
            self.save_checkpoint()
        # A SIGTERM during the final save or results leaves the export (often
        # the longest part) to the rerun, which finds nothing to train.
        state.record(preempted=state.preempted or preemption.should_stop())
        self.write_results()
        if not state.preempted and preemption.should_stop():
            state.record(preempted=True)
            self.write_results()
        if state.preempted:
            self.report.progress.line(
                f"preempted ({preemption.received}) at step {state.step}: every completed step "
                "is saved; run the same command again to continue from it"
            )
            return
        for action in self.actions:
            action.after_train(self.run_context)

    def evaluate(self) -> dict[str, float]:
        """Runs the definition's `run_evaluation`, reports it, runs the actions' `after_eval`."""
        run = self.run_context
        # With ema_decay, evaluation sees the averaged weights; every save, the trained ones.
        with run.averaged_weights():
            metrics = self.definition.run_evaluation(run)
        step = self.state.step
        self._evaluated_step = step
        self.report.evaluation(step, metrics)
        for action in self.actions:
            action.after_eval(run, step, metrics)
        return metrics

    def report_to(self, summaries: reporting.Summaries) -> None:
        """Writes the run's TensorBoard scalars, and the definition's evaluation summaries,
        to `summaries` from now on (the sidecar evaluator writes its own directory)."""
        self.report.summaries = summaries

    def request_stop(self, reason: str) -> None:
        """Ends `train` after the inner loop in progress; see the class docstring.

        Every worker must request it at the same step: decide from the
        metrics the action hooks get, which are the same on every worker.
        """
        if self.state.stop_reason is None:
            self.state.record(stop_reason=reason)
            self.report.progress.line(f"stopping at step {self.state.step}: {reason}")

    def close(self) -> None:
        """Releases the inputs and the model_dir lock (a kill leaves its file, unlocked)."""
        self.release_inputs()
        self._checkpoints.close()

    def release_inputs(self) -> None:
        """Drops the train iterator and the distributed eval data now, while Python runs
        (`failed_frames` says why); the next call makes new ones where the run stands."""
        self._eval_input.release()
        self._train_input.release()

    def save_checkpoint(self) -> str | None:
        """Saves the run's state now (every worker must call it); returns the path.

        Raises:
            NonFiniteWeightsError: a variable is not finite; nothing is saved.
            OSError: the checkpoint cannot be written; the earlier ones are intact.
        """
        return self._checkpoints.save(self.state.step)

    def write_results(self) -> dict[str, Any]:
        """Writes model_dir/results.json (chief only) and returns its contents."""
        self._checkpoints.wait()  # results.json names no step whose checkpoint is unwritten
        return self.report.write_results(
            self.options.model_dir if self.is_chief else None,
            loop=self.definition.name,
            strategy=self.strategy,
            recoveries=self.recoveries.entries,
            config={**self.config, **self._checkpoints.changed_on_resume},
        )
