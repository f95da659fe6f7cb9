"""The Loop: everything about training that does not depend on the step."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from loops import (
    distributed_input,
    executors,
    model_dir_lock,
    outputs,
    parameter_server,
    reduction,
    reporting,
    strategies,
)
from loops import mixed_precision as mixed_precision_lib
from loops.actions import Action, watched_metrics
from loops.checkpoints import Checkpointer, FinitenessCheck, describe_names
from loops.errors import NonFiniteError
from loops.preemption import PreemptionWatcher


class _BuildsAfterInit(type):
    """Runs a new loop's build and restore after its whole __init__ chain has returned."""

    def __call__(cls, *args, **kwargs):
        loop = super().__call__(*args, **kwargs)
        loop._build_and_restore()
        return loop


class Loop(metaclass=_BuildsAfterInit):
    """Owns the strategy, the input, the global step and the outer training loop.

    A kind of training is a subclass that creates its objects in `build` and
    says what one step does in `train_step` (and, to evaluate on a dataset,
    `eval_step`). The Loop runs `steps_per_loop` train steps inside one
    `tf.function` (a `tf.while_loop`), and between those inner loops it writes
    progress lines, TensorBoard summaries, checkpoints and evaluations, and
    runs its `actions` (early stopping, keeping the best checkpoint, exports,
    or a user's own `loops.Action`). A new Loop restores the newest checkpoint
    in `model_dir`, so a restarted job continues from its last saved step.

    Example:

        class Regression(loops.Loop):
            def build(self):
                self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
                self.optimizer = keras.optimizers.SGD(0.1)
                self.optimizer.build(self.model.trainable_variables)

            def checkpoint_items(self):
                return {"model": self.model, "optimizer": self.optimizer}

            def train_step(self, iterator):
                def replica_step(x, y):
                    count = loops.global_count(tf.shape(y)[0])
                    with tf.GradientTape() as tape:
                        error = tf.squeeze(self.model(x), -1) - y
                        loss = loops.scale_to_global_batch(error ** 2, count)
                    grads = tape.gradient(loss, self.model.trainable_variables)
                    self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
                    return {"loss": loss}
                x, y = next(iterator)
                sums = loops.sum_over_replicas(
                    self.strategy, self.strategy.run(replica_step, args=(x, y)))
                return {"loss": loops.Mean(sums["loss"])}

    Contract of the hooks:
        build(): runs once in the strategy's scope (`strategies.variable_scope`),
            after every `__init__` of the subclass has returned (so a subclass
            sets its attributes before or after `super().__init__()`, as it
            likes); creates every variable the steps use (models, optimizers
            built with `optimizer.build`, counters).
        checkpoint_items(): name -> trackable, saved and restored by the Loop.
        train_step(iterator): cross-replica context; calls `next(iterator)`
            exactly `batches_per_step` times (the Loop dequeues those batches
            while the previous step computes; iterator is None for a loop with
            needs_train_data = False and no train_data); `self.global_step`
            holds the index of the step being run; returns a dict of typed
            outputs (`loops.Mean`, `Ratio`, `Sum`, `Last`) of scalar tensors
            already reduced over replicas: how each aggregates over an inner
            loop (loops/outputs.py).
        eval_step(batch): cross-replica context; returns typed outputs the
            same way, aggregated over the whole eval set.

    A step that checks its loss and gradients (`loops.all_finite`) applies
    its update with `self.apply_update`, which follows `on_nonfinite`, and
    returns the flag it gets as `nonfinite`.

    Actions run on the host on every worker: `before_train`, then
    `after_loop` after inner loops, `after_eval` after each evaluation, and
    `after_train` at the end (not when preempted). An action may call
    `request_stop(reason)`: the inner loop in progress is the last, then the
    Loop evaluates (unless it just did), saves, writes results.json with the
    `stop_reason`, and `train` returns. Between inner loops the Loop
    evaluates before it saves, so a checkpoint holds what the actions
    concluded from the evaluation at its step.
    """

    name = "loop"
    # Config keys a resumed run may change without a warning.
    config_free_to_change = frozenset(
        {
            "train_steps",
            "model_dir",
            "export_dir",
            "verbosity",
            "eval_every",
            "checkpoint_every",
            "steps_per_loop",
        }
    )
    batches_per_step = 1  # global batches one train_step dequeues; sets the resume position
    needs_train_data = True  # False for steps that make their own data (RL): iterator is None
    supports_parameter_server = False  # True when train_step is right for asynchronous workers

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
        # Execution.
        seed: int = 0,
        run_eagerly: bool = False,
        on_nonfinite: str = "stop",
        # How the steps' `loops.Update`s compute.
        mixed_precision: str = "none",
        loss_scale_growth_steps: int | None = None,
        grad_accum_steps: int = 1,
        # Host-side callbacks.
        actions: Sequence[Action] = (),
        # What the run was asked to do, recorded with its results.
        config: Mapping[str, Any] | None = None,
    ):
        """Creates the loop's objects in the strategy's scope and restores them.

        Args:
            strategy: where the steps run; the current (default) strategy if None.
            train_data: the training stream of global batches; repeated forever.
            eval_data: a finite dataset of global batches for `evaluate`.
            steps_per_loop: train steps per `tf.function` call; summaries,
                progress and metric reads happen only between calls.
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
            seed: the seed steps key their randomness on.
            run_eagerly: run steps without `tf.function`, for debugging.
            on_nonfinite: what a step whose loss or gradients are not finite
                on some replica (its `nonfinite` output is set) leads to.
                "stop": the inner loop ends right after it, nothing is saved
                after it, the loop goes back to its last checkpoint and
                NonFiniteError names the step (without a checkpoint, the
                loop then refuses to train on). "skip": its update is not
                applied on any replica and training goes on; every update
                then waits for the finiteness check (see `apply_update`).
            mixed_precision: "none" (float32), "mixed_bfloat16" or
                "mixed_float16": the Keras dtype policy `build` runs under
                (layers given an explicit dtype keep it; variables stay
                float32). Under "mixed_float16" every `loops.Update` keeps a
                dynamic loss scale.
            loss_scale_growth_steps: under "mixed_float16", finite steps in a
                row after which the loss scale doubles (default 2000).
            grad_accum_steps: micro-batches each `loops.Update` cuts a
                replica's share of a step into, accumulating their
                gradients into one update (the same update as the whole
                batch at once, with 1/K of the activations in memory).
            actions: `loops.Action`s run between inner loops, after
                evaluations and at the ends of `train`; their state is saved
                with the checkpoints.
            config: the run's configuration (a binary's flag values, or a
                user's hyperparameters), JSON-serializable; written into
                results.json under "config".

        Raises:
            ValueError: a bad argument, or a checkpoint in model_dir that does
                not match this loop.
        """
        _check_positive("steps_per_loop", steps_per_loop)
        _check_positive("eval_every", eval_every, optional=True)
        _check_positive("checkpoint_every", checkpoint_every, optional=True)
        _check_positive("max_checkpoints", max_checkpoints)
        if on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(
                f"on_nonfinite must be one of {NONFINITE_POLICIES}, got {on_nonfinite!r}."
            )
        _check_positive("grad_accum_steps", grad_accum_steps)
        self.mixed_precision = mixed_precision_lib.check_policy(mixed_precision)
        if loss_scale_growth_steps is not None and not mixed_precision_lib.needs_loss_scale(
            mixed_precision
        ):
            raise ValueError(
                f"loss_scale_growth_steps={loss_scale_growth_steps!r} applies only to "
                f"mixed_precision='mixed_float16' (got {mixed_precision!r}); drop it or "
                "switch to float16."
            )
        self.loss_scale_growth_steps = (
            mixed_precision_lib.DEFAULT_GROWTH_STEPS
            if loss_scale_growth_steps is None
            else loss_scale_growth_steps
        )
        self.grad_accum_steps = grad_accum_steps
        if model_dir is not None and os.path.exists(model_dir) and not os.path.isdir(model_dir):
            raise ValueError(
                f"model_dir {model_dir!r} is a file, not a directory; pass a "
                "directory path (it is created if missing)."
            )
        self.strategy = strategy or tf.distribute.get_strategy()
        # Under ParameterServerStrategy this process is the coordinator and the
        # steps run asynchronously on the workers (loops/parameter_server.py).
        self._coordinator = None
        if strategies.strategy_name(self.strategy) == "parameter_server":
            if not self.supports_parameter_server:
                raise ValueError(
                    f"{type(self).__name__} does not train under ParameterServerStrategy "
                    "(its steps need synchronous replicas). Use "
                    "--strategy=multi_worker_mirrored or mirrored."
                )
            self._coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
                self.strategy
            )
        self.train_data = train_data
        self.eval_data = eval_data
        self.steps_per_loop = steps_per_loop
        self.eval_every = eval_every
        self.checkpoint_every = checkpoint_every
        self.model_dir = model_dir
        if progress_every_seconds is not None and not progress_every_seconds > 0:
            raise ValueError(
                f"progress_every_seconds must be > 0 (or None to turn it off), got "
                f"{progress_every_seconds!r}."
            )
        self.progress_every_seconds = progress_every_seconds
        self._seconds_per_step: float | None = None
        self.seed = seed
        self.run_eagerly = run_eagerly
        self.on_nonfinite = on_nonfinite
        self.is_chief = strategies.is_chief(self.strategy)
        self.progress = progress or reporting.Progress()
        self.summaries = reporting.Summaries(
            os.path.join(model_dir, "summaries") if model_dir and self.is_chief else None
        )
        self.actions = _checked_actions(actions)
        self.config = dict(config or {})
        # Every evaluation of the run ({"step": ..., metric: value}), kept across resumes.
        self.eval_history: list[dict[str, Any]] = []
        self.stop_reason: str | None = None
        self._evaluated_step: int | None = None
        self._saved_step: int | None = None

        self._train_iterator: Iterator | None = None
        self._train_iterator_position = -1
        self._eval_dataset: Any = None
        self.last_train_metrics: dict[str, float] = {}
        self.last_eval_metrics: dict[str, float] = {}
        self.steps_per_second = 0.0
        self.skipped_steps = 0
        # The step that left non-finite weights in memory with no checkpoint to go back to.
        self._nonfinite_weights_step: int | None = None
        self.preempted = False
        self.max_checkpoints = max_checkpoints
        # build() and the restore run once every __init__ of a subclass has
        # returned (_BuildsAfterInit), so a subclass may set its own
        # attributes before or after calling super().__init__().
        self.global_step: tf.Variable
        self.checkpointer: Checkpointer | None = None
        self._lock: str | None = None  # the lock file, held by the chief

    def _build_and_restore(self) -> None:
        """Creates the loop's objects in the strategy's scope and restores the newest checkpoint."""
        with strategies.variable_scope(self.strategy):
            self.global_step = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            with mixed_precision_lib.dtype_policy_scope(self.mixed_precision):
                self.build()
            for action in self.actions:
                action.build(self)
        action_state = _action_state(self.actions)

        items = dict(self.checkpoint_items())
        if "global_step" in items:
            raise ValueError("checkpoint_items() must not use the reserved name 'global_step'.")
        items["global_step"] = self.global_step
        # What a save would write, checked for NaN and inf after every inner loop.
        self._finiteness = FinitenessCheck(tf.train.Checkpoint(**items))
        self.executor = self._make_executor()
        model_dir = self.model_dir
        if model_dir is not None:
            if self.is_chief:
                self._lock = model_dir_lock.acquire(model_dir)
                # Holding the lock, whatever a killed writer left half-written is stale.
                reporting.remove_unfinished_writes(model_dir)
            self.checkpointer = Checkpointer(
                strategy=self.strategy,
                directory=os.path.join(model_dir, "checkpoints"),
                items=items,
                step_counter=self.global_step,
                max_to_keep=self.max_checkpoints,
                optional_items=action_state,
                say=self.progress.line,
            )
            try:
                restored = self.checkpointer.restore()
                if self.is_chief:
                    self._compare_config(restored is not None)
            except (ValueError, OSError):
                self.close()
                raise
            if restored:
                self.progress.line(f"restored {restored} at step {self.step}")
                self.eval_history = reporting.previous_history(model_dir, up_to_step=self.step)

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
            "on eval_data, or override run_evaluation()."
        )

    def run_evaluation(self) -> dict[str, float]:
        """Computes the eval metrics; by default one pass over `eval_data`."""
        if self.eval_data is None:
            return {}
        if self._eval_dataset is None and self._coordinator is not None:
            # The coordinator evaluates by itself, reading the weights from the ps.
            self._eval_dataset = distributed_input.as_dataset_fn(self.eval_data)()
        elif self._eval_dataset is None:
            self._eval_dataset = distributed_input.distribute(self.strategy, self.eval_data)
        return self.executor.evaluate(iter(self._eval_dataset))

    def results_extra(self) -> dict[str, Any]:
        """Entries a kind of training adds to results.json."""
        return {}

    # ---- The outer loop. ----

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def train(self, num_steps: int) -> dict[str, np.ndarray]:
        """Trains until the global step reaches `num_steps`.

        `num_steps` is a total, so a loop restored at step k trains only the
        remaining num_steps - k steps. Evaluates and checkpoints at the end;
        an action's `request_stop` ends it earlier, the same way.

        Returns:
            name -> array of the per-step values `train_step` returned, one
            entry per step trained in this call.
        """
        _check_positive("num_steps", num_steps)
        if self._nonfinite_weights_step is not None:
            # Kernels need not show them again: oneDNN's fused ReLU turns a
            # NaN into 0, and the next steps' loss and gradients are finite.
            raise NonFiniteError(
                f"At step {self._nonfinite_weights_step} the weights were not finite and "
                "there was no checkpoint to go back to, so this loop cannot train on. Build "
                "it again, with a model_dir and checkpoint_every so that a stop goes back "
                "to the last checkpoint."
            )
        if self.train_data is None and self.needs_train_data:
            raise ValueError(
                f"{type(self).__name__} has no train_data; pass train_data= to the constructor."
            )
        self._check_watched_metrics()
        start_step = self.step
        history: dict[str, list[np.ndarray]] = {}
        self.stop_reason = None
        self.preempted = False
        loop_times: list[tuple[int, float]] = []
        # SIGTERM is only noted from here to the end of train, and acted on at
        # the next boundary (after an inner loop, an evaluation or the final
        # save): whatever moment it comes, every completed step gets saved.
        with PreemptionWatcher(self.strategy) as preemption:
            self.summaries.hparams(self.config)
            for action in self.actions:
                action.before_train(self)
            if start_step >= num_steps:
                self.progress.line(
                    f"already at step {start_step} >= {num_steps}: nothing to train "
                    "(the model_dir holds a finished run; raise the step count to continue)."
                )
            iterator = self._iterator_at(start_step)
            self._train_loops(iterator, start_step, num_steps, history, loop_times, preemption)
            if loop_times:
                # The first inner loop includes tracing; leave it out when there are others.
                timed = loop_times[1:] or loop_times
                self.steps_per_second = sum(n for n, _ in timed) / max(
                    sum(t for _, t in timed), 1e-9
                )
            if not self.preempted and self._evaluated_step != self.step:
                self.evaluate()
                self.preempted = preemption.should_stop()
            if self._saved_step != self.step and (loop_times or self.preempted):
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
                    f"preempted (SIGTERM) at step {self.step}: every completed step is saved; "
                    "run the same command again to continue from it"
                )
            else:
                for action in self.actions:
                    action.after_train(self)
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
        """Runs inner loops, with what happens between them, up to `num_steps`."""
        while step < num_steps and self.stop_reason is None:
            steps = self._next_loop_length(step, num_steps)
            started = time.perf_counter()
            run = self.executor.run(iterator, steps)
            seconds = time.perf_counter() - started
            done, step = run.reached - step, run.reached
            logs = {name: values[:done] for name, values in run.logs.items()}
            # Stopped early, the iterator may have dequeued the next step's batches.
            self._train_iterator_position = step * self.batches_per_step if done == steps else -1
            self._check_nonfinite(logs, step - done)
            if not run.weights_finite:
                self._stop_on_nonfinite_weights(step)
            loop_times.append((done, seconds))
            self._seconds_per_step = seconds / max(done, 1)
            for name, values in outputs.per_step_values(run.kinds, logs).items():
                history.setdefault(name, []).append(values)
            rate = done / seconds if seconds > 0 else 0.0
            self.last_train_metrics = outputs.aggregate_steps(run.kinds, logs)
            self.summaries.scalars(
                "train", step, {**self.last_train_metrics, "steps_per_second": rate}
            )
            self.progress.train(step, num_steps, self.last_train_metrics, rate)
            if preemption.should_stop():
                self.preempted = True
                break
            for action in self.actions:
                if not action.every or step % action.every == 0:
                    action.after_loop(self, step, self.last_train_metrics)
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

    def evaluate(self) -> dict[str, float]:
        """Runs `run_evaluation`, reports the metrics, calls the actions' `after_eval`."""
        metrics = self.run_evaluation()
        self._evaluated_step = self.step
        if metrics:
            self.last_eval_metrics = metrics
            self.eval_history = [entry for entry in self.eval_history if entry["step"] < self.step]
            self.eval_history.append({"step": self.step, **metrics})
            self.summaries.scalars("eval", self.step, metrics)
            self.progress.eval(self.step, metrics)
        for action in self.actions:
            action.after_eval(self, self.step, metrics)
        return metrics

    def request_stop(self, reason: str) -> None:
        """Ends `train` after the inner loop in progress; see the class docstring.

        Every worker must request it at the same step: decide from the
        metrics the action hooks get, which are the same on every worker.
        """
        if self.stop_reason is None:
            self.stop_reason = reason
            self.progress.line(f"stopping at step {self.step}: {reason}")

    def close(self) -> None:
        """Releases the model_dir lock and removes its file (a kill leaves the file, unlocked)."""
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
        self._saved_step = self.step
        return path

    def write_results(self) -> dict[str, Any]:
        """Writes model_dir/results.json (chief only) and returns its contents."""
        results = {
            "loop": self.name,
            "strategy": strategies.strategy_name(self.strategy),
            "num_replicas": self.num_replicas,
            "global_step": self.step,
            "train": self.last_train_metrics,
            "eval": self.last_eval_metrics,
            "steps_per_second": self.steps_per_second,
            "skipped_steps": self.skipped_steps,
            "preempted": self.preempted,
            "stop_reason": self.stop_reason,
            "config": self.config,
            "history": self.eval_history,
            "versions": reporting.library_versions(),
            **self.results_extra(),
        }
        if self.model_dir and self.is_chief:
            reporting.write_json_atomic(os.path.join(self.model_dir, "results.json"), results)
        return results

    # ---- Machinery. ----

    @property
    def skips_nonfinite(self) -> bool:
        """Whether `apply_update` leaves out non-finite updates (else it applies every update).

        Under a float16 loss scale an overflow is routine and skipped. Under
        ParameterServerStrategy the workers go on with the steps already
        scheduled while the coordinator decides, so there even "stop" skips.
        """
        return (
            self.on_nonfinite == "skip"
            or self._coordinator is not None
            # An overflow is routine under a loss scale: its update is always left out.
            or mixed_precision_lib.needs_loss_scale(self.mixed_precision)
        )

    def apply_update(self, finite, apply_fn: Callable[..., Any], *args) -> tf.Tensor:
        """Runs `strategy.run(apply_fn, args)` the way `on_nonfinite` asks; cross-replica context.

        Args:
            finite: the per-replica result of `loops.all_finite` over the
                step's loss and gradients (the same on every replica).
            apply_fn: the replica function that applies the update.

        Returns:
            1.0 when the step was not finite on some replica, else 0.0: the
            step's `nonfinite` output.

        When `skips_nonfinite`, the update runs only when `finite` holds
        (`loops.apply_if_finite`), so it waits for every gradient and the
        check: 10-20% of a step of the digits MLP (BUILD.md). Otherwise ("stop")
        each variable's update starts as soon as its gradient is ready, and
        the Loop ends the inner loop right after a non-finite step and goes
        back to the last checkpoint.
        """
        if self.skips_nonfinite:
            return reduction.apply_if_finite(self.strategy, finite, apply_fn, *args)
        self.strategy.run(apply_fn, args=args)
        return 1.0 - tf.cast(self.strategy.experimental_local_results(finite)[0], tf.float32)

    def _check_nonfinite(self, logs: Mapping[str, np.ndarray], first_step: int) -> None:
        """Counts skipped steps; under "stop", goes back to the last checkpoint and raises."""
        flags = logs.get(outputs.NONFINITE)
        if flags is None or not np.any(flags > 0):
            return
        if self.skips_nonfinite:
            self.skipped_steps += int(np.sum(flags > 0))
        if self.on_nonfinite != "stop":
            return
        bad_step = first_step + int(np.argmax(flags > 0)) + 1
        if self.skips_nonfinite:
            state = "Its update was skipped and nothing was saved after it."
        else:
            state = self._go_back_to_checkpoint()
        raise NonFiniteError(
            f"Step {bad_step}: the loss or the gradients were not finite on at least one "
            f"replica. {state} Lower the learning rate, clip gradients, check the input, "
            "or pass on_nonfinite='skip' (--on_nonfinite=skip) to leave out such steps."
        )

    def _stop_on_nonfinite_weights(self, step: int) -> None:
        """Goes back to the last checkpoint (every one is finite) and raises NonFiniteError.

        The loss and gradient checks cannot see an update that is itself not
        finite (an infinite learning rate, an overflowing optimizer state), and
        no policy can skip it after the fact, so every policy stops here.
        """
        bad = self._finiteness.nonfinite_names()
        state = self._go_back_to_checkpoint()
        raise NonFiniteError(
            f"After step {step}, {describe_names(bad)} not finite (NaN or inf), although the "
            f"steps' loss and gradient checks passed: an update itself was not finite. {state} "
            "Check the learning rate and the optimizer's settings (a learning rate that is "
            "inf or huge does this), or clip gradients."
        )

    def _go_back_to_checkpoint(self) -> str:
        """Restores the last checkpoint after a non-finite step; says where the loop is now."""
        if self.checkpointer is not None and self.checkpointer.restore() is not None:
            self._train_iterator_position = -1  # the stream resumes at the checkpoint's step
            return (
                f"Nothing was saved after it; the loop is back at its last checkpoint "
                f"(step {self.step}), where a rerun also resumes."
            )
        self._nonfinite_weights_step = self.step
        return (
            "There is no checkpoint to go back to: the weights in memory are not finite, "
            "and nothing was saved."
        )

    def _check_watched_metrics(self) -> None:
        """Fails before any step when an action watches an eval metric the loop does not report."""
        names = self.eval_metric_names()
        if names is not None:
            watched_metrics(self.actions, names)

    def eval_metric_names(self) -> set[str] | None:
        """The names `evaluate` reports, found by tracing `eval_step`; None when not known.

        A loop that overrides `run_evaluation` overrides this too (or keeps
        None: its actions' metrics are then checked at the first evaluation).
        """
        if type(self).run_evaluation is not Loop.run_evaluation:
            return None
        if self.eval_data is None:
            return set()
        if self._coordinator is not None:
            return None
        if self._eval_dataset is None:
            self._eval_dataset = distributed_input.distribute(self.strategy, self.eval_data)
        return self.executor.eval_output_names(self._eval_dataset.element_spec)

    def _compare_config(self, resuming: bool) -> None:
        """Warns about settings that differ from the run that wrote model_dir; records these."""
        assert self.model_dir is not None  # only called with a model_dir
        path = os.path.join(self.model_dir, "config.json")
        current = {
            **self.config,
            **{
                f"checkpoint.{name}": type(item).__name__
                for name, item in self.checkpoint_items().items()
            },
        }
        if resuming and os.path.exists(path):
            try:
                with open(path) as stream:
                    previous = json.load(stream)
            except (OSError, ValueError):
                previous = {}
            changed = sorted(
                key
                for key in set(previous) | set(current)
                if key not in self.config_free_to_change and previous.get(key) != current.get(key)
            )
            for key in changed:
                self.progress.line(
                    f"warning: {key} was {previous.get(key)!r} in the run that wrote "
                    f"{self.model_dir} and is {current.get(key)!r} now; the checkpoint is "
                    "restored and training goes on with the new value. If that is not what "
                    "you meant, stop and rerun with the old value or a new --model_dir."
                )
        reporting.write_json_atomic(path, current)

    def _next_loop_length(self, step: int, num_steps: int) -> int:
        stop = min(step + self.steps_per_loop, num_steps)
        if (
            self.progress_every_seconds
            and self._seconds_per_step
            and strategies.num_workers(self.strategy) == 1
            and self._coordinator is None
        ):
            stop = min(
                stop, step + max(1, int(self.progress_every_seconds / self._seconds_per_step))
            )
        for every in (
            self.checkpoint_every,
            self.eval_every,
            *(action.every for action in self.actions),
        ):
            if every:
                stop = min(stop, (step // every + 1) * every)
        return stop - step

    def _iterator_at(self, step: int):
        """The train iterator positioned after `step` steps' batches (None without data)."""
        if self.train_data is None:
            return None
        if self._coordinator is not None:
            # Asynchronous workers read their own streams: there is no position to resume at.
            if self._train_iterator is None:
                self._train_iterator = parameter_server.worker_iterator(
                    self._coordinator, self.train_data
                )
            return self._train_iterator
        position = step * self.batches_per_step
        if self._train_iterator is None or self._train_iterator_position != position:
            self._train_iterator = distributed_input.train_iterator(
                self.strategy, self.train_data, skip_batches=position
            )
            self._train_iterator_position = position
        return self._train_iterator

    def _make_executor(self) -> executors.Executor:
        definition = executors.StepDefinition(
            name=type(self).__name__,
            strategy=self.strategy,
            train_step=self.train_step,
            eval_step=self.eval_step,
            batches_per_step=self.batches_per_step,
            global_step=self.global_step,
            finiteness=self._finiteness,
        )
        if self._coordinator is not None:
            return executors.ScheduledExecutor(definition, coordinator=self._coordinator)
        executor_class = executors.EagerExecutor if self.run_eagerly else executors.Executor
        return executor_class(definition, stop_on_nonfinite=self.on_nonfinite == "stop")


NONFINITE_POLICIES = ("stop", "skip")


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
