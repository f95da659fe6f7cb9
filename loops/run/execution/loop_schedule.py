"""The schedule of a run's inner loops: where each ends, and how many one executor call joins."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from loops.run.actions import Action
from loops.run.controller_options import ControllerOptions
from loops.run.profiling import StepProfiler

# About how long one executor call may run when it joins inner loops that
# only reports separate (`LoopSchedule.call_ends`): long enough that a call's
# fixed cost is under 1% of it, short enough that progress lines and a
# SIGTERM wait for it no noticeably longer.
JOINED_CALL_SECONDS = 0.25


class LoopEnd(NamedTuple):
    """Where an inner loop ends, and whether only steps_per_loop ends it there."""

    step: int
    # True when no evaluation, checkpoint, action, profiler boundary, progress
    # line or end of training needs the host at `step`: only its report does.
    report_only: bool


@dataclass(frozen=True)
class LoopSchedule:
    """Where a run's inner loops end, and which of them one executor call may join.

    An inner loop ends after `steps_per_loop` steps, or earlier at the next
    evaluation, checkpoint, action, profiler boundary, progress line or the
    end of training.

    Attributes:
        options: the run's options, read where they are used (steps_per_loop,
            eval_every, checkpoint_every, progress_every_seconds), not copied.
        action_every: each action's `every` (None: after every inner loop).
        profiler_boundary: step -> the next step after it where the profiler
            needs an inner loop to end (None: none); None without a profiler.
        one_process: no other process (worker, parameter server) must agree
            on every inner loop's and call's length.
        recover: a bad-step rule's reaction is "recover" (`BadStepPolicy.recovers`): a
            call's steps are what a recovery moves past, which must not depend on timing.
        action_after_every_loop: an action runs after every inner loop, and
            may stop the run at any of them.
    """

    options: ControllerOptions
    action_every: tuple[int | None, ...]
    profiler_boundary: Callable[[int], int | None] | None
    one_process: bool
    recover: bool
    action_after_every_loop: bool

    @classmethod
    def of_run(
        cls,
        options: ControllerOptions,
        actions: Sequence[Action],
        *,
        one_process: bool,
        profiler: StepProfiler | None,
        recovers: bool,
    ) -> LoopSchedule:
        """The schedule of a run with these options, actions and profiler; `one_process`:
        whether no other process (worker, parameter server) runs its steps; `recovers`:
        whether a bad-step rule may recover (`BadStepPolicy.recovers`)."""
        return cls(
            options=options,
            action_every=tuple(action.every for action in actions),
            profiler_boundary=None if profiler is None else profiler.stop_before,
            one_process=one_process,
            recover=recovers,
            action_after_every_loop=any(
                action.every is None and type(action).after_loop is not Action.after_loop
                for action in actions
            ),
        )

    def next_end(self, step: int, num_steps: int, seconds_per_step: float | None) -> LoopEnd:
        """Where the inner loop starting after `step` ends (training ends at `num_steps`).

        Args:
            seconds_per_step: the last call's speed, which sets where a
                progress line must come; None before the first call.
        """
        options = self.options
        end = step + options.steps_per_loop
        limits = [num_steps]
        every_seconds = options.progress_every_seconds
        if every_seconds and seconds_per_step and self.one_process:
            limits.append(step + max(1, int(every_seconds / seconds_per_step)))
        if self.profiler_boundary is not None:
            boundary = self.profiler_boundary(step)
            if boundary is not None:
                limits.append(boundary)
        for every in (options.checkpoint_every, options.eval_every, *self.action_every):
            if every:
                limits.append((step // every + 1) * every)
        limit = min(limits)
        return LoopEnd(min(end, limit), end < limit)

    def call_ends(self, step: int, num_steps: int, seconds_per_step: float | None) -> list[int]:
        """The steps at which the inner loops of the next executor call end, in order.

        Where an inner loop would end only because `steps_per_loop` steps are
        done, and nothing but its report needs the host there, the call goes
        on into the next one, up to about `JOINED_CALL_SECONDS` of steps
        (judged from `seconds_per_step`, the last call's speed): each call
        costs a fixed time on top of its steps, and the reports come out the
        same (BUILD.md, Decisions, "Joined calls"). Only where `joins`.
        """
        end, report_only = self.next_end(step, num_steps, seconds_per_step)
        ends = [end]
        if seconds_per_step is None or not self.joins(seconds_per_step):
            return ends
        most_steps = int(JOINED_CALL_SECONDS / seconds_per_step)
        while report_only:
            end, report_only = self.next_end(ends[-1], num_steps, seconds_per_step)
            if end - step > most_steps:
                break
            ends.append(end)
        return ends

    def joins(self, seconds_per_step: float) -> bool:
        """Whether a call may run several inner loops (see `call_ends`)."""
        return (
            seconds_per_step > 0
            and self.one_process
            and not self.recover
            and not self.action_after_every_loop
        )
