"""Loss spikes: steps whose loss stays a factor above its slow moving average, found on the
host from each call's per-step losses; a bad-step rule (`loops.run.faults.bad_steps`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from loops.definition import recovery
from loops.definition.bad_step_rules import BadStep, BadStepRule, RuleSite
from loops.vocabulary.errors import LossSpikeError

# The watch's name in a checkpoint, beside the definition's items (reserved: see the Trainer).
CHECKPOINT_NAME = "loss_spike_watch"


class LossSpikeRule(NamedTuple):
    """A loss above `factor` times its moving average over `window` steps, `steps` in a row."""

    factor: float
    steps: int
    window: int


class LossSpike(NamedTuple):
    """The step where a spike was found (its high steps' last), with what made it one."""

    step: int
    loss: float
    average: float
    first_high_step: int

    def describe(self, output: str) -> str:
        """What made it a spike, as a clause: '<output> was high from step a to b (...)'."""
        return (
            f"{output} was high from step {self.first_high_step} to {self.step} "
            f"({self.loss:.4g} at the last, {self.loss / self.average:.3g} times its moving "
            f"average {self.average:.4g})"
        )


class LossSpikeWatch(tf.Module):
    """The loss's slow moving average and the current run of high steps, saved with the run.

    The average is exponential with decay 1 - 1/window, debiased by the sum
    of its weights (so the first steps count fully, as Adam's moments do).
    A high step does not enter it: a spike that lasts does not lift the bar
    it is measured against. A loss that is not finite is the non-finite
    policy's and is passed over; a loss at or below zero is never high (the
    rule is a ratio, for losses bounded below by 0).

    The state lives in one variable (weighted sum, sum of weights, high
    steps in a row), so that a checkpoint holds the watch as it was at its
    step and a recovery or resume continues it exactly; a Python copy saves
    reading it back after every call.
    """

    def __init__(self, rule: LossSpikeRule) -> None:
        super().__init__(name=CHECKPOINT_NAME)
        self.rule = rule
        with tf.init_scope():
            self.state = tf.Variable(tf.zeros([3], tf.float64), trainable=False, name="state")
        self._known: tuple[float, float, int] | None = None  # the variable's value, when read

    def reset(self) -> None:
        """Forgets the loss seen (what a checkpoint without the watch stands for).

        Also what a restore must be preceded by: the value is read again after it.
        """
        self.state.assign(tf.zeros([3], tf.float64))
        self._known = None

    @property
    def average(self) -> float | None:
        """The moving average of the loss; None before any step."""
        total, weight, _ = self._current()
        return total / weight if weight > 0 else None

    def _current(self) -> tuple[float, float, int]:
        if self._known is None:
            total, weight, high = self.state.numpy().tolist()
            self._known = (total, weight, int(high))
        return self._known

    def scan(self, losses: np.ndarray, first_step: int) -> tuple[LossSpike | None, tuple]:
        """The first spike among the losses of steps first_step + 1, ..., and the state after
        them (or at the spike); `commit` keeps that state."""
        decay = 1.0 - 1.0 / self.rule.window
        total, weight, high = self._current()
        for index, value in enumerate(np.asarray(losses, dtype=np.float64).tolist()):
            if not math.isfinite(value):
                continue
            average = total / weight if weight > 0 else 0.0
            if average > 0 and value > self.rule.factor * average:
                high += 1
                if high >= self.rule.steps:
                    step = first_step + index + 1
                    spike = LossSpike(step, value, average, step - high + 1)
                    return spike, (total, weight, high)
                continue
            high = 0
            total = decay * total + (1.0 - decay) * value
            weight = decay * weight + (1.0 - decay)
        return None, (total, weight, high)

    def commit(self, state: tuple) -> None:
        self.state.assign(np.array(state, np.float64))
        self._known = state


class LossSpikes(BadStepRule):
    """The loss-spike rule: a step where `watch` finds a spike in the `output` column is bad.

    Args:
        reaction: the run's on_loss_spike, "stop" or "recover".
        watch: the moving average and run of high steps, checkpointed with the run.
        output: the watched output (the definition's `watched_loss`).
        definition_name: the definition's class name, for errors.
    """

    cause = recovery.LOSS_SPIKE
    reported_as = "a loss spike"
    setting, described, other = "on_loss_spike", "a loss spike", "ignore"
    error = LossSpikeError
    advice = (
        "Lower the learning rate, clip gradients, check the input at those steps, or pass "
        "on_loss_spike='recover' (--on_loss_spike=recover) to go on from the last checkpoint "
        "past the batches that led to it."
    )

    @classmethod
    def from_options(cls, options: Any, site: RuleSite) -> LossSpikes | None:
        if options.on_loss_spike == "ignore":
            return None
        rule = LossSpikeRule(
            options.loss_spike_factor, options.loss_spike_steps, options.loss_spike_window
        )
        return cls(options.on_loss_spike, LossSpikeWatch(rule), site.watched_loss, site.kind)

    @classmethod
    def check_definition(cls, definition_class: type, reaction: str) -> None:
        if reaction != "ignore" and getattr(definition_class, "watched_loss", "loss") is None:
            raise ValueError(
                f"on_loss_spike={reaction!r} watches a loss for spikes, and "
                f"{definition_class.__name__} names none (its watched_loss is None: its "
                "losses grow as it learns, which is no sign of divergence). Pass "
                "on_loss_spike='ignore', or set watched_loss in a subclass to an output "
                "bounded below by 0."
            )

    def __init__(
        self, reaction: str, watch: LossSpikeWatch, output: str | None, definition_name: str
    ) -> None:
        super().__init__(reaction)
        self.watch = watch
        self._output = output
        self._definition_name = definition_name
        self._scanned: tuple = ()  # the watch's state after the last scan's steps

    def scan(
        self, logs: Mapping[str, np.ndarray], kinds: Mapping[str, type], first_step: int
    ) -> BadStep | None:
        """The first spike's last high step, gone back to before its first.

        Raises:
            ValueError: the definition's steps have no such output.
        """
        losses = logs.get(self._output or "")
        if losses is None:
            raise ValueError(
                f"on_loss_spike watches the train step's {self._output!r} output, and "
                f"{self._definition_name}'s steps give {sorted(logs)}. Set the definition's "
                "watched_loss to the output to watch, or pass on_loss_spike='ignore'."
            )
        spike, self._scanned = self.watch.scan(losses, first_step)
        if spike is None:
            return None
        return BadStep(spike.step, spike.describe(str(self._output)), spike.first_high_step)

    def commit(self) -> None:
        self.watch.commit(self._scanned)

    def reset(self) -> None:
        self.watch.reset()

    @property
    def saved_state(self) -> dict[str, tf.Module]:
        return {CHECKPOINT_NAME: self.watch}
