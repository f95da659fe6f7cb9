"""A train call's inner loops: run in executor calls as planned, reported, and checked for bad
steps (`loops.run.faults.bad_steps`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from loops.definition import executors
from loops.definition.run_state import RunState
from loops.run.execution.loop_schedule import LoopSchedule
from loops.run.faults.bad_steps import BadStepPolicy
from loops.run.profiling import StepProfiler
from loops.run.reporter import InnerLoop, Reporter, TimedCall, TrainHistory
from loops.run.train_input import TrainInput


class ExecutorCall(NamedTuple):
    """One executor call: steps first_step + 1..reached, and its inner loops."""

    first_step: int
    reached: int
    logs: dict[str, np.ndarray]  # output columns, a row per step run
    kinds: dict[str, type]  # output name -> Mean | Ratio | Sum | Last
    weights_finite: bool
    inner_loops: list[InnerLoop]
    timed: TimedCall


class InnerLoops:
    """Runs a loop's inner loops through its executor, from the train input's position.

    One executor call may run several inner loops back to back when only
    their reports (summaries, progress, history) would separate them
    (`LoopSchedule.call_ends`); the reports are then made after the call,
    each over its own steps. After each call the bad-step policy stops the
    run or recovers from the first bad step any of its rules finds
    (non-finite, a loss spike of the definition's `watched_loss`, the
    definition's own rules), and a recovery trains again from its checkpoint.

    Args:
        executor: runs the steps.
        state: the run's state: its step, and where the skipped steps are counted.
        bad_steps: the rules for bad steps and what follows one, acted on after each call.
        train_input: the train stream's position.
        report: where each inner loop and recovery is reported.
        profiler: traces a range of steps; None when not asked for.
    """

    def __init__(
        self,
        *,
        executor: executors.Executor,
        state: RunState,
        bad_steps: BadStepPolicy,
        train_input: TrainInput,
        report: Reporter,
        profiler: StepProfiler | None,
    ):
        self._executor = executor
        self._state = state
        self.bad_steps = bad_steps
        self._train_input = train_input
        self._report = report
        self._profiler = profiler
        # The last call's speed, which plans the next calls (also those of the next train).
        self.seconds_per_step: float | None = None

    def run(
        self,
        schedule: LoopSchedule,
        num_steps: int,
        history: TrainHistory,
        between: Callable[[int], bool],
    ) -> list[TimedCall]:
        """Trains up to step `num_steps`, calling `between(step)` where inner loops end.

        Args:
            schedule: where inner loops end and how many one call joins.
            num_steps: the step count to reach.
            history: the train call's per-step logs, which reports add to.
            between: what happens after the inner loops that end at a step
                (actions, evaluation, checkpoint); False ends training.

        Returns:
            The executor calls that training went on from, timed (the
            report's speeds are set from them).

        Raises:
            NonFiniteError: the non-finite policy stops the run.
        """
        calls: list[TimedCall] = []
        step = self._state.step
        if self._profiler is not None:
            self._profiler.check_reachable(step, num_steps)
        iterator = self._train_input.at_step(step)
        while step < num_steps:
            ends = schedule.call_ends(step, num_steps, self.seconds_per_step)
            call = self._call(iterator, step, ends)
            if self._recovered(call, num_steps, history):
                step = self._state.step
                iterator = self._train_input.at_step(step)
                continue
            step = call.reached
            calls.append(call.timed)
            self.seconds_per_step = call.timed.seconds / max(call.timed.steps, 1)
            for inner_loop in call.inner_loops:
                self._report.inner_loop(call.kinds, inner_loop, num_steps, history)
            if self._profiler is not None:
                self._profiler.after_loop(step)
            if not between(step):
                break
        self._report.speed(calls)
        return calls

    def _call(self, iterator, step: int, ends: Sequence[int]) -> ExecutorCall:
        """Runs the inner loops after `step` that end at `ends` in one executor call."""
        if self._profiler is not None:
            self._profiler.before_loop(step)
        started = time.perf_counter()
        run = self._executor.run(iterator, ends[-1] - step)
        seconds = time.perf_counter() - started
        done = run.reached - step
        logs = {name: values[:done] for name, values in run.logs.items()}
        # Stopped early, the iterator may have dequeued the next step's batches.
        stopped_early = run.reached < ends[-1]
        self._train_input.position = (
            -1 if stopped_early else self._train_input.position_at(run.reached)
        )
        # Inner loops a call stopped early in (a non-finite step) end where it stopped.
        reached_ends = [end for end in ends if end < run.reached] + [run.reached]
        inner_loops = [
            InnerLoop(
                start,
                end,
                {name: values[start - step : end - step] for name, values in logs.items()},
                seconds * (end - start) / max(done, 1),
            )
            for start, end in zip([step, *reached_ends[:-1]], reached_ends)
        ]
        timed = TimedCall(done, seconds, self._report.units(logs))
        return ExecutorCall(
            step, run.reached, logs, run.kinds, run.weights_finite, inner_loops, timed
        )

    def _recovered(self, call: ExecutorCall, num_steps: int, history: TrainHistory) -> bool:
        """Acts on the first bad step or non-finite weights in `call`; whether it recovered.

        The inner loops before the one holding a step that stops the run or
        recovers report first, as they would have from calls of their own.

        Raises:
            NonFiniteError, LossSpikeError (or a rule's error): the policy stops the run.
        """
        bad_steps = self.bad_steps
        found = bad_steps.first_bad(call.logs, call.kinds, call.first_step)
        self._state.record(skipped_steps=bad_steps.nonfinite.skipped_steps)
        reported_to = call.first_step
        for inner_loop in call.inner_loops:
            if found is None or inner_loop.end >= found[1].step:
                break
            self._report.inner_loop(call.kinds, inner_loop, num_steps, history)
            reported_to = inner_loop.end
        rule, recovered = None, None
        if found is not None:
            rule, recovered = found[0], self.bad_steps.act(*found)
        if recovered is None and not call.weights_finite:
            finiteness = self._executor.definition.finiteness
            rule = self.bad_steps.nonfinite
            recovered = self.bad_steps.after_nonfinite_weights(
                call.reached, finiteness.nonfinite_names()
            )
        if rule is None or recovered is None:
            self.bad_steps.commit()
            return False
        # Forget what the steps the recovery undid logged.
        history.drop_last(max(reported_to - recovered["restored_step"], 0))
        self._report.recovery(
            recovered,
            problem=rule.reported_as,
            count=bad_steps.recoveries_made,
            max_recoveries=bad_steps.max_recoveries,
        )
        return True
