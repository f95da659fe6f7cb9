"""A train call's inner loops: run in executor calls as planned, reported, checked if finite
and, where asked, for loss spikes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from loops.run import loss_spikes, recovery
from loops.run.loop_schedule import LoopSchedule
from loops.run.nonfinite_policy import NonFinitePolicy
from loops.run.profiling import StepProfiler
from loops.run.recovery import Recoveries, Recovery
from loops.run.run_checkpoints import RunCheckpoints
from loops.run.run_context import Run
from loops.run.run_report import InnerLoop, RunReport, TimedCall, TrainHistory
from loops.run.train_input import TrainInput
from loops.vocabulary.errors import LossSpikeError


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
    each over its own steps. After each call the non-finite policy, and
    the loss-spike policy (`on_loss_spike`, watching the definition's
    `watched_loss` output), stop the run or recover from the first bad
    step, and a recovery trains again from its checkpoint.

    Args:
        trainer: the trainer whose executor runs the steps.
        train_input: the train stream's position.
        checkpoints: the run's checkpoints, which a recovery or stop goes back to.
        recoveries: the run's record of recoveries.
        report: where each inner loop and recovery is reported.
        profiler: traces a range of steps; None when not asked for.
    """

    def __init__(
        self,
        *,
        trainer: Run,
        train_input: TrainInput,
        checkpoints: RunCheckpoints,
        recoveries: Recoveries,
        report: RunReport,
        profiler: StepProfiler | None,
    ):
        self._trainer = trainer
        self._train_input = train_input
        self._recoveries = recoveries
        options = trainer.step_options
        # The loss's moving average, checkpointed; None when spikes are ignored.
        self.spike_watch: loss_spikes.LossSpikeWatch | None = None
        if options.on_loss_spike != "ignore":
            self.spike_watch = loss_spikes.LossSpikeWatch(
                loss_spikes.LossSpikeRule(
                    options.loss_spike_factor, options.loss_spike_steps, options.loss_spike_window
                )
            )
        # The policy for non-finite steps and weights, acted on after each call.
        self.nonfinite = NonFinitePolicy(
            trainer,
            checkpoints=checkpoints,
            train_input=train_input,
            recoveries=recoveries,
            spike_watch=self.spike_watch,
        )
        self._report = report
        self._profiler = profiler
        # The last call's speed, which plans the next calls (also those of the next train).
        self.seconds_per_step: float | None = None

    @property
    def saved_state(self) -> dict[str, object]:
        """What checkpoints hold of the bad-step policies, by name (optional on restore)."""
        state: dict[str, object] = {recovery.CHECKPOINT_NAME: self._recoveries}
        if self.spike_watch is not None:
            state[loss_spikes.CHECKPOINT_NAME] = self.spike_watch
        return state

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
        step = self._trainer.step
        if self._profiler is not None:
            self._profiler.check_reachable(step, num_steps)
        iterator = self._train_input.at_step(step)
        while step < num_steps:
            ends = schedule.call_ends(step, num_steps, self.seconds_per_step)
            call = self._call(iterator, step, ends)
            if self._recovered(call, num_steps, history):
                step = self._trainer.step
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
        run = self._trainer.executor.run(iterator, ends[-1] - step)
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
        """Acts on a non-finite step or weights in `call`; whether it recovered from one.

        The inner loops before the one holding a step that stops the run or
        recovers report first, as they would have from calls of their own.

        Raises:
            NonFiniteError: the policy stops the run.
        """
        bad_step = self.nonfinite.first_acted_on(call.logs, call.first_step)
        spike, watch_state = self._first_spike(call)
        if spike is not None and (bad_step is None or spike.step < bad_step):
            bad_step = spike.step  # the first bad step is acted on
        else:
            spike = None
        reported_to = call.first_step
        for inner_loop in call.inner_loops:
            if bad_step is None or inner_loop.end >= bad_step:
                break
            self._report.inner_loop(call.kinds, inner_loop, num_steps, history)
            reported_to = inner_loop.end
        if spike is not None:
            recovered: Recovery | None = self._after_spike(spike)
        else:
            recovered = self.nonfinite.check_steps(call.logs, call.first_step)
        if recovered is None and not call.weights_finite:
            finiteness = self._trainer.executor.definition.finiteness
            recovered = self.nonfinite.after_nonfinite_weights(
                call.reached, finiteness.nonfinite_names()
            )
        if recovered is None:
            if self.spike_watch is not None:
                self.spike_watch.commit(watch_state)
            return False
        # Forget what the steps the recovery undid logged.
        history.drop_last(max(reported_to - recovered["restored_step"], 0))
        self._report.recovery(
            recovered,
            count=len(self._recoveries.entries),
            max_recoveries=self._trainer.step_options.max_recoveries,
        )
        return True

    def _first_spike(self, call: ExecutorCall) -> tuple[loss_spikes.LossSpike | None, tuple]:
        """The first loss spike in `call` and the watch's state after its steps.

        Raises:
            ValueError: the definition's steps have no `watched_loss` output.
        """
        if self.spike_watch is None:
            return None, ()
        definition = self._trainer.definition
        losses = call.logs.get(definition.watched_loss or "")
        if losses is None:
            raise ValueError(
                f"on_loss_spike watches the train step's {definition.watched_loss!r} output, "
                f"and {type(definition).__name__}'s steps give {sorted(call.logs)}. Set the "
                "definition's watched_loss to the output to watch, or pass "
                "on_loss_spike='ignore'."
            )
        return self.spike_watch.scan(losses, call.first_step)

    def _after_spike(self, spike: loss_spikes.LossSpike) -> Recovery:
        """Recovers from a loss spike, or goes back to the last checkpoint and raises.

        Raises:
            LossSpikeError: under "stop", or past max_recoveries.
        """
        problem = spike.describe(str(self._trainer.definition.watched_loss))
        # Back to a checkpoint saved before the spike's first high step: one saved during it
        # holds updates of its batches.
        if self._trainer.step_options.on_loss_spike == "recover":
            return self.nonfinite.recover(
                spike.step,
                problem,
                cause=recovery.LOSS_SPIKE,
                error=LossSpikeError,
                first_bad_step=spike.first_high_step,
            )
        state = self.nonfinite.back_to_checkpoint(
            weights_finite=True, before_step=spike.first_high_step
        )
        raise LossSpikeError(
            f"Step {spike.step}: {problem}. {state} Lower the learning rate, clip gradients, "
            "check the input at those steps, or pass on_loss_spike='recover' "
            "(--on_loss_spike=recover) to go on from the last checkpoint past the batches "
            "that led to it."
        )
