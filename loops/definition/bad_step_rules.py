"""Bad-step rules: each a small object that finds the first bad step of an executor call in its
per-step logs (non-finite steps here, loss spikes in `loss_spikes`, any rule a definition adds),
and says what a stop raises and a recovery records (`loops.run.faults.bad_steps` acts on them).

A rule is a `BadStepRule`: how it finds the first bad step in a call's
per-step logs, what it says the step did wrong, the exception a stop raises
and what a recovery records as its cause. A definition adds its own with
`Loop.bad_step_rules`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

import numpy as np
import tensorflow as tf

from loops.core import outputs
from loops.definition import recovery
from loops.model_dir.checkpoints import describe_names
from loops.vocabulary.errors import NonFiniteError

# A rule's reactions; "skip" leaves the step's update out in the graph and "ignore" builds no
# rule, so neither reaches the host as a step to act on.
STOP, RECOVER = "stop", "recover"


class BadStep(NamedTuple):
    """The step a rule acts on, what was wrong with it and where a going back must end."""

    step: int
    problem: str  # a clause: "the loss or the gradients were not finite on ..."
    # Go back to a checkpoint saved before this step (a spike's first high step: one saved
    # during it holds updates of its batches); None: the last checkpoint.
    before_step: int | None = None


class RuleSite(NamedTuple):
    """What a built-in rule is made with besides the step options: where the run's graph
    leaves a flagged update out, the definition's watched output, its class name."""

    leaves_out_updates: bool
    watched_loss: str | None
    kind: str


class BadStepRule:
    """One way a step is bad, and what a run does after one: subclass it and register it.

    A definition registers its own rules with `Loop.bad_step_rules`.

    Attributes:
        reaction: "stop" or "recover".
        cause: what a recovery from it is recorded as in results.json.
        reported_as: what a bad step was, in the progress line of a recovery
            ("step 6 was <reported_as>: recovery 1 of at most 3, ...").
        error: what a stop (or a recovery past max_recoveries) raises.
        advice: the stop message's last sentences: what to change.
        update_applied: whether the bad step's update reached the weights (a
            stop then goes back to the last checkpoint); False where the graph
            left it out.
        weights_finite: whether the weights stay finite after a bad step (a
            stop without a checkpoint then leaves the Trainer able to train on).
        setting, described, other, parameter_server_advice: a built-in rule's
            setting ("on_nonfinite"), its bad step ("a non-finite step"), the
            setting's other choice than "stop" ("skip"), and what to pass
            instead of "recover" under ParameterServerStrategy (None: those),
            for the refusals of "recover" (`bad_steps.check_can_recover`).
    """

    cause: ClassVar[str]
    reported_as: ClassVar[str]
    error: ClassVar[type[Exception]] = RuntimeError
    advice: ClassVar[str] = (
        "Lower the learning rate, clip gradients or check the input at those steps."
    )
    update_applied: bool = True
    weights_finite: bool = True
    setting: ClassVar[str] = ""
    described: ClassVar[str] = "a bad step"
    other: ClassVar[str] = ""
    parameter_server_advice: ClassVar[str | None] = None

    def __init__(self, reaction: str) -> None:
        if reaction not in (STOP, RECOVER):
            raise ValueError(
                f"{type(self).__name__}'s reaction must be {STOP!r} or {RECOVER!r}, got "
                f"{reaction!r}; a rule to ignore is one not registered."
            )
        self.reaction = reaction

    @classmethod
    def from_options(cls, options: Any, site: RuleSite) -> BadStepRule | None:
        """A built-in rule (`loops.run.faults.builtin_rules`) as the run's step options set
        its `setting` and parameters; None where they turn it off."""
        raise NotImplementedError(f"{cls.__name__} is no built-in rule: a definition makes it.")

    @classmethod
    def check_definition(cls, definition_class: type, reaction: str) -> None:
        """Refuses, with the fix, a definition whose steps the built-in rule at `reaction`
        (its setting's value) cannot watch; by default every one."""

    def scan(
        self, logs: Mapping[str, np.ndarray], kinds: Mapping[str, type], first_step: int
    ) -> BadStep | None:
        """The first bad step among steps first_step + 1, ... of a call; None when none.

        Args:
            logs: the call's output columns, a row a step.
            kinds: output name -> its kind (`loops.Mean`, ..., `loops.Flag`).
            first_step: the step the call started after.
        """
        raise NotImplementedError

    def commit(self) -> None:
        """Keeps what the last scan learnt: its steps stand (no stop or recovery followed)."""

    def reset(self) -> None:
        """Forgets what it learnt: the run goes back to a checkpoint (restored after it)."""

    @property
    def saved_state(self) -> dict[str, tf.Module]:
        """What checkpoints hold of it, by name (optional on restore)."""
        return {}


class NonFiniteSteps(BadStepRule):
    """Steps whose loss or gradients were not finite: any `loops.Flag` output set.

    Under "skip" the graph leaves their updates out and the host only counts
    them; the run acts on none.

    Args:
        reaction: the run's on_nonfinite: "stop", "skip" or "recover".
        leaves_out_updates: whether the graph leaves a flagged step's update out.
    """

    cause = recovery.NONFINITE
    reported_as = "not finite"
    error = NonFiniteError
    advice = (
        "Lower the learning rate, clip gradients, check the input, or pass "
        "on_nonfinite='skip' (--on_nonfinite=skip) to leave out such steps, or 'recover' to "
        "go on from the last checkpoint past the batches that led to them."
    )
    weights_finite = False
    setting, described, other = "on_nonfinite", "a non-finite step", "skip"
    parameter_server_advice = (
        "on_nonfinite='skip' (--on_nonfinite=skip; asynchronous workers leave out a "
        "non-finite update under every policy) or 'stop'."
    )

    @classmethod
    def from_options(cls, options: Any, site: RuleSite) -> NonFiniteSteps:
        return cls(options.on_nonfinite, leaves_out_updates=site.leaves_out_updates)

    def __init__(self, reaction: str, *, leaves_out_updates: bool) -> None:
        self.skips = reaction == "skip"
        super().__init__(STOP if self.skips else reaction)
        self.update_applied = not leaves_out_updates
        self.skipped_steps = 0  # the flagged steps whose update was left out

    def scan(
        self, logs: Mapping[str, np.ndarray], kinds: Mapping[str, type], first_step: int
    ) -> BadStep | None:
        flagged = np.zeros(len(next(iter(logs.values()), [])), bool)
        for name in outputs.flag_names(kinds):
            flagged |= logs[name] > 0
        if not self.update_applied:
            self.skipped_steps += int(np.sum(flagged))
        if self.skips or not np.any(flagged):
            return None
        return BadStep(
            first_step + int(np.argmax(flagged)) + 1,
            "the loss or the gradients were not finite on at least one replica",
        )

    def after_weights(self, step: int, nonfinite_names: list[str]) -> BadStep:
        """The bad step that weights not finite after `step` (a call's last) stand for."""
        return BadStep(
            step,
            f"{describe_names(nonfinite_names)} not finite (NaN or inf) after it, "
            "although the steps' loss and gradient checks passed",
        )
