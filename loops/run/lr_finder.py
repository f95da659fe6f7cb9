"""The learning-rate range test: a Trainer's steps at a rate growing geometrically until the
loss blows up, the (rate, loss) curve written as JSON and PNG, and the rate it suggests."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from loops import keras_private, topology
from loops.core import outputs, own_files, plots, reporting
from loops.input import distributed_input
from loops.model_dir import checkpoints
from loops.run.execution import loop_execution
from loops.run.faults import failed_frames
from loops.run.trainer import Trainer
from loops.vocabulary import settings

JSON_FILE = "lr_find.json"
PNG_FILE = "lr_find.png"
# The loss is smoothed with an exponential moving average of this decay (debiased over
# the first steps): about the last 10 steps, under a decade of rates at the default
# 100 steps over 8 decades, so the lowest smoothed loss lags the raw curve little.
SMOOTHING = 0.9
# The suggestion's divisor of the rate at the lowest smoothed loss (BUILD.md says why).
SUGGESTION_DIVISOR = 10.0
RULE = "the rate at the lowest smoothed loss, divided by 10"


@dataclasses.dataclass(frozen=True)
class LearningRateCurve:
    """What a range test measured and suggests.

    Attributes:
        rates: the rate of each step run, increasing by one factor a step.
        losses: the recorded loss of each step (the loss of its batch, computed before
            its update at its rate); NaN or inf where it was not finite.
        smoothed_losses: their exponential moving average (`SMOOTHING`), debiased.
        suggested_rate: the rate `rule` picks.
        rule: how the suggestion is picked, in words.
        stop_reason: why the test ended.
        loss_name: the train-step output recorded (or the sum of several, joined by +).
        start_step: the global step the test started from (0, or a checkpoint's).
    """

    rates: tuple[float, ...]
    losses: tuple[float, ...]
    smoothed_losses: tuple[float, ...]
    suggested_rate: float
    rule: str
    stop_reason: str
    loss_name: str
    start_step: int

    def as_json(self) -> dict[str, Any]:
        """The curve as lr_find.json holds it (a loss that is not finite as null)."""

        def numbers(values: Sequence[float]) -> list[float | None]:
            return [value if math.isfinite(value) else None for value in values]

        fields = dataclasses.asdict(self)
        fields.update(losses=numbers(self.losses), smoothed_losses=numbers(self.smoothed_losses))
        fields["rates"] = list(self.rates)
        return fields


def find_learning_rate(
    trainer: Trainer,
    *,
    min_rate: float = settings.DEFAULT_FIND_LR_MIN_RATE,
    max_rate: float = settings.DEFAULT_FIND_LR_MAX_RATE,
    steps: int = settings.DEFAULT_FIND_LR_STEPS,
    stop_factor: float = settings.DEFAULT_FIND_LR_STOP_FACTOR,
    loss: str | None = None,
    output_dir: str | None = None,
    from_checkpoint: str | None = None,
) -> LearningRateCurve:
    """Runs the learning-rate range test on a Trainer's definition, and suggests a rate.

    Step i of `steps` trains at min_rate * (max_rate / min_rate) ** (i / (steps - 1)),
    the trainer's own train steps on its train stream (from its start) and strategy,
    and records the step's `loss` output. The test stops early when the loss blows up:
    its smoothed value (`SMOOTHING`) above `stop_factor` times the lowest so far (for a
    loss that may be negative: above the lowest by (stop_factor - 1) times its
    magnitude), or a loss or weight that is not finite. The suggestion is the rate at
    the lowest smoothed loss divided by 10 (`RULE`; BUILD.md says why).

    Every Keras optimizer of the definition (in `checkpoint_items()` or an attribute:
    the GAN's two) gets the same rate in place of its own rate or schedule: the
    binaries give all their optimizers one --learning_rate, whose value it suggests.

    Nothing of the run changes: the trainer has no model_dir, `from_checkpoint` is
    only read, and afterwards the trainer's state (weights, optimizers, global step)
    and rates are what they were, so it can then train. Example:

        trainer = loops.Trainer(definition, train_data=data)  # no model_dir
        curve = loops.find_learning_rate(trainer, output_dir="/tmp/lr_find")
        print(curve.suggested_rate, curve.rule)

    Args:
        trainer: a Trainer with model_dir=None, not under ParameterServerStrategy.
        min_rate, max_rate, steps, stop_factor, loss: the test's settings
            (loops/vocabulary/settings.py, the find_lr_* flags, declares them).
        output_dir: where lr_find.json and lr_find.png go; None writes nothing.
        from_checkpoint: start from this checkpoint (a prefix, or the newest in a
            directory: a run's model_dir or its checkpoints/), read only; None: from
            the trainer's state (the initial weights).

    Returns:
        The curve and the suggestion (also in the trainer's progress lines).

    Raises:
        ValueError: a bad argument (named with the fix), a trainer that cannot run the
            test, a checkpoint that does not read or match, or an unknown `loss`.
    """
    rates = _checked_rates(min_rate, max_rate, steps, stop_factor)
    _check_trainer(trainer)
    prefix = (
        None
        if from_checkpoint is None
        else checkpoints.checkpoint_prefix(
            from_checkpoint,
            setting="from_checkpoint",
            otherwise="None to start from the initial weights",
        )
    )
    if output_dir is not None:
        check_output_dir(output_dir, run_path=from_checkpoint)
    curve = _range_test_keeping_state(trainer, prefix, rates, stop_factor, loss)
    _report(trainer.run_context.progress.line, curve, prefix)
    if output_dir is not None:
        for path in write_curve(curve, output_dir):
            trainer.run_context.progress.line(f"lr_find: wrote {path}")
    return curve


def _range_test_keeping_state(
    trainer: Trainer, prefix: str | None, rates: np.ndarray, stop_factor: float, loss: str | None
) -> LearningRateCurve:
    """The range test from checkpoint `prefix` (None: the trainer's state); the trainer's
    state is kept aside in a temporary checkpoint and read back afterwards."""
    optimizers = _optimizers(trainer.definition)
    with tempfile.TemporaryDirectory(prefix="loops-lr-find-") as scratch:
        state = tf.train.Checkpoint(**trainer.saved_items())
        kept = state.write(os.path.join(scratch, "state"))
        try:
            if prefix is not None:
                _restore(prefix, trainer)
            start_step = trainer.state.step
            with failed_frames.dropped_on_failure():  # its frames hold the test's iterator
                record = _range_test(trainer, optimizers, rates, stop_factor, loss)
        finally:
            state.read(kept).assert_existing_objects_matched()
    return record.curve(start_step)


def _checked_rates(min_rate: float, max_rate: float, steps: int, stop_factor: float) -> np.ndarray:
    """The rates of the steps, once each argument passed its declaration's check."""
    for keyword, value in (
        ("min_rate", min_rate),
        ("max_rate", max_rate),
        ("steps", steps),
        ("stop_factor", stop_factor),
    ):
        check = settings.BY_NAME[f"find_lr_{keyword}"].check
        assert check is not None  # each is declared with one
        check(keyword, value)
    if not max_rate > min_rate:
        raise ValueError(
            f"max_rate={max_rate!r} must be above min_rate={min_rate!r}: the rate grows "
            f"from one to the other; e.g. min_rate=1e-7, max_rate=10."
        )
    return min_rate * (max_rate / min_rate) ** (np.arange(steps) / (steps - 1))


def _check_trainer(trainer: Trainer) -> None:
    """Raises ValueError for a trainer the range test cannot run on without a trace."""
    kind = type(trainer.definition).__name__
    if trainer.run_context.model_dir is not None:
        raise ValueError(
            f"The range test trains at rates up to where the loss blows up, and this "
            f"Trainer has model_dir={trainer.run_context.model_dir!r}, which it restored from and "
            "saves into. Build the Trainer with model_dir=None, and pass "
            "from_checkpoint=MODEL_DIR to start from that run's newest checkpoint."
        )
    if trainer.placement.variables_on_servers:
        raise ValueError(
            "The range test needs its steps in order, one rate after the other, and "
            "ParameterServerStrategy runs them asynchronously; run it under mirrored "
            "(or the default strategy) with the same global batch."
        )
    if trainer.train_data is None and trainer.definition.needs_train_data:
        raise ValueError(f"{kind} has no train_data; pass train_data= to the Trainer.")


def check_outside_run(output_dir: str, run_path: str) -> None:
    """Raises ValueError when `output_dir` lies in the run `run_path` belongs to (`run_path`:
    its model_dir, its checkpoints/ or one of its checkpoints), links resolved.

    A `run_path` that is none of those yet is a new run: nothing to protect.
    """
    run = os.path.realpath(run_path)
    if not os.path.isdir(run):
        if not tf.io.gfile.exists(run + ".index"):
            return
        run = os.path.dirname(run)
    if os.path.basename(run) == "checkpoints":
        run = os.path.dirname(run)
    if os.path.commonpath([run, os.path.realpath(output_dir)]) == run:
        raise ValueError(
            f"output_dir={output_dir!r} lies in {run}, the run's directory, which the "
            "range test leaves untouched; pass an output_dir outside it (--find_lr_dir)."
        )


def check_output_dir(output_dir: str, *, run_path: str | None = None) -> None:
    """Makes `output_dir` and checks that the range test's files can be written there,
    outside the run of `run_path` (`check_outside_run`; None: no run).

    Raises:
        ValueError: it lies in the run, is a file, cannot be made or written
            (read-only), or a link is planted at lr_find.json or lr_find.png.
    """
    if run_path is not None:
        check_outside_run(output_dir, run_path)
    try:
        os.makedirs(output_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
        for name in (JSON_FILE, PNG_FILE):
            own_files.refuse_link(os.path.join(output_dir, name))
    except own_files.PlantedLinkError as error:
        raise ValueError(str(error)) from None
    except OSError as error:
        problem = "is a file" if os.path.isfile(output_dir) else "cannot be made or written"
        raise ValueError(
            f"output_dir={output_dir!r} {problem} ({error.strerror or error}); the range "
            "test writes lr_find.json and lr_find.png there: pass a writable directory "
            "(--find_lr_dir)."
        ) from None


def _restore(prefix: str, trainer: Trainer) -> None:
    problem = checkpoints.restore_checkpoint(prefix, trainer.saved_items())
    if problem is not None:
        raise ValueError(
            f"The checkpoint {prefix} does not read ({problem}); pass another "
            "from_checkpoint (an older ckpt-N of the run), or None."
        )


def _optimizers(definition: Any) -> list[keras.optimizers.Optimizer]:
    """The definition's Keras optimizers, each once: in checkpoint_items() or attributes."""
    found: dict[int, keras.optimizers.Optimizer] = {}
    for value in (*definition.checkpoint_items().values(), *vars(definition).values()):
        if isinstance(value, keras.optimizers.Optimizer):
            found.setdefault(id(value), value)
    if not found:
        raise ValueError(
            f"{type(definition).__name__} holds no Keras optimizer in checkpoint_items() or "
            "its attributes, so the range test has no rate to set; keep the optimizers "
            "its loops.Updates apply as attributes (self.optimizer = ...)."
        )
    return list(found.values())


def _range_test(
    trainer: Trainer,
    optimizers: list[keras.optimizers.Optimizer],
    rates: np.ndarray,
    stop_factor: float,
    loss: str | None,
) -> _Record:
    """Runs a step at each rate until the loss blows up; the optimizers' rates are theirs
    again afterwards."""
    with topology.variable_scope(trainer.strategy):
        rate = keras.Variable(
            float(rates[0]), name="lr_find_rate", trainable=False, aggregation="only_first_replica"
        )
    # A new trace of the steps, which reads the finder's rate; the trainer's own
    # compiled steps keep theirs.
    with keras_private.learning_rates_read_from(optimizers, lambda: rate):
        executor = loop_execution.make_executor(
            trainer.executor.definition,
            coordinator=None,
            run_eagerly=trainer.step_options.run_eagerly,
            stop_on_nonfinite=True,
        )
        iterator = None
        if trainer.train_data is not None:
            iterator = distributed_input.train_iterator(trainer.strategy, trainer.train_data)
        record = _Record(stop_factor, loss)
        for value in rates:
            rate.assign(float(value))
            if record.add(float(value), executor.run(iterator, 1)) is not None:
                break
        return record


class _Record:
    """The rates and losses of the steps so far, their smoothing, and the stop rule."""

    def __init__(self, stop_factor: float, loss: str | None):
        self.stop_factor = stop_factor
        self.loss_name = loss
        self.rates: list[float] = []
        self.losses: list[float] = []
        self.smoothed: list[float] = []
        self._average = 0.0
        self.stop_reason: str | None = None

    def add(self, rate: float, run: Any) -> str | None:
        """Records a step run at `rate`; returns why to stop, or None to go on."""
        loss = self._loss(run)
        self.rates.append(rate)
        self.losses.append(loss)
        if not math.isfinite(loss) or not run.weights_finite:
            what = "loss was" if not math.isfinite(loss) else "weights were"
            self.smoothed.append(math.nan)
            self.stop_reason = f"the {what} not finite at rate {rate:.4g}"
            return self.stop_reason
        self._average = SMOOTHING * self._average + (1 - SMOOTHING) * loss
        smoothed = self._average / (1 - SMOOTHING ** (len(self.smoothed) + 1))
        self.smoothed.append(smoothed)
        lowest = min(self.smoothed)
        if smoothed - lowest > (self.stop_factor - 1) * abs(lowest):
            self.stop_reason = (
                f"the smoothed loss {smoothed:.4g} at rate {rate:.4g} is above "
                f"{self.stop_factor:g} x its lowest, {lowest:.4g}"
            )
        return self.stop_reason

    def _loss(self, run: Any) -> float:
        """The step's recorded loss (the first step settles which outputs that is)."""
        values = outputs.per_step_values(run.kinds, run.logs)
        if self.loss_name is None:
            names = (
                ["loss"] if "loss" in values else sorted(n for n in values if n.endswith("loss"))
            )
            if not names:
                raise ValueError(
                    f"The train step returns no output named loss or ending in loss (it "
                    f"returns {', '.join(sorted(values))}); pass loss=NAME (--find_lr_loss) "
                    "to say which to record."
                )
            self.loss_name = "+".join(names)
        names = self.loss_name.split("+")
        unknown = [name for name in names if name not in values]
        if unknown:
            raise ValueError(
                f"loss={self.loss_name!r}: the train step returns no {unknown[0]!r} (it returns "
                f"{', '.join(sorted(values))}); pass one of those (--find_lr_loss)."
            )
        return float(sum(float(values[name][0]) for name in names))

    def curve(self, start_step: int) -> LearningRateCurve:
        """The curve recorded, with the suggestion `RULE` picks."""
        smoothed = np.array(self.smoothed)
        lowest = int(np.nanargmin(smoothed)) if np.isfinite(smoothed).any() else 0
        return LearningRateCurve(
            rates=tuple(self.rates),
            losses=tuple(self.losses),
            smoothed_losses=tuple(self.smoothed),
            suggested_rate=self.rates[lowest] / SUGGESTION_DIVISOR,
            rule=RULE,
            stop_reason=self.stop_reason or f"reached the last rate, {self.rates[-1]:.4g}",
            loss_name=self.loss_name or "loss",
            start_step=start_step,
        )


def _report(say: Callable[[str], None], curve: LearningRateCurve, prefix: str | None) -> None:
    """The progress lines of a range test: what ran, why it stopped, the suggestion."""
    start = f"from {prefix} (step {curve.start_step})" if prefix else "from the initial weights"
    say(
        f"lr_find: {len(curve.rates)} steps {start}, rates {curve.rates[0]:.3g} to "
        f"{curve.rates[-1]:.3g}, recording {curve.loss_name}; stopped: {curve.stop_reason}"
    )
    say(f"lr_find: suggested learning rate {curve.suggested_rate:.3g} ({curve.rule})")
    finite = [value for value in curve.smoothed_losses if math.isfinite(value)]
    if finite and curve.smoothed_losses.index(min(finite)) == 0:
        say(
            "lr_find: the loss never fell below its first value: the suggestion is below "
            "the rates tried; lower the first rate (--find_lr_min_rate) and run it again"
        )


def write_curve(curve: LearningRateCurve, output_dir: str) -> list[str]:
    """Writes lr_find.json and lr_find.png (loss against the rate on a log axis) into output_dir.

    The picture (`plots.learning_rate_figure`) shows the raw losses light and
    the smoothed ones dark, labelled axes and the suggestion marked and
    written. Returns the two paths.
    """
    os.makedirs(output_dir, exist_ok=True)
    json_path = os.path.join(output_dir, JSON_FILE)
    reporting.write_json_atomic(json_path, curve.as_json())
    picture = plots.png_bytes(
        plots.learning_rate_figure(
            curve.rates,
            curve.losses,
            curve.smoothed_losses,
            curve.suggested_rate,
            curve.loss_name,
        )
    )
    png_path = os.path.join(output_dir, PNG_FILE)
    own_files.write_atomic(png_path, picture)
    return [json_path, png_path]
