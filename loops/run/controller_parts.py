"""The parts a Controller runs a definition with, made from the pieces of the run."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loops.core import reporting
from loops.definition import executors
from loops.definition.bad_step_rules import RuleSite
from loops.definition.recovery import Recoveries
from loops.definition.run_context import Definition, StepContext
from loops.definition.run_state import RunState
from loops.placement import Placement
from loops.run import profiling
from loops.run.checkpoint_keeper import CheckpointKeeper
from loops.run.context_view import ContextView
from loops.run.controller_options import ControllerOptions
from loops.run.execution.inner_loops import InnerLoops
from loops.run.faults import builtin_rules
from loops.run.faults.bad_steps import BadStepPolicy
from loops.run.input_sources import EvalInput, InputSources
from loops.run.reporter import Reporter
from loops.run.train_input import TrainInput
from loops.tables import embedding_tables


@dataclass(frozen=True)
class ControllerParts:
    """A run's state, report, profiler, checkpoints, recoveries, inputs, inner loops (with
    the bad-step policy) and the view its actions get: `ControllerParts.make` builds them in order.
    """

    state: RunState
    report: Reporter
    profiler: profiling.StepProfiler | None
    checkpoints: CheckpointKeeper
    # The run's recoveries from bad steps, checkpointed; they set the input's offset.
    recoveries: Recoveries
    train_input: TrainInput
    inner_loops: InnerLoops
    eval_input: EvalInput
    context_view: ContextView

    @classmethod
    def make(
        cls,
        *,
        definition: Definition,
        step_context: StepContext,
        executor: executors.Executor,
        inputs: InputSources,
        options: ControllerOptions,
        is_chief: bool,
        config: dict[str, Any],
        request_stop: Callable[[str], None],
        save_checkpoint: Callable[[], str | None],
    ) -> ControllerParts:
        """The parts of the Controller's run (its arguments, `Controller.__init__`'s);
        `config` is what the run was asked to do, `request_stop` and `save_checkpoint` the
        Controller's, handed to the actions through the view."""
        state = RunState(step_context.global_step)
        report = _reporter(
            definition, executor, options, state, is_chief=is_chief, where=step_context.placement
        )
        profiler = _profiler(options, is_chief=is_chief, say=report.progress.line)
        checkpoints = _checkpoint_keeper(options, is_chief=is_chief, say=report.progress.line)
        recoveries = Recoveries()
        train_input = TrainInput(
            inputs, step_context.data_offset, definition.batches_per_step, recoveries
        )
        bad_steps = _bad_step_policy(
            definition, step_context, state, checkpoints, train_input, recoveries
        )
        loops = InnerLoops(
            executor=executor,
            state=state,
            bad_steps=bad_steps,
            train_input=train_input,
            report=report,
            profiler=profiler,
        )
        eval_input = EvalInput(inputs, executor)
        view = ContextView(
            definition=definition,
            strategy=step_context.strategy,
            global_step=step_context.global_step,
            state=state,
            options=options,
            config=config,
            is_chief=is_chief,
            report=report,
            checkpoints=checkpoints,
            eval_input=eval_input,
            weight_averages=step_context.update.weight_averages,
            request_stop=request_stop,
            save_checkpoint=save_checkpoint,
        )
        # In the order of the fields.
        return cls(
            state, report, profiler, checkpoints, recoveries, train_input, loops, eval_input, view
        )


def _reporter(
    definition: Definition,
    executor: executors.Executor,
    options: ControllerOptions,
    state: RunState,
    *,
    is_chief: bool,
    where: Placement,
) -> Reporter:
    """Where the run reports: progress lines, the chief's summaries under model_dir, and
    results.json with the definition's and the executor's extras."""
    model_dir = options.model_dir
    summaries = os.path.join(model_dir, "summaries") if model_dir and is_chief else None
    return Reporter(
        progress=options.progress or reporting.Progress(),
        summaries=reporting.Summaries(summaries),
        throughput_unit=definition.throughput_unit,
        state=state,
        # results.json holds how the executor ran the steps (h-psexact), and where each
        # table lives (issue 53).
        extras=(
            definition.results_extra,
            executor.results_extra,
            lambda: _tables(definition, where),
        ),
    )


def _tables(definition: Definition, where: Placement) -> dict[str, Any]:
    """results.json's `tables`: where each built table of the definition lives (a
    loops.EmbeddingTable, a keras.layers.Embedding); nothing for a definition without one."""
    placements = embedding_tables.table_placements(definition.checkpoint_items(), where)
    return {"tables": placements} if placements else {}


def _checkpoint_keeper(
    options: ControllerOptions, *, is_chief: bool, say: Callable[[str], None]
) -> CheckpointKeeper:
    """The run's checkpoints in its model_dir, written by the chief."""
    return CheckpointKeeper(
        model_dir=options.model_dir,
        max_checkpoints=options.max_checkpoints,
        asynchronous=options.async_checkpoints,
        is_chief=is_chief,
        say=say,
    )


def _bad_step_policy(
    definition: Definition,
    step_context: StepContext,
    state: RunState,
    checkpoints: CheckpointKeeper,
    train_input: TrainInput,
    recoveries: Recoveries,
) -> BadStepPolicy:
    """The run's bad-step policy, over its rules (`builtin_rules.run_rules`)."""
    options = step_context.options
    site = RuleSite(
        leaves_out_updates=step_context.update.nonfinite.skips,
        watched_loss=definition.watched_loss,
        kind=type(definition).__name__,
    )
    rules = builtin_rules.run_rules(options, site, definition.bad_step_rules())
    return BadStepPolicy(
        rules,
        current_step=lambda: state.step,
        batches_per_step=definition.batches_per_step,
        checkpoints=checkpoints,
        train_input=train_input,
        recoveries=recoveries,
        # The step options hold it filled in (`recovery.check_max_recoveries`), never None.
        max_recoveries=int(options.max_recoveries or 0),
    )


def _profiler(
    options: ControllerOptions, *, is_chief: bool, say: Callable[[str], None]
) -> profiling.StepProfiler | None:
    """The profiler of `options.profile_steps`, tracing on the chief only; None without them."""
    if options.profile_steps is None:
        return None
    model_dir = options.model_dir
    trace_dir = os.path.join(model_dir, "summaries", "train") if model_dir else None
    return profiling.StepProfiler(options.profile_steps, trace_dir if is_chief else None, say=say)
