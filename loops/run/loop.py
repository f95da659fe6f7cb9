"""The Loop: what a kind of training defines (state and steps), and the services its steps use."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from loops.cluster import strategies
from loops.core import mixed_precision as mixed_precision_lib
from loops.core import reporting, weight_average
from loops.core.update import UpdateStates
from loops.input import distributed_input
from loops.model_dir.checkpoints import FinitenessCheck
from loops.model_dir.run_config import CONFIG_FREE_TO_CHANGE
from loops.run import executors, loop_execution, nonfinite_policy, recovery, step_options
from loops.run.actions import Action
from loops.run.controller import Controller
from loops.run.loop_run_state import LoopRunState
from loops.run.run_options import RunOptions
from loops.vocabulary.errors import (
    NonFiniteError as NonFiniteError,  # what train raises, named here too
)


class _BuildsAfterInit(type):
    """Runs a new loop's build and restore after its whole __init__ chain has returned."""

    def __call__(cls, *args, **kwargs):
        loop = super().__call__(*args, **kwargs)
        loop._build_and_restore()
        return loop


class Loop(LoopRunState, metaclass=_BuildsAfterInit):
    """A kind of training: its state, its train and eval steps, and the services they use.

    A subclass creates its objects in `build` and says what one step does in
    `train_step` (and, to evaluate on a dataset, `eval_step`). Its
    `controller` (`loops.Controller`) runs the rest: the restore from
    `model_dir`, inner loops of `steps_per_loop` steps, and between them
    evaluations, checkpoints, summaries, progress and `actions`. `train`,
    `evaluate`, `request_stop`, `save_checkpoint`, `write_results` and `close`
    delegate to it, and the run state that code outside reads is read from it
    (`loops.run.loop_run_state.LoopRunState`).

    Example (README.md runs it with comments and clipping):

        class Regression(loops.Loop):
            def build(self):
                self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
                self.optimizer = keras.optimizers.SGD(0.1)
                self.optimizer.build(self.model.trainable_variables)
                self.update = loops.Update(self, self.optimizer, self.model)

            def checkpoint_items(self):
                return {"model": self.model, "optimizer": self.optimizer}

            def replica_loss(self, x, y):
                count = loops.global_count(tf.shape(y)[0])
                error = tf.squeeze(self.model(x, training=True), -1) - y
                return loops.scale_to_global_batch(error**2, count), {}

            def train_step(self, iterator):
                result = self.update(self.replica_loss, args=next(iterator))
                return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}

    Contract of the hooks:
        build(): runs once in the strategy's scope, after every `__init__` of
            the subclass has returned (so a subclass sets its attributes before
            or after `super().__init__()`); creates every variable the steps
            use (models, optimizers built with `optimizer.build`, counters).
        checkpoint_items(): name -> trackable, saved and restored by the Controller.
        train_step(iterator): cross-replica context; calls `next(iterator)`
            exactly `batches_per_step` times (the executor dequeues those
            batches while the previous step computes; iterator is None for a
            loop with needs_train_data = False and no train_data);
            `self.global_step` holds the index of the step being run; returns
            a dict of typed outputs (`loops.Mean`, `Ratio`, `Sum`, `Last`) of
            scalar tensors already reduced over replicas: how each aggregates
            over an inner loop (loops/core/outputs.py).
        eval_step(batch): cross-replica context; returns typed outputs the
            same way, aggregated over the whole eval set.
        run_evaluation(), eval_metric_names(): a loop that evaluates some
            other way than one pass of `eval_step` over `eval_data` overrides both.
        results_extra(): entries of its own for results.json.

    `loops.Update` follows `on_nonfinite` for a step; a step that checks its
    loss and gradients itself (`loops.all_finite`) applies its update with
    `self.apply_update` and returns the flag it gets as `nonfinite`.
    """

    name = "loop"
    config_free_to_change = CONFIG_FREE_TO_CHANGE  # config keys a resume may change silently
    batches_per_step = 1  # global batches one train_step dequeues; sets the resume position
    needs_train_data = True  # False for steps that make their own data (RL): iterator is None
    supports_parameter_server = False  # True when train_step is right for asynchronous workers
    # The Sum output counting what a step processes, and the unit's name: progress
    # lines, TensorBoard and results.json give "<unit>_per_second" beside steps/s.
    throughput_unit: tuple[str, str] = ("num_examples", "examples")
    # Made once every __init__ has returned (`_build_and_restore`).
    global_step: tf.Variable
    executor: executors.Executor

    def __init__(
        self,
        *,
        strategy: tf.distribute.Strategy | None = None,
        # Input: datasets of GLOBAL batches, or functions that build them.
        train_data: distributed_input.DatasetSource | None = None,
        eval_data: distributed_input.DatasetSource | None = None,
        # Outer loop.
        steps_per_loop: int = 100,
        eval_every: int | None = None,
        checkpoint_every: int | None = None,
        # Outputs.
        model_dir: str | None = None,
        max_checkpoints: int = 3,
        progress: reporting.Progress | None = None,
        progress_every_seconds: float | None = None,
        profile_steps: tuple[int, int] | None = None,
        # Execution.
        seed: int = 0,
        run_eagerly: bool = False,
        on_nonfinite: str = "stop",
        max_recoveries: int | None = None,
        # How the steps' `loops.Update`s compute.
        mixed_precision: str = "none",
        loss_scale_growth_steps: int | None = None,
        grad_accum_steps: int = 1,
        ema_decay: float | None = None,
        # Host-side callbacks.
        actions: Sequence[Action] = (),
        # What the run was asked to do, recorded with its results.
        config: Mapping[str, Any] | None = None,
    ):
        """Checks and records the settings; `build` and the restore run after every `__init__`.

        strategy: where the steps run (default: the current one); train_data: the train
        stream of global batches, repeated forever; eval_data: a finite dataset of global
        batches for `evaluate`. The rest: loops/vocabulary/settings.py declares them,
        `StepOptions` and `RunOptions` (loops/run/) document them; ValueError: a bad one.
        """
        arguments = dict(locals())  # the keyword arguments by name: nothing else is defined yet
        options = step_options.checked(**_named(arguments, step_options.StepOptions))
        self.seed, self.run_eagerly = options.seed, options.run_eagerly
        self.on_nonfinite, self.max_recoveries = options.on_nonfinite, options.max_recoveries
        self.mixed_precision = options.mixed_precision
        self.loss_scale_growth_steps = options.loss_scale_growth_steps
        self.grad_accum_steps, self.ema_decay = options.grad_accum_steps, options.ema_decay
        # Filled by the Updates `build` makes (averages when ema_decay is set, loss scales).
        self.weight_averages, self.update_states = weight_average.WeightAverages(), UpdateStates()
        self.strategy = strategy or tf.distribute.get_strategy()
        loop_execution.check_can_run(
            type(self),
            self.strategy,
            on_nonfinite=on_nonfinite,
            has_train_data=train_data is not None or not self.needs_train_data,
            model_dir=model_dir,
        )
        self.coordinator = loop_execution.coordinator(self.strategy)
        self.train_data, self.eval_data = train_data, eval_data
        # The Controller's; it is made once every __init__ has returned (_BuildsAfterInit).
        self._run_options = _named(arguments, RunOptions)

    def _build_and_restore(self) -> None:
        """Builds the loop in the strategy's scope, then has its Controller restore it."""
        # First, so bad options fail before anything is built, and so `build`
        # and the actions' `build` can read them (self.model_dir, self.progress).
        self.controller = Controller(loop=self, options=RunOptions(**self._run_options))
        del self._run_options  # the Controller's now
        self._nonfinite_updates = nonfinite_policy.NonFiniteUpdates(
            self.strategy,
            on_nonfinite=self.on_nonfinite,
            mixed_precision=self.mixed_precision,
            coordinated=self.coordinator is not None,
        )
        self._eval_input = loop_execution.EvalInput(self.strategy, self.coordinator)
        with strategies.variable_scope(self.strategy):
            self.global_step = _step_counter("global_step")
            # Not checkpointed: the Controller sets it from the recovery record it restores.
            self.data_offset = _step_counter("data_offset")
            with mixed_precision_lib.dtype_policy_scope(self.mixed_precision):
                self.build()
        self._saved_items = _everything_saved(self)
        # What a save would write, checked for NaN and inf after every inner loop.
        finiteness = FinitenessCheck(tf.train.Checkpoint(**self._saved_items))
        definition = executors.StepDefinition(
            name=type(self).__name__,
            strategy=self.strategy,
            train_step=self.train_step,
            eval_step=self.eval_step,
            batches_per_step=self.batches_per_step,
            global_step=self.global_step,
            finiteness=finiteness,
        )
        self.executor = loop_execution.make_executor(
            definition,
            coordinator=self.coordinator,
            run_eagerly=self.run_eagerly,
            stop_on_nonfinite=self.on_nonfinite != "skip",
        )
        self.controller.restore(self._saved_items)

    # ---- Hooks a kind of training overrides. ----

    def build(self) -> None:
        """Creates models, optimizers and other state; runs in strategy scope."""

    def checkpoint_items(self) -> Mapping[str, Any]:
        """Name -> trackable object to checkpoint (models, optimizers, counters)."""
        return {}

    def saved_items(self) -> Mapping[str, Any]:
        """Everything a checkpoint holds: `checkpoint_items()`, the global step, the averages."""
        return dict(self._saved_items)

    def train_step(self, iterator) -> Mapping[str, tf.Tensor]:
        """One training step in cross-replica context; see the class docstring."""
        raise NotImplementedError(
            f"{type(self).__name__} must override train_step(iterator) to train."
        )

    def eval_step(self, batch) -> Mapping[str, tf.Tensor]:
        """Sums over one distributed eval batch; see the class docstring."""
        raise NotImplementedError(
            f"{type(self).__name__} must override eval_step(batch) to evaluate "
            "on eval_data, or override run_evaluation()."
        )

    def run_evaluation(self) -> dict[str, float]:
        """Computes the eval metrics; by default one pass of `eval_step` over `eval_data`."""
        return self._eval_input.evaluate(self.eval_data, self.executor)

    def results_extra(self) -> dict[str, Any]:
        """Entries a kind of training adds to results.json."""
        return {}

    # ---- Services the steps use. ----

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    @property
    def data_step(self) -> tf.Tensor:
        """The step a loop that makes its own data (RL) keys its randomness on, in-graph.

        The global step plus the steps `on_nonfinite="recover"` moved past: after
        a recovery, such a loop draws new data instead of the data that led to
        the non-finite step, as a loop with a train stream reads on past its
        batches. Without a recovery it is the global step.
        """
        return self.global_step + self.data_offset

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def skips_nonfinite(self) -> bool:
        """Whether `apply_update` leaves out non-finite updates: `NonFiniteUpdates.skips`."""
        return self._nonfinite_updates.skips

    def apply_update(self, finite, apply_fn: Callable[..., Any], *args) -> tf.Tensor:
        """Applies a step's update as `on_nonfinite` asks; returns the step's `nonfinite` output.

        `loops.run.nonfinite_policy.NonFiniteUpdates.apply`: cross-replica context;
        `finite` is `loops.all_finite` over the loss and gradients, `apply_fn`
        the replica function that applies the update.
        """
        return self._nonfinite_updates.apply(finite, apply_fn, *args)

    def eval_metric_names(self) -> set[str] | None:
        """The names `evaluate` reports, found by tracing `eval_step`; None when not known.

        A loop that overrides `run_evaluation` overrides this too (or keeps
        None: its actions' metrics are then checked at the first evaluation).
        """
        if type(self).run_evaluation is not Loop.run_evaluation:
            return None
        return self.eval_step_output_names()

    def eval_step_output_names(self) -> set[str] | None:
        """The outputs `eval_step` returns, found by tracing it (nothing runs); None when unknown.

        A loop whose `run_evaluation` adds metrics to the eval pass's builds
        its `eval_metric_names` on this.
        """
        return self._eval_input.output_names(self.eval_data, self.executor)

    def averaged_weights(self):
        """A context in which the trained variables hold their moving averages (host only).

        Without `ema_decay` it changes nothing. The Controller evaluates in
        it and `ExportOnEnd` exports in it; inside, `raw_weights()` gives the
        trained values back for a while (the GAN reports both).
        """
        return self.weight_averages.averaged()

    def raw_weights(self):
        """Inside `averaged_weights`: the trained variables' own values for a while."""
        return self.weight_averages.raw()

    # ---- The run's end (the run itself: LoopRunState). ----

    def close(self) -> None:
        """Releases the inputs and the model_dir lock (`Controller.close`); call it when done.

        `with loop:` calls it on leaving the block.
        """
        self._eval_input.release()
        self.controller.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _named(arguments: Mapping[str, Any], options: type) -> dict[str, Any]:
    """The entries of `arguments` that are fields of the dataclass `options`."""
    return {field.name: arguments[field.name] for field in dataclasses.fields(options)}


def _step_counter(name: str) -> tf.Variable:
    """A step count, the same on every replica; made in the strategy's variable scope."""
    return tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        name=name,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


def _everything_saved(loop: Loop) -> dict[str, Any]:
    """What a checkpoint of `loop` holds: its `checkpoint_items()`, and what the run and
    its `loops.Update`s made (the global step, loss scales, weight averages), unlisted.

    Raises:
        ValueError: checkpoint_items() uses a reserved name, or ema_decay is set
            and `build` made no Update that averages.
    """
    items = dict(loop.checkpoint_items())
    for reserved in ("global_step", "weight_averages", "update_states", recovery.CHECKPOINT_NAME):
        if reserved in items:
            raise ValueError(f"checkpoint_items() must not use the reserved name {reserved!r}.")
    items["global_step"] = loop.global_step
    if loop.update_states:
        items["update_states"] = loop.update_states
    if loop.ema_decay is not None:
        if not loop.weight_averages:
            raise ValueError(
                f"ema_decay={loop.ema_decay} averages the weights each loops.Update "
                f"trains, and {type(loop).__name__}.build made no Update that averages. "
                "Make the step's updates with loops.Update, or drop ema_decay."
            )
        items["weight_averages"] = loop.weight_averages
    return items
