"""The Loop: what a kind of training defines (objects and steps), and the services steps use."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from loops.core import weight_average
from loops.core.table_updates import built_table_optimizer
from loops.core.update import Update
from loops.core.update_context import UpdateContext, UpdateStates
from loops.definition import removed_api
from loops.definition.bad_step_rules import BadStepRule
from loops.definition.run_context import RunContext as RunContext  # what evaluation hooks get
from loops.definition.run_context import StepContext
from loops.definition.step_options import StepOptions as StepOptions  # what check_can_train gets
from loops.model_dir.run_config import CONFIG_FREE_TO_CHANGE
from loops.placement import Placement
from loops.vocabulary.errors import (
    NonFiniteError as NonFiniteError,  # what train raises, named here too
)


class Loop:
    """What a kind of training defines: its objects, its train and eval steps, what it saves.

    A definition has no run: a `loops.Trainer` is handed it with the run's
    settings, gives it its step context (`bind`: the strategy, the global
    step, the step options), runs its `build` in the strategy's scope, and
    runs its steps (restore, inner loops, evaluation, checkpoints, reports).

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

        trainer = loops.Trainer(Regression(), train_data=data, model_dir="/tmp/run")
        trainer.train(100)

    Contract of the hooks:
        build(): runs once in the strategy's scope, when the Trainer is made;
            creates every variable the steps use (models, optimizers built
            with `optimizer.build`, counters, `loops.Update`s).
        checkpoint_items(): name -> trackable, saved and restored by the run
            (what the Updates make, the global step and averages, unlisted).
        train_step(iterator): cross-replica context; calls `next(iterator)`
            exactly `batches_per_step` times (the executor dequeues those
            batches while the previous step computes; iterator is None for a
            definition with needs_train_data = False and no train_data);
            `self.global_step` holds the index of the step being run; returns
            a dict of typed outputs (`loops.Mean`, `Ratio`, `Sum`, `Last`) of
            scalar tensors already reduced over replicas: how each aggregates
            over an inner loop (loops/core/outputs.py).
        eval_step(batch): cross-replica context; returns typed outputs the
            same way, aggregated over the whole eval set.
        run_evaluation(run), eval_metric_names(run): a definition that
            evaluates some other way than one pass of `eval_step` over the
            eval data overrides both; `run` is the run's
            `loops.definition.run_context.RunContext` (`trainer.run_context`).
        results_extra(): entries of its own for results.json.

    `loops.Update` follows `on_nonfinite` for a step and returns its flag
    (`loops.Flag`, named `nonfinite`) in `result.outputs`; a step of several
    Updates returns `loops.any_bad(*results)`. A step that checks its loss
    and gradients itself (`loops.all_finite`) applies its update with
    `self.apply_update` and returns the flag it gets as `loops.Flag`.
    """

    name = "loop"
    config_free_to_change = CONFIG_FREE_TO_CHANGE  # config keys a resume may change silently
    batches_per_step = 1  # global batches one train_step dequeues; sets the resume position
    needs_train_data = True  # False for steps that make their own data (RL): iterator is None
    supports_parameter_server = False  # True when train_step is right for asynchronous workers
    # True when train_step is built on loops.Update alone, so that the exact parameter-server
    # mode computes it on the workers and applies it once (a supports_parameter_server one is).
    supports_exact_parameter_server = False
    # Why it does not train under ParameterServerStrategy: the refusal's reason.
    parameter_server_reason = "its steps need synchronous replicas"
    # The Sum output counting what a step processes, and the unit's name: progress
    # lines, TensorBoard and results.json give "<unit>_per_second" beside steps/s.
    throughput_unit: tuple[str, str] = ("num_examples", "examples")
    # The train step's output that on_loss_spike watches (a loss bounded below by 0);
    # None where no output means divergence when it spikes (on_loss_spike is refused).
    watched_loss: str | None = "loss"
    # Given by the Trainer (`bind`), before `build`.
    strategy: tf.distribute.Strategy
    placement: Placement  # where it runs, with the run's global batch (`loops.placement`)
    options: StepOptions
    global_step: tf.Variable
    data_offset: tf.Variable
    update_context: UpdateContext  # what its `loops.Update`s are given (`loops.Update(self, ...)`)
    weight_averages: weight_average.WeightAverages
    update_states: UpdateStates

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # v2's Loop took the run's settings: name the Trainer, not Python's "takes no arguments".
        removed_api.check_no_run_settings(cls, kwargs)
        return super().__new__(cls)

    if not TYPE_CHECKING:  # at run time only: mypy keeps checking every attribute

        def __getattr__(self, name: str):
            # Only reached for a missing attribute: say why the step context's are missing.
            if name in removed_api.RUN_METHODS:  # v2's Loop ran itself
                raise AttributeError(removed_api.run_method_sentence(type(self).__name__, name))
            if name in _GIVEN_BY_THE_TRAINER:
                kind = type(self).__name__
                raise AttributeError(
                    f"{kind} has no {name.lstrip('_')} yet: a definition gets its strategy, "
                    f"global_step and step options from the Trainer it is handed to "
                    f"(loops.Trainer({kind}(...), ...)), which then calls its build(); use them "
                    "in build and the steps."
                )
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def check_can_train(
        self, strategy: tf.distribute.Strategy, options: StepOptions, *, has_train_data: bool
    ) -> None:
        """Raises ValueError when this definition cannot train so; the Trainer asks before `build`.

        Args:
            strategy: where the steps would run.
            options: the step options given (`grad_accum_steps`, `mixed_precision`, ...).
            has_train_data: whether the Trainer was given train_data.
        """

    def check_unbound(self) -> None:
        """Raises ValueError when the definition was handed to a Trainer already."""
        if "_context" in self.__dict__:
            raise ValueError(
                f"This {type(self).__name__} was handed to a Trainer already, which built "
                "it and trains it; a definition belongs to one Trainer. Make a new "
                f"{type(self).__name__}(...) for a new Trainer."
            )

    def bind(self, context: StepContext) -> None:
        """Takes the step context a Trainer gives it, before `build`; once only.

        Raises:
            ValueError: the definition was handed to a Trainer already.
        """
        self.check_unbound()
        self._context = context
        self.strategy, self.options = context.strategy, context.options
        self.placement = context.placement
        self.global_step, self.data_offset = context.global_step, context.data_offset
        self.update_context = updates = context.update
        self.weight_averages, self.update_states = updates.weight_averages, updates.update_states

    # ---- Hooks a kind of training overrides. ----

    def build(self) -> None:
        """Creates models, optimizers and other state; runs in strategy scope."""

    def checkpoint_items(self) -> Mapping[str, Any]:
        """Name -> trackable object to checkpoint (models, optimizers, counters)."""
        return {}

    def train_step(self, iterator) -> Mapping[str, tf.Tensor]:
        """One training step in cross-replica context; see the class docstring."""
        raise NotImplementedError(
            f"{type(self).__name__} must override train_step(iterator) to train."
        )

    def eval_step(self, batch) -> Mapping[str, tf.Tensor]:
        """Sums over one distributed eval batch; see the class docstring."""
        raise NotImplementedError(
            f"{type(self).__name__} must override eval_step(batch) to evaluate "
            "on eval_data, or override run_evaluation(run)."
        )

    def run_evaluation(self, run: RunContext) -> dict[str, float]:
        """Computes the eval metrics; by default one pass of `eval_step` over the eval data."""
        return run.evaluate_eval_data()

    def eval_metric_names(self, run: RunContext) -> set[str] | None:
        """The names `run_evaluation` reports, found by tracing `eval_step`; None when not known.

        A definition that overrides `run_evaluation` overrides this too (or
        keeps None: its actions' metrics are then checked at the first
        evaluation); `run.eval_step_output_names()` gives the eval step's.
        """
        if not self.evaluates_eval_data_only():
            return None
        return run.eval_step_output_names()

    def evaluates_eval_data_only(self) -> bool:
        """Whether evaluating is one pass of `eval_step` over the eval data (no override)."""
        return type(self).run_evaluation is Loop.run_evaluation

    def results_extra(self) -> dict[str, Any]:
        """Entries a kind of training adds to results.json."""
        return {}

    def bad_step_rules(self) -> Sequence[BadStepRule]:
        """Bad-step rules of its own, acted on beside non-finite steps and loss spikes
        (`loops.run.faults.bad_steps.BadStepRule`); their recoveries count in max_recoveries.

        The Trainer calls it twice, each time for new rules: before `build`, to
        refuse a reaction its settings cannot carry out (a "recover" without a
        model_dir), and after, for the rules the run acts on. So it makes them
        from the definition's arguments, not from what `build` makes.
        """
        return ()

    # ---- What a kind that trains one model builds (in `build`). ----

    def build_one_update(
        self,
        model: keras.Model,
        optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        *,
        clip_norm: float | None = None,
        table_optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None,
        whole_batch_loss: bool = False,
    ) -> None:
        """One model, one optimizer, one `loops.Update`: sets `self.model`, `self.optimizer`,
        `self.table_optimizer` and `self.update` (call it from `build`, in scope).

        `optimizer_fn()` is built on the model's trainable weights here;
        `table_optimizer_fn()` (None: none) on its `keras.layers.Embedding`
        tables, which it then trains (`loops.Update`'s table_optimizer).
        `one_update_checkpoint_items` names what a checkpoint keeps of them.
        """
        self.model = model
        self.optimizer = optimizer_fn()
        # Built here, in scope: built lazily inside strategy.run it fails (BUILD.md fact 1).
        self.optimizer.build(model.trainable_variables)
        self.table_optimizer = built_table_optimizer(table_optimizer_fn, model)
        self.update = Update(
            self,
            self.optimizer,
            model,
            clip_norm=clip_norm,
            whole_batch_loss=whole_batch_loss,
            table_optimizer=self.table_optimizer,
        )

    def one_update_checkpoint_items(self) -> dict[str, Any]:
        """The model and optimizers `build_one_update` made, by checkpoint name."""
        items = {"model": self.model, "optimizer": self.optimizer}
        if self.table_optimizer is not None:
            items["table_optimizer"] = self.table_optimizer
        return items

    # ---- Services the steps use (from the step context). ----

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    @property
    def data_step(self) -> tf.Tensor:
        """The step a definition that makes its own data (RL) keys its randomness on, in-graph.

        The global step plus the steps `on_nonfinite="recover"` moved past: after
        a recovery, such a definition draws new data instead of the data that led
        to the non-finite step, as one with a train stream reads on past its
        batches. Without a recovery it is the global step.
        """
        return self.global_step + self.data_offset

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def leaves_out_nonfinite(self) -> bool:
        """Whether `apply_update` leaves out non-finite updates (under "skip", and under "stop"
        or "recover" where the update path must: `NonFiniteUpdates.skips`)."""
        return self.update_context.nonfinite.skips

    def apply_update(self, finite, apply_fn: Callable[..., Any], *args) -> tf.Tensor:
        """Applies a step's update as `on_nonfinite` asks; returns the step's `nonfinite` output.

        `loops.core.nonfinite_updates.NonFiniteUpdates.apply`, as `loops.Update`
        applies its own: cross-replica context; `finite` is `loops.all_finite`
        over the loss and gradients, `apply_fn` the replica function that
        applies the update.
        """
        return self.update_context.nonfinite.apply(finite, apply_fn, *args)

    def averaged_weights(self):
        """A context in which the trained variables hold their moving averages (host only).

        Without `ema_decay` it changes nothing. The run evaluates in it and
        `ExportOnEnd` exports in it; inside, `raw_weights()` gives the trained
        values back for a while (the GAN reports both).
        """
        return self.weight_averages.averaged()

    def raw_weights(self):
        """Inside `averaged_weights`: the trained variables' own values for a while."""
        return self.weight_averages.raw()


# What `bind` sets from the step context (`Loop.__getattr__` explains their absence before it).
_GIVEN_BY_THE_TRAINER = frozenset(
    {"strategy", "placement", "options", "global_step", "data_offset", "update_context"}
    | {"weight_averages", "update_states"}
    | {
        "_context",
        "step",
        "data_step",
        "num_replicas",
        "leaves_out_nonfinite",
    }  # properties of them
)
