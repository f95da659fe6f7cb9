"""The Controller: the lifecycle of one run of a Loop, from its restore to results.json."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from loops import (
    model_dir_lock,
    outputs,
    profiling,
    recovery,
    reporting,
    strategies,
)
from loops.actions import Action, watched_metrics
from loops.checkpoints import Checkpointer, FinitenessCheck
from loops.loop_schedule import LoopSchedule
from loops.nonfinite_policy import NonFinitePolicy
from loops.preemption import PreemptionWatcher
from loops.recovery import Recoveries, Recovery
from loops.run_config import record_config
from loops.train_input import TrainInput

if TYPE_CHECKING:
    from loops.loop import Loop


class Controller:
    """Runs a loop's train steps to a step count in inner loops through its executor, and
    between them evaluates, checkpoints, writes summaries and progress, runs the actions,
    and handles preemption and the non-finite policy; writes results.json.

    A `loops.Loop` makes its Controller before its `build` and has it
    `restore` the newest checkpoint in `model_dir` right after, so a restarted
    job continues from its last saved step. The loop's run methods (`train`,
    `evaluate`, ...) delegate here, and it forwards the run state read outside.

    Actions run on the host on every worker and get the loop: `before_train`,
    then `after_loop` after inner loops, `after_eval` after each evaluation,
    and `after_train` at the end (not when preempted). An action may call
    `loop.request_stop(reason)`: the inner loop in progress is the last, then
    the Controller evaluates (unless it just did), saves, writes results.json
    with the `stop_reason`, and `train` returns. Between inner loops it
    evaluates before it saves, so a checkpoint holds what the actions
    concluded from the evaluation at its step.
    """

    def __init__(
        self,
        *,
        # The definition: its steps, executor, global step and hooks.
        loop: Loop,
        # Outer loop.
        steps_per_loop: int,
        eval_every: int | None,
        checkpoint_every: int | None,
        # Outputs.
        model_dir: str | None,
        max_checkpoints: int,
        progress: reporting.Progress | None,
        progress_every_seconds: float | None,
        profile_steps: tuple[int, int] | None,
        # Host-side callbacks.
        actions: Sequence[Action],
        # What the run was asked to do, recorded with its results.
        config: Mapping[str, Any] | None,
    ):
        """Checks the options; builds nothing (`restore` does, after the loop's `build`).

        Args:
            loop: the Loop whose steps this runs; its `executor` and
                `global_step` exist by the time `restore` is called.
            steps_per_loop: train steps per inner loop, the unit of
                reporting: a progress line, summaries and the metrics actions
                see, each over one inner loop. One `tf.function` call runs
                one inner loop, or several in a row where nothing but their
                reports comes between them (`loops.loop_schedule`).
            eval_every: evaluate every this many steps (and at the end of
                `train`); None evaluates only at the end.
            checkpoint_every: save every this many steps (and at the end of
                `train`); None saves only at the end.
            model_dir: where checkpoints, summaries and results.json go; None
                keeps everything in memory.
            max_checkpoints: how many recent checkpoints to keep.
            progress: where progress lines go; stdout if None.
            progress_every_seconds: end inner loops early enough (judged from
                the last one's speed) that a progress line comes at least this
                often; None leaves it to steps_per_loop. Only in one process
                (several workers must agree on every inner loop's length).
            profile_steps: (start, end): trace steps start..end (from 1,
                both included) with TensorFlow's profiler into
                model_dir/summaries/train (chief only; `loops.profiling`).
            actions: `loops.Action`s run between inner loops, after
                evaluations and at the ends of `train`; their state is saved
                with the checkpoints.
            config: the run's configuration (a binary's flag values, or a
                user's hyperparameters), JSON-serializable; written into
                results.json under "config".

        Raises:
            ValueError: a bad option.
            TypeError: an action that is not a `loops.Action`.
        """
        _check_positive("steps_per_loop", steps_per_loop)
        _check_positive("eval_every", eval_every, optional=True)
        _check_positive("checkpoint_every", checkpoint_every, optional=True)
        _check_positive("max_checkpoints", max_checkpoints)
        if model_dir is not None and os.path.exists(model_dir) and not os.path.isdir(model_dir):
            raise ValueError(
                f"model_dir {model_dir!r} is a file, not a directory; pass a "
                "directory path (it is created if missing)."
            )
        if progress_every_seconds is not None and not progress_every_seconds > 0:
            raise ValueError(
                f"progress_every_seconds must be > 0 (or None to turn it off), got "
                f"{progress_every_seconds!r}."
            )
        checked_profile_steps = profiling.check_profile_steps(profile_steps)
        self.loop = loop
        self.steps_per_loop = steps_per_loop
        self.eval_every = eval_every
        self.checkpoint_every = checkpoint_every
        self.model_dir = model_dir
        self.max_checkpoints = max_checkpoints
        self.progress_every_seconds = progress_every_seconds
        self.is_chief = strategies.is_chief(loop.strategy)
        self.progress = progress or reporting.Progress()
        self.summaries = reporting.Summaries(
            os.path.join(model_dir, "summaries") if model_dir and self.is_chief else None
        )
        self.actions = _checked_actions(actions)
        trace_dir = os.path.join(model_dir, "summaries", "train") if model_dir else None
        self._profiler = (
            None
            if checked_profile_steps is None
            else profiling.StepProfiler(
                checked_profile_steps,
                trace_dir if self.is_chief else None,
                say=self.progress.line,
            )
        )
        self.config = dict(config or {})
        self.checkpointer: Checkpointer | None = None
        self._checkpoint_on_disk = False  # whether restore found one or this run saved one
        self._lock: str | None = None  # the lock file, held by the chief
        self._finiteness: FinitenessCheck | None = None  # set by restore

        # The run's state; the loop forwards what code outside reads.
        # Every evaluation of the run ({"step": ..., metric: value}), kept across resumes.
        self.eval_history: list[dict[str, Any]] = []
        self.last_train_metrics: dict[str, float] = {}
        self.last_eval_metrics: dict[str, float] = {}
        self.steps_per_second = 0.0
        # The loop's throughput_unit per second over the same inner loops; None
        # when its steps do not return that output.
        self.units_per_second: float | None = None
        self.preempted = False
        self.stop_reason: str | None = None
        self._evaluated_step: int | None = None
        self._saved_step: int | None = None
        # The run's recoveries from non-finite steps, checkpointed; they set the input's offset.
        self.recoveries = Recoveries()
        self._train_input = TrainInput(loop, self.recoveries)
        self._nonfinite = NonFinitePolicy(
            loop, go_back=self._go_back_to_checkpoint, recoveries=self.recoveries
        )
        self._seconds_per_step: float | None = None

    def restore(self, items: Mapping[str, Any], finiteness: FinitenessCheck) -> None:
        """Builds the actions, then restores the newest checkpoint in model_dir under its lock.

        The loop calls it once, right after its `build`.

        Args:
            items: name -> trackable a checkpoint holds: the loop's
                `checkpoint_items` and its global step.
            finiteness: the check of `items` for NaN and inf that the
                executor runs after every inner loop; names the culprits.

        Raises:
            ValueError: a checkpoint in model_dir that does not match the
                loop, two actions with state under one name, or an action
                that does not fit the options.
            OSError: model_dir cannot be written or read.
        """
        loop = self.loop
        with strategies.variable_scope(loop.strategy):
            for action in self.actions:
                action.build(loop)
        action_state = _action_state(self.actions)
        self._finiteness = finiteness
        model_dir = self.model_dir
        if model_dir is None:
            return
        if self.is_chief:
            self._lock = model_dir_lock.acquire(model_dir)
            # Holding the lock, whatever a killed writer left half-written is stale.
            reporting.remove_unfinished_writes(model_dir)
        self.checkpointer = Checkpointer(
            strategy=loop.strategy,
            directory=os.path.join(model_dir, "checkpoints"),
            items=items,
            step_counter=loop.global_step,
            max_to_keep=self.max_checkpoints,
            # Optional: checkpoints from before the recovery record restore as no recovery.
            optional_items={**action_state, recovery.CHECKPOINT_NAME: self.recoveries},
            say=self.progress.line,
        )
        try:
            restored = self.checkpointer.restore()
            if self.is_chief:
                record_config(
                    model_dir,
                    self.config,
                    loop.checkpoint_items(),
                    resuming=restored is not None,
                    free_to_change=loop.config_free_to_change,
                    say=self.progress.line,
                )
        except (ValueError, OSError):
            self.close()
            raise
        if restored:
            self._checkpoint_on_disk = True
            self.progress.line(f"restored {restored} at step {loop.step}")
            self.eval_history = reporting.previous_history(model_dir, up_to_step=loop.step)

    # ---- The run. ----

    def train(self, num_steps: int) -> dict[str, np.ndarray]:
        """Trains until the loop's global step reaches `num_steps`.

        `num_steps` is a total, so a loop restored at step k trains only the
        remaining num_steps - k steps. Evaluates and checkpoints at the end;
        an action's `request_stop` ends it earlier, the same way.

        Returns:
            name -> array of the per-step values `train_step` returned, one
            entry per step trained in this call (a recovery drops the entries
            of the steps it undid; the steps trained again add theirs).

        Raises:
            NonFiniteError: a step or the weights were not finite (see the
                loop's `on_nonfinite`).
            ValueError: a bad `num_steps`, no train_data where the loop needs it.
        """
        loop = self.loop
        _check_positive("num_steps", num_steps)
        self._nonfinite.check_can_train()
        if loop.train_data is None and loop.needs_train_data:
            raise ValueError(
                f"{type(loop).__name__} has no train_data; pass train_data= to the constructor."
            )
        self._check_watched_metrics()
        start_step = loop.step
        history: dict[str, list[np.ndarray]] = {}
        self.stop_reason = None
        self.preempted = False
        loop_times: list[tuple[int, float, float | None]] = []
        # SIGTERM is only noted from here to the end of train, and acted on at
        # the next boundary (after an inner loop, an evaluation or the final
        # save): whatever moment it comes, every completed step gets saved.
        with PreemptionWatcher(loop.strategy) as preemption:
            self.summaries.hparams(self.config)
            for action in self.actions:
                action.before_train(loop)
            if start_step >= num_steps:
                self.progress.line(
                    f"already at step {start_step} >= {num_steps}: nothing to train "
                    "(the model_dir holds a finished run; raise the step count to continue)."
                )
            if loop.on_nonfinite == "recover" and not self._checkpoint_on_disk:
                self.save_checkpoint()  # where a recovery before the first save goes back to
            iterator = self._train_input.at_step(start_step)
            try:
                self._train_loops(iterator, start_step, num_steps, history, loop_times, preemption)
            finally:
                if self._profiler is not None:
                    self._profiler.close()  # a trace cut short by an error or a stop
            if loop_times:
                # The first inner loop includes tracing; leave it out when there are others.
                timed = loop_times[1:] or loop_times
                seconds = max(sum(t for _, t, _ in timed), 1e-9)
                self.steps_per_second = sum(n for n, _, _ in timed) / seconds
                counts = [count for _, _, count in timed]
                self.units_per_second = (
                    None if None in counts else sum(c for c in counts if c is not None) / seconds
                )
            if not self.preempted and self._evaluated_step != loop.step:
                self.evaluate()
                self.preempted = preemption.should_stop()
            if self._saved_step != loop.step and (loop_times or self.preempted):
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
                    f"preempted (SIGTERM) at step {loop.step}: every completed step is saved; "
                    "run the same command again to continue from it"
                )
            else:
                for action in self.actions:
                    action.after_train(loop)
        return {name: np.concatenate(parts) for name, parts in history.items()}

    def _train_loops(
        self,
        iterator,
        step: int,
        num_steps: int,
        history: dict,
        loop_times: list,
        preemption: PreemptionWatcher,
    ) -> int:
        """Runs inner loops, with what happens between them, up to `num_steps`.

        One executor call may run several inner loops back to back when only
        their reports (summaries, progress, history) would separate them; the
        reports are then made after the call, each over its own steps
        (`LoopSchedule.call_ends`).
        """
        loop = self.loop
        schedule = self._schedule()
        while step < num_steps and self.stop_reason is None:
            report_ends = schedule.call_ends(step, num_steps, self._seconds_per_step)
            steps = report_ends[-1] - step
            if self._profiler is not None:
                self._profiler.before_loop(step)
            started = time.perf_counter()
            run = loop.executor.run(iterator, steps)
            seconds = time.perf_counter() - started
            first_step = step
            done, step = run.reached - step, run.reached
            logs = {name: values[:done] for name, values in run.logs.items()}
            # Stopped early, the iterator may have dequeued the next step's batches.
            self._train_input.position = (
                self._train_input.position_at(step) if done == steps else -1
            )
            # Inner loops a call stopped early in (a non-finite step) end where it stopped.
            ends = [end for end in report_ends if end < step] + [step]
            inner_loops = [
                (
                    {
                        name: values[start - first_step : end - first_step]
                        for name, values in logs.items()
                    },
                    start,
                    end,
                    seconds * (end - start) / max(done, 1),
                )
                for start, end in zip([first_step, *ends[:-1]], ends)
            ]
            # The inner loops before the one holding a step that stops the run
            # or recovers report first, as they would have from calls of their own.
            bad_step = self._nonfinite.first_acted_on(logs, first_step)
            reported_to = first_step
            while inner_loops and bad_step is not None and inner_loops[0][2] < bad_step:
                inner_loop = inner_loops.pop(0)
                self._report(run.kinds, *inner_loop, num_steps, history)
                reported_to = inner_loop[2]
            recovered = self._nonfinite.check_steps(logs, first_step)
            if recovered is None and not run.weights_finite:
                assert self._finiteness is not None  # restore ran before any step
                recovered = self._nonfinite.after_nonfinite_weights(
                    step, self._finiteness.nonfinite_names()
                )
            if recovered is not None:
                self._after_recovery(recovered, history, logged_to=reported_to)
                step = loop.step
                iterator = self._train_input.at_step(step)
                continue
            unit_output, _ = loop.throughput_unit
            processed = float(np.sum(logs[unit_output])) if unit_output in logs else None
            loop_times.append((done, seconds, processed))
            self._seconds_per_step = seconds / max(done, 1)
            for inner_loop in inner_loops:
                self._report(run.kinds, *inner_loop, num_steps, history)
            if self._profiler is not None:
                self._profiler.after_loop(step)
            if preemption.should_stop():
                self.preempted = True
                break
            for action in self.actions:
                if not action.every or step % action.every == 0:
                    action.after_loop(loop, step, self.last_train_metrics)
            # At the last step or a stop, `train` evaluates and saves.
            if step < num_steps and self.stop_reason is None:
                if self.eval_every and step % self.eval_every == 0:
                    self.evaluate()
                    if preemption.should_stop():
                        self.preempted = True
                        break
                if self.checkpoint_every and step % self.checkpoint_every == 0:
                    self.save_checkpoint()
        return step

    def _report(
        self,
        kinds: Mapping[str, type],
        logs: Mapping[str, np.ndarray],
        start: int,
        end: int,
        seconds: float,
        num_steps: int,
        history: dict,
    ) -> None:
        """Reports the inner loop of steps start + 1..end, which took `seconds`, from its
        steps' logs: its history rows, metrics, summaries and progress line."""
        for name, values in outputs.per_step_values(kinds, logs).items():
            history.setdefault(name, []).append(values)
        rates = {"steps_per_second": (end - start) / seconds if seconds > 0 else 0.0}
        unit_output, unit = self.loop.throughput_unit
        if unit_output in logs:
            processed = float(np.sum(logs[unit_output]))
            rates[f"{unit}_per_second"] = processed / seconds if seconds > 0 else 0.0
        self.last_train_metrics = outputs.aggregate_steps(kinds, logs)
        self.summaries.scalars("train", end, {**self.last_train_metrics, **rates})
        self.progress.train(end, num_steps, self.last_train_metrics, rates)

    def evaluate(self) -> dict[str, float]:
        """Runs `loop.run_evaluation`, reports the metrics, runs the actions' `after_eval`."""
        loop = self.loop
        # With ema_decay, evaluation sees the averaged weights; every save, the trained ones.
        with loop.averaged_weights():
            metrics = loop.run_evaluation()
        step = loop.step
        self._evaluated_step = step
        if metrics:
            self.last_eval_metrics = metrics
            self.eval_history = [entry for entry in self.eval_history if entry["step"] < step]
            self.eval_history.append({"step": step, **metrics})
            self.summaries.scalars("eval", step, metrics)
            self.progress.eval(step, metrics)
        for action in self.actions:
            action.after_eval(loop, step, metrics)
        return metrics

    @property
    def skipped_steps(self) -> int:
        """Steps whose update was left out because it was not finite."""
        return self._nonfinite.skipped_steps

    def request_stop(self, reason: str) -> None:
        """Ends `train` after the inner loop in progress; see the class docstring.

        Every worker must request it at the same step: decide from the
        metrics the action hooks get, which are the same on every worker.
        """
        if self.stop_reason is None:
            self.stop_reason = reason
            self.progress.line(f"stopping at step {self.loop.step}: {reason}")

    def close(self) -> None:
        """Releases the train input and the model_dir lock (a kill leaves its file, unlocked).

        The input goes first, while Python runs: a pipeline that reads with
        Python (`random_access.RecordFiles`) left to the interpreter's exit
        can hang it there, its threads waiting for a lock the exit holds.
        """
        self._train_input.release()
        if self._lock is not None:
            model_dir_lock.release(self._lock)
            self._lock = None

    def save_checkpoint(self) -> str | None:
        """Saves the loop's state now (every worker must call it); returns the path.

        Raises:
            NonFiniteWeightsError: a variable is not finite; nothing is saved.
            OSError: the checkpoint cannot be written; the earlier ones are intact.
        """
        if self.checkpointer is None:
            return None
        path = self.checkpointer.save()
        self._saved_step = self.loop.step
        self._checkpoint_on_disk = True
        return path

    def write_results(self) -> dict[str, Any]:
        """Writes model_dir/results.json (chief only) and returns its contents."""
        loop = self.loop
        results = {
            "loop": loop.name,
            "strategy": strategies.strategy_name(loop.strategy),
            "num_replicas": loop.num_replicas,
            "global_step": loop.step,
            "train": self.last_train_metrics,
            "eval": self.last_eval_metrics,
            "steps_per_second": self.steps_per_second,
            **(
                {}
                if self.units_per_second is None
                else {f"{loop.throughput_unit[1]}_per_second": self.units_per_second}
            ),
            "skipped_steps": self.skipped_steps,
            "recoveries": list(self.recoveries.entries),
            "preempted": self.preempted,
            "stop_reason": self.stop_reason,
            "config": self.config,
            "history": self.eval_history,
            "versions": reporting.library_versions(),
            **loop.results_extra(),
        }
        if self.model_dir and self.is_chief:
            reporting.write_json_atomic(os.path.join(self.model_dir, "results.json"), results)
        return results

    # ---- Between inner loops. ----

    def _go_back_to_checkpoint(self) -> bool:
        """Restores the last checkpoint, the train stream resuming there; False without one."""
        if self.checkpointer is None:
            return False
        self.recoveries.entries = []  # what a checkpoint without the record stands for
        if self.checkpointer.restore() is None:
            return False
        self._train_input.position = -1
        return True

    def _after_recovery(self, entry: Recovery, history: dict, *, logged_to: int) -> None:
        """Forgets what the steps a recovery undid logged, and reports the recovery.

        Args:
            entry: the recovery, the loop back at its restored step.
            history: the per-step logs of this `train` call, up to step `logged_to`.
        """
        restored = entry["restored_step"]
        undone = max(logged_to - restored, 0)
        for parts in history.values():
            values = np.concatenate(parts)
            parts[:] = [values[: max(len(values) - undone, 0)]]
        self.eval_history = [item for item in self.eval_history if item["step"] <= restored]
        count = len(self.recoveries.entries)
        self.summaries.scalars("train", entry["step"], {"recoveries": count})
        steps = (
            f"step {entry['step']}'s"
            if entry["step"] == restored + 1
            else f"those of steps {restored + 1} to {entry['step']}"
        )
        skipped = entry["skipped_batches"]
        self.progress.line(
            f"step {entry['step']} was not finite: recovery {count} of at most "
            f"{self.loop.max_recoveries}, back at the checkpoint of step {restored}; the "
            f"train stream moved past {skipped} batch{'es' if skipped > 1 else ''} ({steps}), "
            "and training goes on"
        )

    def _check_watched_metrics(self) -> None:
        """Fails before any step when an action watches an eval metric the loop does not report."""
        names = self.loop.eval_metric_names()
        if names is not None:
            watched_metrics(self.actions, names)

    def _schedule(self) -> LoopSchedule:
        """Where this `train` call's inner loops end, and which of them one executor call joins."""
        loop = self.loop
        profiler = self._profiler
        return LoopSchedule(
            steps_per_loop=self.steps_per_loop,
            eval_every=self.eval_every,
            checkpoint_every=self.checkpoint_every,
            action_every=tuple(action.every for action in self.actions),
            profiler_boundary=None if profiler is None else profiler.stop_before,
            progress_every_seconds=self.progress_every_seconds,
            # Several workers or a ps would have to agree on every inner loop's length.
            one_process=(strategies.num_workers(loop.strategy) == 1 and loop.coordinator is None),
            recover=loop.on_nonfinite == "recover",
            action_after_every_loop=any(
                action.every is None and type(action).after_loop is not Action.after_loop
                for action in self.actions
            ),
        )


def _checked_actions(actions: Sequence[Action]) -> tuple[Action, ...]:
    actions = tuple(actions)
    for action in actions:
        if not isinstance(action, Action):
            raise TypeError(
                f"actions must be loops.Action objects, got {action!r}; subclass "
                "loops.Action and override its hooks."
            )
        _check_positive(f"{type(action).__name__}.every", action.every, optional=True)
    return actions


def _action_state(actions: Sequence[Action]) -> dict[str, dict]:
    """Checkpoint name -> variables of every action that has state."""
    state = {}
    for action in actions:
        variables = dict(action.checkpoint_items())
        if not variables:
            continue
        key = f"action_{action.name}"
        if key in state:
            raise ValueError(
                f"Two actions with state are named {action.name!r}; each needs its "
                "own name in the checkpoint: set `name` on one of them, e.g. "
                f"action.name = '{action.name}_2'."
            )
        state[key] = variables
    return state


def _check_positive(name: str, value, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        hint = " (or None to turn it off)" if optional else ""
        raise ValueError(f"{name} must be a whole number >= 1{hint}, got {value!r}.")
