"""The bad-step policy: acts on the first bad step any of a run's rules (`bad_step_rules`) finds
in an executor call, stopping the run or recovering from a checkpoint, with one max_recoveries
over all rules."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from loops.definition import recovery
from loops.definition.bad_step_rules import RECOVER, BadStep, BadStepRule, NonFiniteSteps
from loops.definition.recovery import Recoveries, Recovery
from loops.model_dir.checkpoints import describe_names
from loops.placement import Placement
from loops.run.checkpoint_keeper import CheckpointKeeper
from loops.run.train_input import TrainInput
from loops.vocabulary.errors import NonFiniteError


class BadStepPolicy:
    """Acts on the first bad step any rule finds in a call: stops the run or recovers.

    Args:
        rules: the run's rules; of two bad steps at the same step, the earlier
            rule's is acted on. The non-finite rule is always among them.
        current_step: the run's global step, read after a going back.
        batches_per_step: the global batches a step reads, which a recovery moves past.
        checkpoints: the run's checkpoints, the last of which a stop or a
            recovery goes back to.
        train_input: the train stream, which resumes where the run goes back to.
        recoveries: the run's record of recoveries, which "recover" adds to.
        max_recoveries: the recoveries a run may make, over all rules.
    """

    def __init__(
        self,
        rules: Sequence[BadStepRule],
        *,
        current_step: Callable[[], int],
        batches_per_step: int,
        checkpoints: CheckpointKeeper,
        train_input: TrainInput,
        recoveries: Recoveries,
        max_recoveries: int,
    ):
        self.rules = list(rules)
        self.nonfinite = next(rule for rule in self.rules if isinstance(rule, NonFiniteSteps))
        self._current_step = current_step
        self._batches_per_step = batches_per_step
        self._checkpoints = checkpoints
        self._train_input = train_input
        self._recoveries = recoveries
        self.max_recoveries = max_recoveries
        # The step that left non-finite weights in memory with no checkpoint to go back to.
        self._weights_lost_at: int | None = None

    @property
    def saved_state(self) -> dict[str, object]:
        """What checkpoints hold of the policy, by name (optional on restore)."""
        state: dict[str, object] = {recovery.CHECKPOINT_NAME: self._recoveries}
        for rule in self.rules:
            state.update(rule.saved_state)
        return state

    @property
    def recoveries_made(self) -> int:
        """The recoveries the run has made (those of its record), over all rules."""
        return len(self._recoveries.entries)

    @property
    def recovers(self) -> bool:
        """Whether a bad step may lead to a recovery (a call's steps then must not depend on
        timing: `LoopSchedule.joins`)."""
        return any(rule.reaction == RECOVER for rule in self.rules)

    def check_can_train(self) -> None:
        """Raises NonFiniteError when a stop left weights that are not finite in memory."""
        if self._weights_lost_at is not None:
            # Kernels need not show them again: oneDNN's fused ReLU turns a
            # NaN into 0, and the next steps' loss and gradients are finite.
            raise NonFiniteError(
                f"At step {self._weights_lost_at} the weights were not finite and "
                "there was no checkpoint to go back to, so this Trainer cannot train on. Make "
                "a new one (with a new definition), with a model_dir and checkpoint_every so "
                "that a stop goes back to the last checkpoint."
            )

    def first_bad(
        self, logs: Mapping[str, np.ndarray], kinds: Mapping[str, type], first_step: int
    ) -> tuple[BadStepRule, BadStep] | None:
        """The earliest step of a call that a rule acts on, with the rule; None when none."""
        found = None
        for rule in self.rules:
            bad = rule.scan(logs, kinds, first_step)
            if bad is not None and (found is None or bad.step < found[1].step):
                found = (rule, bad)
        return found

    def commit(self) -> None:
        """Every rule keeps what it learnt from the call: its steps stand."""
        for rule in self.rules:
            rule.commit()

    def act(self, rule: BadStepRule, bad: BadStep) -> Recovery:
        """Recovers from `bad` under "recover"; otherwise goes back (where the update reached
        the weights) and raises `rule.error`.

        Raises:
            `rule.error`: under "stop", or under "recover" when it cannot recover.
        """
        if rule.reaction == RECOVER:
            return self.recover(rule, bad)
        if rule.update_applied:
            state = self._back_to_checkpoint(rule.weights_finite, bad.before_step)
        else:
            state = "Its update was skipped and nothing was saved after it."
        raise rule.error(f"Step {bad.step}: {bad.problem}. {state} {rule.advice}")

    def after_nonfinite_weights(self, step: int, nonfinite_names: list[str]) -> Recovery:
        """Goes back to the last checkpoint (every one is finite); recovers or raises.

        The loss and gradient checks cannot see an update that is itself not
        finite (an infinite learning rate, an overflowing optimizer state), and
        no policy can skip it after the fact: "recover" recovers as from a
        non-finite `step` (the inner loop's last), every other policy stops.

        Raises:
            NonFiniteError: unless on_nonfinite is "recover" and it may recover.
        """
        bad = self.nonfinite.after_weights(step, nonfinite_names)
        if self.nonfinite.reaction == RECOVER:
            return self.recover(self.nonfinite, bad)
        state = self._back_to_checkpoint(weights_finite=False)
        raise NonFiniteError(
            f"After step {step}, {describe_names(nonfinite_names)} not finite (NaN or inf), "
            "although the steps' loss and gradient checks passed: an update itself was not "
            f"finite. {state} Check the learning rate and the optimizer's settings (a "
            "learning rate that is inf or huge does this), or clip gradients."
        )

    def recover(self, rule: BadStepRule, bad: BadStep) -> Recovery:
        """Goes back to the last checkpoint (saved before `bad.before_step`, where given) and
        moves the train stream past the batches up to `bad.step`.

        Raises:
            `rule.error`: the run has made max_recoveries recoveries already, or
                there is no checkpoint to go back to.
        """
        entries = list(self._recoveries.entries)
        limit = self.max_recoveries
        if len(entries) >= limit:
            steps = ", ".join(str(entry["step"]) for entry in entries)
            plural = "s" if len(entries) > 1 else ""
            raise rule.error(
                f"Step {bad.step}: {bad.problem}, and the run has recovered {len(entries)} "
                f"time{plural} already (max_recoveries={limit}; at step{plural} {steps}), so "
                f"it stops. {self._back_to_checkpoint(False, bad.before_step)} "
                "Lower the learning rate, clip gradients, check the input, or raise "
                "max_recoveries (--max_recoveries) to let it recover again."
            )
        if not self._go_back(bad.before_step):
            state = self._without_checkpoint(rule.weights_finite)
            raise rule.error(f"Step {bad.step}: {bad.problem}. {state}")
        restored = self._current_step()
        entry = Recovery(
            step=bad.step,
            restored_step=restored,
            skipped_batches=(bad.step - restored) * self._batches_per_step,
            cause=rule.cause,
        )
        self._recoveries.entries = [*entries, entry]
        return entry

    def _go_back(self, before_step: int | None) -> bool:
        """Restores the last checkpoint (saved before `before_step`, where given), the train
        stream resuming there; False without one."""
        if self._checkpoints.checkpointer is None:
            return False
        # What a checkpoint without the record (or a rule's state) stands for.
        self._recoveries.entries = []
        for rule in self.rules:
            rule.reset()
        if self._checkpoints.restore(before_step) is None:
            return False
        self._train_input.position = -1
        return True

    def _back_to_checkpoint(self, weights_finite: bool, before_step: int | None = None) -> str:
        """Goes back to the last checkpoint after a bad step; says where the loop is now.

        Without a checkpoint, weights that may not be finite (`weights_finite`
        False) make the Trainer refuse to train on.
        """
        if self._go_back(before_step):
            return (
                f"Nothing was saved after it; the loop is back at its last checkpoint "
                f"(step {self._current_step()}), where a rerun also resumes."
            )
        return self._without_checkpoint(weights_finite)

    def _without_checkpoint(self, weights_finite: bool) -> str:
        """Where the loop is with no checkpoint to go back to; weights that may not be finite
        make the Trainer refuse to train on."""
        if weights_finite:
            return (
                "There is no checkpoint to go back to: the weights in memory are those "
                f"after step {self._current_step()}."
            )
        self._weights_lost_at = self._current_step()
        return _NO_CHECKPOINT


def _recover_words(rule: type[BadStepRule]) -> tuple[str, str, str]:
    """What asks `rule` to recover, the bad step it acts on, and what to ask for instead."""
    setting = rule.setting
    if setting:
        others = f"{setting}='stop' or '{rule.other}' (--{setting}=stop or {rule.other})"
        return f"{setting}='recover'", rule.described, others
    name = rule.__name__
    others = f"the reaction 'stop' to the {name} of the definition's bad_step_rules()"
    return f"{name}'s reaction 'recover'", f"a step {rule.reported_as}", others


_NO_CHECKPOINT = (
    "There is no checkpoint to go back to: the weights in memory are not finite, "
    "and nothing was saved."
)


def check_can_recover(
    name: str,
    placement: Placement,
    rule: type[BadStepRule],
    *,
    has_train_data: bool,
    model_dir: str | None,
) -> None:
    """Raises ValueError when `rule`'s "recover" cannot work for the definition `name`.

    Args:
        placement: where the run's steps run.
        rule: the rule that asks to recover: a built-in one by its setting
            (`NonFiniteSteps`, `LossSpikes`), or one of the definition's own
            (`Loop.bad_step_rules`) by its reaction.
        has_train_data: whether the run has train data, or makes its own
            (RL), drawing new data after a recovery (`Loop.data_step`).
    """
    policy, bad, others = _recover_words(rule)
    if placement.steps_out_of_order:
        raise ValueError(
            f"{policy} moves the train stream past the batches that led "
            f"to {bad}, and under parameter_server_mode='async' the workers' steps run "
            "out of order, at no position a checkpoint records. Pass "
            "--parameter_server_mode=exact, or " + (rule.parameter_server_advice or f"{others}.")
        )
    if not has_train_data:
        raise ValueError(
            f"{policy} goes back to the last checkpoint and moves the train "
            f"stream past the batches that led to {bad}, and {name} has no "
            f"train_data. Pass {others}."
        )
    if model_dir is None:
        raise ValueError(
            f"{policy} goes back to the last checkpoint, and {name} has "
            "model_dir=None, so it keeps none. Pass model_dir= (a checkpoint of step 0 is "
            f"saved when training starts), or {others}."
        )
