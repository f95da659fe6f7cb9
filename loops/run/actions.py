"""Actions: host-side code a Loop runs between inner loops, such as early stopping or exports."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from loops.core import reporting
from loops.definition.run_context import RunContext
from loops.model_dir.checkpoints import Checkpointer
from loops.tables import embedding_tables
from loops.vocabulary.choices import METRIC_MODES
from loops.vocabulary.whole_numbers import is_whole


class Action:
    """Something a Loop runs on the host: between inner loops, after evaluations, at the ends.

    Override any hook; each does nothing by default. Every worker runs every
    action with the same arguments (metrics are reduced over all workers), so
    an action that decides only from them decides the same on every worker:
    all workers then request a stop at the same step and all take part in any
    checkpoint save, as MultiWorkerMirroredStrategy needs (BUILD.md fact 11).
    Write files only where `run.is_chief`. Each hook gets the run as its
    `loops.definition.run_context.RunContext` (`trainer.run_context`), which names what
    an action may use (`run.definition` is what is trained, `run.state` what the
    run did so far).

    Attributes:
        every: call `after_loop` only at steps that are multiples of this, and
            end an inner loop there; None calls it after every inner loop
            (each inner loop is then a call of its own: see
            `loops.run.execution.loop_schedule.LoopSchedule.call_ends`).
        name: the name of the action's state in checkpoints, unique among a
            loop's actions that have state; by default the class name in
            snake_case. Set it on a class or an instance.

    Example, printing the loss every 100 steps:

        class PrintLoss(loops.Action):
            every = 100

            def after_loop(self, run, step, train_metrics):
                if run.is_chief:
                    print(f"step {step}: loss {train_metrics['loss']:.4f}")

        trainer = loops.Trainer(MyLoop(), ..., actions=[PrintLoss()])
    """

    every: int | None = None
    # Whether a change the run's final evaluation makes to this action's checkpointed state
    # is saved with the checkpoint of that step when the run saved it before evaluating it
    # (a rerun of a run preempted at its last step). KeepBest's is: its record names the
    # kept best's files. A count is not: a rerun's repeat evaluation would count twice.
    record_saved_at_end = False

    @property
    def name(self) -> str:
        return (
            self.__dict__.get("_name")
            or re.sub(r"(?<!^)(?=[A-Z])", "_", type(self).__name__).lower()
        )

    @name.setter
    def name(self, value: str) -> None:
        self.__dict__["_name"] = value

    def build(self, run: RunContext) -> None:
        """Creates the action's state; runs once in the run's strategy scope, before restoring."""

    def checkpoint_items(self) -> Mapping[str, tf.Variable]:
        """Name -> variable saved with the run's checkpoints and restored on resume.

        A checkpoint from a run without this action restores everything else;
        the action's variables then keep the values `build` gave them.
        """
        return {}

    def before_train(self, run: RunContext) -> None:
        """At the start of `Trainer.train`, after the run restored its checkpoint."""

    def after_loop(self, run: RunContext, step: int, train_metrics: Mapping[str, float]) -> None:
        """After an inner loop that ended at `step` (see `every`); metrics averaged over it."""

    def after_eval(self, run: RunContext, step: int, eval_metrics: Mapping[str, float]) -> None:
        """After each evaluation; `eval_metrics` is empty when the run evaluates nothing."""

    def after_train(self, run: RunContext) -> None:
        """When `Loop.train` ends (not when preempted), after the last checkpoint and results."""


class UnknownMetricError(ValueError):
    """An action watches an eval metric the run does not report."""


class _WatchesMetric(Action):
    """An action that tracks the best value of one eval metric, kept in the checkpoint."""

    flag = ""  # the command-line flag that sets the metric, named in errors

    def __init__(self, metric: str, *, mode: str, min_delta: float):
        if not isinstance(metric, str) or not metric:
            raise ValueError(
                f"{type(self).__name__} needs the name of an eval metric, e.g. "
                f"'loss' or 'accuracy'; got {metric!r}."
            )
        if mode not in METRIC_MODES:
            raise ValueError(
                f"mode must be 'min' (lower is better, e.g. loss) or 'max' (higher "
                f"is better, e.g. accuracy); got {mode!r}."
            )
        if not min_delta >= 0:
            raise ValueError(f"min_delta must be >= 0, got {min_delta!r}.")
        self.metric = metric
        self.mode = mode
        self.min_delta = float(min_delta)

    def build(self, run: RunContext) -> None:
        # The worst finite value, so the first finite one is an improvement. Not inf: a
        # checkpoint saved before the first evaluation holds it, and a save refuses a
        # variable that is not finite.
        self.best = _state_variable(_NO_VALUE if self.mode == "min" else -_NO_VALUE, "best")

    def best_value(self) -> float | None:
        """The best value seen so far; None before the first finite one."""
        value = float(self.best.numpy())
        # inf: what checkpoints of loops before 5.2.0 hold before the first evaluation.
        return None if math.isinf(value) or abs(value) == _NO_VALUE else value

    def watched_value(self, eval_metrics: Mapping[str, float]) -> float:
        """The watched metric's value.

        Raises:
            UnknownMetricError: the run does not report the metric.
        """
        if self.metric not in eval_metrics:
            reported = ", ".join(sorted(eval_metrics)) or "none"
            flag = f" ({self.flag}=NAME)" if self.flag else ""
            raise UnknownMetricError(
                f"{type(self).__name__} watches the eval metric {self.metric!r}, which this "
                f"loop does not report; the metrics it reports are: {reported}. Choose one of "
                f"those{flag}."
            )
        return float(eval_metrics[self.metric])

    def check_reported(self, reported: set[str]) -> None:
        """Raises UnknownMetricError unless the watched metric is among `reported`."""
        self.watched_value({name: 0.0 for name in reported})

    def improves(self, value: float) -> bool:
        """Whether `value` beats the best by more than min_delta (NaN never does)."""
        best = float(self.best.numpy())
        if self.mode == "min":
            return value < best - self.min_delta
        return value > best + self.min_delta


class EarlyStopping(_WatchesMetric):
    """Stops training when an eval metric has not improved for `patience` evaluations in a row.

    The best value and the count of evaluations without improvement are saved
    with the run's checkpoints, so a resumed run goes on counting, and a run
    that had stopped early stops again at once when rerun (pass a larger
    patience to train on).

    Example:

        trainer = loops.Trainer(loops.ClassifierLoop(...), ..., eval_every=100,
                                actions=[loops.EarlyStopping("accuracy", mode="max")])
    """

    name = "early_stopping"
    flag = "--early_stopping_metric"

    def __init__(
        self, metric: str, *, mode: str = "min", patience: int = 3, min_delta: float = 0.0
    ):
        """
        Args:
            metric: the eval metric to watch, e.g. "loss".
            mode: "min" when lower is better, "max" when higher is better.
            patience: evaluations in a row without improvement after which
                training stops.
            min_delta: an improvement must beat the best by more than this.

        Raises:
            ValueError: a bad argument.
        """
        super().__init__(metric, mode=mode, min_delta=min_delta)
        if not is_whole(patience, 1):
            raise ValueError(
                f"patience must be a whole number of evaluations >= 1, got {patience!r}."
            )
        self.patience = patience

    def build(self, run: RunContext) -> None:
        if not run.eval_every:
            raise ValueError(
                f"EarlyStopping({self.metric!r}) compares evaluations, but the run evaluates "
                "only at the end of training; pass eval_every= to the Trainer (--eval_every)."
            )
        super().build(run)
        self.evaluations_without_improvement = _state_variable(0, "evaluations_without_improvement")

    def checkpoint_items(self):
        return {"best": self.best, "wait": self.evaluations_without_improvement}

    def before_train(self, run: RunContext) -> None:
        if self._exhausted():
            run.request_stop(self._reason())

    def after_eval(self, run: RunContext, step: int, eval_metrics: Mapping[str, float]) -> None:
        value = self.watched_value(eval_metrics)
        if self.improves(value):
            self.best.assign(value)
            self.evaluations_without_improvement.assign(0)
        else:
            self.evaluations_without_improvement.assign_add(1)
        if self._exhausted():
            run.request_stop(self._reason())

    def _exhausted(self) -> bool:
        return int(self.evaluations_without_improvement.numpy()) >= self.patience

    def _reason(self) -> str:
        best = self.best_value()
        since = "had no finite value" if best is None else f"not improved on its best {best:.6g}"
        return (
            f"early stopping: eval {self.metric} has {since} for "
            f"{int(self.evaluations_without_improvement.numpy())} evaluations "
            f"(patience {self.patience})"
        )


class KeepBest(_WatchesMetric):
    """Keeps a checkpoint of the run at its best evaluation by one eval metric.

    Whenever the metric improves, every worker saves the run's state into
    `directory` (the chief keeps it, others write to scratch), replacing the
    previous best, and the chief writes `best.json` there: the step, the
    metric, its value and the checkpoint path. The best value so far is saved
    with the run's checkpoints, so a resumed run keeps comparing against it.

    Example:

        trainer = loops.Trainer(loops.ClassifierLoop(...), ..., model_dir=model_dir,
                                eval_every=100, actions=[loops.KeepBest("accuracy", mode="max")])
        # After training: tf.train.Checkpoint(model=model).restore(best_checkpoint_path)
    """

    name = "keep_best"
    flag = "--keep_best_metric"
    record_saved_at_end = True

    def __init__(
        self,
        metric: str,
        *,
        mode: str = "min",
        min_delta: float = 0.0,
        directory: str | None = None,
    ):
        """
        Args:
            metric: the eval metric to watch, e.g. "loss".
            mode: "min" when lower is better, "max" when higher is better.
            min_delta: an improvement must beat the best by more than this.
            directory: where the best checkpoint goes; default model_dir/best
                (give a second KeepBest of a loop its own directory and name).

        Raises:
            ValueError: a bad argument.
        """
        super().__init__(metric, mode=mode, min_delta=min_delta)
        self.directory = directory
        self._checkpointer: Checkpointer | None = None

    def build(self, run: RunContext) -> None:
        if run.model_dir is None:
            raise ValueError(
                f"KeepBest({self.metric!r}) saves the run's checkpoints, which "
                "needs a model_dir; pass model_dir= to the Trainer."
            )
        super().build(run)
        self.directory = self.directory or os.path.join(run.model_dir, "best")
        self.best_step = _state_variable(-1, "best_step")

    def checkpoint_items(self):
        return {"best": self.best, "step": self.best_step}

    def after_eval(self, run: RunContext, step: int, eval_metrics: Mapping[str, float]) -> None:
        value = self.watched_value(eval_metrics)
        if not self.improves(value):
            return
        self.best.assign(value)
        self.best_step.assign(step)
        # build() set both: a KeepBest needs the run's model_dir and checkpointer.
        assert self.directory is not None and run.checkpointer is not None
        if self._checkpointer is None:
            # Built at the first save: the run's checkpointer exists only after every build.
            self._checkpointer = Checkpointer(
                strategy=run.strategy,
                directory=self.directory,
                items=run.checkpointer.items,
                step_counter=run.global_step,
                max_to_keep=1,
            )
        path = self._checkpointer.save()
        if run.is_chief:
            reporting.write_json_atomic(
                os.path.join(self.directory, "best.json"),
                {
                    "metric": self.metric,
                    "mode": self.mode,
                    "value": value,
                    "step": step,
                    "checkpoint": path,
                },
            )
            run.progress.line(
                f"best {self.metric} so far ({value:.6g}) at step {step}: saved {path}"
            )


def watched_metrics(actions, reported: set[str]) -> None:
    """Checks, before training, that every action watching an eval metric gets it.

    Raises:
        UnknownMetricError: an action watches a metric not in `reported`.
    """
    for action in actions:
        if isinstance(action, _WatchesMetric):
            action.check_reported(reported)


class ExportOnEnd(Action):
    """Exports the trained model when training ends (the chief only), e.g. as a SavedModel.

    Not run when training is preempted: the rerun that finishes it exports.
    With the run's `ema_decay`, the export runs while the model holds the
    moving average of its weights (`Loop.averaged_weights`).

    Example:

        from loops.model_dir.classifier_export import export_classifier

        loops.ExportOnEnd(lambda definition: export_classifier(definition.model, "/tmp/export"))
    """

    def __init__(self, export: Callable[[Any], str], *, description: str = ""):
        """
        Args:
            export: the trained definition (`run.definition`) -> the path it wrote.
            description: what the export serves, added to the line that names the path.
        """
        self.export = export
        self.description = description

    def after_train(self, run: RunContext) -> None:
        # Tables split over several workers are gathered whole on each (every worker joins).
        with embedding_tables.held_whole(run.definition.checkpoint_items()):
            if not run.is_chief:
                return
            with run.averaged_weights():  # the moving average, when the run keeps one
                path = self.export(run.definition)
        detail = f" ({self.description})" if self.description else ""
        run.progress.line(f"exported SavedModel to {path}{detail}")


class WriteRunFile(Action):
    """Writes one file of the run into MODEL_DIR as training starts (the chief only), at once
    (`loops.core.reporting.write_text_atomic`), e.g. the raw ids of a recommender's rows.

    Nothing is written without a model_dir.
    """

    def __init__(self, name: str, text: Callable[[], str]):
        """
        Args:
            name: the file's name in MODEL_DIR.
            text: () -> its text, called as training starts.
        """
        self.file_name = name
        self.text = text

    def before_train(self, run: RunContext) -> None:
        if run.is_chief and run.model_dir is not None:
            reporting.write_text_atomic(os.path.join(run.model_dir, self.file_name), self.text())


# A watched metric's best value before the first evaluation: the largest float64.
_NO_VALUE = sys.float_info.max


def _state_variable(initial, name: str) -> tf.Variable:
    # Float64 keeps a metric's value exactly as the host computed it. Assigned on
    # the host in cross-replica context; ONLY_FIRST_REPLICA keeps one value.
    dtype = tf.float64 if isinstance(initial, float) else tf.int64
    return tf.Variable(
        initial,
        dtype=dtype,
        trainable=False,
        name=name,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


def action_state(actions: Sequence[Action]) -> dict[str, dict]:
    """Checkpoint name -> variables of every action that has state.

    Raises:
        ValueError: two actions with state have one name.
    """
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


def action_records(actions: Sequence[Action]) -> list[Any]:
    """The values of the checkpointed state of the actions whose `record_saved_at_end` (a
    KeepBest's best and its step), to tell whether the final evaluation changed them."""
    return [
        np.asarray(variable).tolist()
        for variables in action_state([a for a in actions if a.record_saved_at_end]).values()
        for _, variable in sorted(variables.items())
    ]
