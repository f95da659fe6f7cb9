"""The Trainer: a run of a definition (a `loops.Loop`), built from its settings and its parts."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from loops import placement as placement_lib
from loops import topology
from loops.cluster import cluster_config, lost_task
from loops.core import mixed_precision as mixed_precision_lib
from loops.core import reporting
from loops.core.nonfinite_updates import NonFiniteUpdates, leaves_out_nonfinite
from loops.core.update_context import UpdateContext
from loops.definition import executors, recovery, removed_api, step_options
from loops.definition.run_context import Definition, StepContext
from loops.input import distributed_input
from loops.model_dir.checkpoints import FinitenessCheck
from loops.model_dir.warm_start import WarmStart
from loops.placement import Placement
from loops.run import trainer_arguments, warm_starts
from loops.run.actions import Action
from loops.run.controller import Controller
from loops.run.execution import loop_execution
from loops.run.faults import failed_frames, loss_spikes
from loops.run.input_sources import InputSources
from loops.run.parameter_servers import exact_parameter_server
from loops.tables.table_plan import TablePlan
from loops.vocabulary.errors import ClusterTaskLostError
from loops.vocabulary.run_config_tree import RunConfig


class Trainer:
    """Trains one definition: builds it, restores its run, and runs it through its Controller.

    A definition (a `loops.Loop` subclass) says what one step does; the
    Trainer is handed it with the run's settings, and does the rest:

        trainer = loops.Trainer(Regression(), train_data=data, model_dir="/tmp/run")
        trainer.train(1000)
        trainer.definition.model  # what `build` made, trained

    On construction it checks every setting, gives the definition its step
    context (strategy, global step, step options), runs its `build` in the
    strategy's scope, makes the executor of its steps, then its
    `loops.Controller` from those parts, which restores the newest checkpoint
    in `model_dir`. Then `train`, `evaluate`, `save_checkpoint`,
    `write_results`, `request_stop` and `close` run the run.

    What the run did so far is `trainer.state` (`loops.definition.run_state.RunState`:
    step, last_train_metrics, last_eval_metrics, steps_per_second,
    units_per_second, skipped_steps, stop_reason, preempted), read-only.
    What its actions and its definition's evaluation see of it is
    `trainer.run_context` (`loops.definition.run_context.RunContext`: model_dir,
    is_chief, progress, summaries, checkpointer ...). What it was given or
    built are plain attributes: definition, strategy, placement (where the
    variables live and the steps run, `loops.placement`), step_options,
    train_data, eval_data, coordinator, step_context, global_step,
    data_offset, executor, controller, warm_start_report.
    """

    def __init__(
        self,
        definition: Definition,
        config: RunConfig | None = None,
        *,
        strategy: tf.distribute.Strategy | None = None,
        # Input: datasets of GLOBAL batches, or functions that build them.
        train_data: distributed_input.DatasetSource | None = None,
        eval_data: distributed_input.DatasetSource | None = None,
        # Where progress lines go, host-side callbacks, and what results.json records as
        # the run's config (a binary's flags, or a user's hyperparameters).
        progress: reporting.Progress | None = None,
        actions: Sequence[Action] = (),
        record: Mapping[str, Any] | None = None,
        # Which keras.layers.Embedding tables the definition's build makes are placed.
        table_plan: TablePlan | None = None,
        # Where a new run's variables start: another run's checkpoint.
        warm_start: WarmStart | None = None,
        **overrides: Any,
    ):
        """Checks the settings, builds the definition and restores the run.

        Args:
            definition: what is trained (a `loops.Loop`), not yet handed to a Trainer.
            config: the run's settings (`loops.RunConfig`); None: the declared defaults.
            strategy: where the steps run (default: the current one).
            train_data, eval_data: the train stream (repeated), finite eval batches; global.
            progress: where progress lines go (stdout if None).
            actions: `loops.Action`s run between inner loops.
            record: JSON-serializable; written into results.json under "config".
            table_plan: in force while the definition builds (`loops.TablePlan`): each
                `keras.layers.Embedding` of its `min_rows` or more made there becomes a
                table placed by the strategy; None: every Embedding stays replicated.
            warm_start: a `loops.WarmStart`, applied when model_dir holds no checkpoint of
                this run (a resume goes on from its own); its report is `warm_start_report`
                and results.json's `warm_start`.
            **overrides: settings over `config`'s, by name (steps_per_loop=10,
                model_dir=..., ...), checked as `config` was.

        Every setting of `config` is read by the part it belongs to (`trainer_arguments.KEYWORDS`);
        one that only a binary acts on (the mode, the strategy's, train_steps, ...) is
        refused at another value than its default, given either way, with where it goes.

        Raises:
            TypeError: an override that is no setting (naming the closest), or a setting the
                Trainer does not read (`trainer_arguments.unread_setting`).
            ValueError: a bad setting (checked first), a mismatched checkpoint, a used
                definition, a warm start that cannot be taken (`loops.WarmStart`).
        """
        if isinstance(strategy, str):  # the binaries' setting, not the strategy itself
            raise TypeError(trainer_arguments.unread_setting("strategy", strategy))
        self.definition, self.strategy = definition, strategy or tf.distribute.get_strategy()
        self.run_config = trainer_arguments.checked_config(config, overrides)
        # Where the variables live and the steps run: read once, asked by the run's parts.
        self.placement = Placement.of(
            self.strategy,
            self.run_config.placement.parameter_server_mode,
            global_batch_size=self.run_config.placement.global_batch_size,
        )
        self.step_options, run_options = trainer_arguments.checked_options(
            definition,
            self.placement,
            self.run_config,
            has_train_data=train_data is not None,
            progress=progress,
            actions=actions,
            record=record,
        )
        self.coordinator = loop_execution.coordinator(self.placement)
        self.train_data, self.eval_data = train_data, eval_data
        self.step_context = context = self._build_definition(table_plan)
        self.global_step, self.data_offset = context.global_step, context.data_offset
        self._saved_items = _everything_saved(definition, context)
        self.executor = self._make_executor()
        self.controller = Controller(
            definition=definition,
            step_context=context,
            executor=self.executor,
            inputs=InputSources(self.strategy, train_data, eval_data, self.coordinator),
            options=run_options,
        )
        # What the run did so far, and what its actions see of it: the Controller's.
        self.state, self.run_context = self.controller.state, self.controller.run_context
        restored = self.controller.restore(self._saved_items)
        self.warm_start_report = warm_starts.start_run(
            self.controller, warm_start, self._saved_items, restored
        )

    def _build_definition(self, table_plan: TablePlan | None) -> StepContext:
        """Gives the definition its step context and runs its `build` in the strategy's scope
        (and `table_plan`'s, checked after it)."""
        options = self.step_options
        with topology.variable_scope(self.strategy):
            global_step = _step_counter("global_step")
            context = StepContext(
                strategy=self.strategy,
                placement=self.placement,
                options=options,
                global_step=global_step,
                # Not checkpointed: the Controller sets it from the recovery record it restores.
                data_offset=_step_counter("data_offset"),
                update=_update_context(
                    self.placement, options, global_step, coordinator=self.coordinator
                ),
            )
            self.definition.bind(context)
            planned = table_plan.placing() if table_plan else contextlib.nullcontext()
            # The tables built here take the run's placement (its global batch sizes lookups).
            in_force = placement_lib.in_force(self.placement)
            with mixed_precision_lib.dtype_policy_scope(options.mixed_precision), planned, in_force:
                self.definition.build()
        if table_plan:
            table_plan.check_placed(self.definition.checkpoint_items())
        return context

    def _make_executor(self) -> executors.Executor:
        """The executor of the definition's steps, checking what a save would write."""
        definition = self.definition
        # What a save would write, checked for NaN and inf after every inner loop.
        saved = tf.train.Checkpoint(**self._saved_items)
        finiteness = FinitenessCheck(saved)
        return loop_execution.make_executor(
            executors.StepDefinition(
                name=type(definition).__name__,
                strategy=self.strategy,
                placement=self.placement,
                train_step=definition.train_step,
                eval_step=definition.eval_step,
                batches_per_step=definition.batches_per_step,
                global_step=self.global_step,
                finiteness=finiteness,
                has_convolution=executors.has_convolution(saved),
            ),
            coordinator=self.coordinator,
            worker_gradients=self.step_context.update.slice_gradients,
            run_eagerly=self.step_options.run_eagerly,
            stop_on_nonfinite=self.step_options.on_nonfinite != "skip",
        )

    # ---- The run: the Controller's. ----

    def train(self, num_steps: int) -> dict[str, np.ndarray]:
        """Trains until the global step reaches `num_steps`: `Controller.train`.

        Raises:
            ClusterTaskLostError: a task of a multi-process run stopped answering
                (the message names it and its address), instead of TensorFlow's
                collective error.
        """
        with failed_frames.dropped_on_failure(self.controller.release_inputs):
            return self._train_naming_a_lost_task(num_steps)

    def _train_naming_a_lost_task(self, num_steps: int) -> dict[str, np.ndarray]:
        try:
            return self.controller.train(num_steps)
        except tf.errors.OpError as error:
            if not self.placement.in_a_cluster:
                raise
            sentence = lost_task.lost_task_sentence(error.message, cluster_config.read_tf_config())
            if sentence is None:
                raise
            raise ClusterTaskLostError(sentence) from error

    def evaluate(self) -> dict[str, float]:
        """Evaluates now (averaged weights, if any) and reports it: `Controller.evaluate`."""
        # A failure lets the input's iterators go now, while Python runs (`failed_frames`).
        with failed_frames.dropped_on_failure(self.controller.release_inputs):
            return self.controller.evaluate()

    def request_stop(self, reason: str) -> None:
        """Ends `train` after the inner loop in progress: `Controller.request_stop`."""
        self.controller.request_stop(reason)

    def save_checkpoint(self) -> str | None:
        """Saves the run's state now (every worker must call it): `Controller.save_checkpoint`."""
        return self.controller.save_checkpoint()

    def write_results(self) -> dict[str, Any]:
        """Writes model_dir/results.json (chief only): `Controller.write_results`."""
        return self.controller.write_results()

    def close(self) -> None:
        """Releases the inputs and the model_dir lock (`Controller.close`); call it when done.

        `with trainer:` calls it on leaving the block.
        """
        self.controller.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---- What the sidecar evaluator and the learning-rate finder use. ----

    def saved_items(self) -> dict[str, Any]:
        """What a checkpoint holds: `checkpoint_items()`, the global step, what Updates made."""
        return dict(self._saved_items)

    def averaged_weights(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the trained variables hold their moving averages (host only).

        Without `ema_decay` it changes nothing. The Controller evaluates in
        it and `ExportOnEnd` exports in it (`run_context.averaged_weights`).
        """
        return self.step_context.update.weight_averages.averaged()

    if not TYPE_CHECKING:  # mypy keeps reporting an unknown attribute as one

        def __getattr__(self, name: str) -> Any:
            """Names the replacement of a removed property (`removed_api.MOVED_TRAINER_MEMBERS`)."""
            raise AttributeError(
                removed_api.moved_member_sentence(name)
                or f"{type(self).__name__!r} object has no attribute {name!r}"
            )


def _step_counter(name: str) -> tf.Variable:
    """A step count, the same on every replica; made in the strategy's variable scope."""
    return tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        name=name,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


def _update_context(
    placement: Placement,
    options: step_options.StepOptions,
    global_step: tf.Variable,
    *,
    coordinator: Any,
) -> UpdateContext:
    """What the definition's `loops.Update`s are given: the run's strategy, step and options
    (and, in the exact parameter-server mode, the workers that compute their gradients)."""
    strategy = placement.strategy
    skips = leaves_out_nonfinite(
        on_nonfinite=options.on_nonfinite,
        mixed_precision=options.mixed_precision,
        coordinated=placement.steps_out_of_order,
    )
    exact = coordinator is not None and placement.exact_parameter_server
    return UpdateContext(
        strategy=strategy,
        placement=placement,
        global_step=global_step,
        nonfinite=NonFiniteUpdates(strategy, skips=skips),
        options=options,  # a StepOptions is its Updates' options
        slice_gradients=exact_parameter_server.WorkerGradients(coordinator) if exact else None,
    )


def _everything_saved(definition: Definition, context: StepContext) -> dict[str, Any]:
    """What a checkpoint holds: the definition's `checkpoint_items()`, and what the run and
    its `loops.Update`s made (the global step, loss scales, weight averages), unlisted.

    Raises:
        ValueError: checkpoint_items() uses a reserved name, or ema_decay is set
            and `build` made no Update that averages.
    """
    items = dict(definition.checkpoint_items())
    for reserved in (
        "global_step",
        "weight_averages",
        "update_states",
        recovery.CHECKPOINT_NAME,
        loss_spikes.CHECKPOINT_NAME,
    ):
        if reserved in items:
            raise ValueError(f"checkpoint_items() must not use the reserved name {reserved!r}.")
    items["global_step"] = context.global_step
    updates = context.update
    if updates.update_states:
        items["update_states"] = updates.update_states
    ema_decay = updates.options.ema_decay
    if ema_decay is not None:
        if not updates.weight_averages:
            raise ValueError(
                f"ema_decay={ema_decay} averages the weights each loops.Update "
                f"trains, and {type(definition).__name__}.build made no Update that averages. "
                "Make the step's updates with loops.Update, or drop ema_decay."
            )
        items["weight_averages"] = updates.weight_averages
    return items
