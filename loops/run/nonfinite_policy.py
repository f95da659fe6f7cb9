"""The non-finite policy on the host: what follows a call whose steps or weights were not finite
(and the going back to a checkpoint that a loss spike's policy shares)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from loops import topology
from loops.core import outputs
from loops.model_dir.checkpoints import describe_names
from loops.run import recovery
from loops.run.loss_spikes import LossSpikeWatch
from loops.run.recovery import Recoveries, Recovery
from loops.run.run_checkpoints import RunCheckpoints
from loops.run.run_context import Run
from loops.run.train_input import TrainInput
from loops.vocabulary.errors import NonFiniteError


class NonFinitePolicy:
    """Carries out a loop's `on_nonfinite` after each inner loop, and counts the skipped steps.

    Args:
        trainer: the trainer whose `on_nonfinite`, `skips_nonfinite` and
            `max_recoveries` say what follows.
        checkpoints: the run's checkpoints, the last of which a stop or a
            recovery goes back to.
        train_input: the train stream, which resumes where the trainer goes back to.
        recoveries: the run's record of recoveries, which "recover" adds to.
        spike_watch: the loss-spike watch a checkpoint restores with the run
            (None when the run has none), forgotten before going back.
    """

    def __init__(
        self,
        trainer: Run,
        *,
        checkpoints: RunCheckpoints,
        train_input: TrainInput,
        recoveries: Recoveries,
        spike_watch: LossSpikeWatch | None = None,
    ):
        self._trainer = trainer
        self._checkpoints = checkpoints
        self._train_input = train_input
        self._recoveries = recoveries
        self._spike_watch = spike_watch
        self.skipped_steps = 0
        # The step that left non-finite weights in memory with no checkpoint to go back to.
        self._weights_lost_at: int | None = None

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

    def first_acted_on(self, logs: Mapping[str, np.ndarray], first_step: int) -> int | None:
        """The first step in `logs` (of the steps after `first_step`) that was not finite,
        where the policy stops or recovers; None when there is none or it skips them."""
        flags = logs.get(outputs.NONFINITE)
        if (
            self._trainer.step_options.on_nonfinite == "skip"
            or flags is None
            or not np.any(flags > 0)
        ):
            return None
        return first_step + int(np.argmax(flags > 0)) + 1

    def check_steps(self, logs: Mapping[str, np.ndarray], first_step: int) -> Recovery | None:
        """Counts skipped steps; after a non-finite step goes back to the last checkpoint and,
        under "stop", raises; under "recover", returns the recovery made.

        Raises:
            NonFiniteError: under "stop", or under "recover" past max_recoveries.
        """
        flags = logs.get(outputs.NONFINITE)
        if flags is None or not np.any(flags > 0):
            return None
        if self._trainer.skips_nonfinite:
            self.skipped_steps += int(np.sum(flags > 0))
        bad_step = self.first_acted_on(logs, first_step)
        if bad_step is None:
            return None
        problem = "the loss or the gradients were not finite on at least one replica"
        if self._trainer.step_options.on_nonfinite == "recover":
            return self.recover(bad_step, problem)
        if self._trainer.skips_nonfinite:
            state = "Its update was skipped and nothing was saved after it."
        else:
            state = self.back_to_checkpoint()
        raise NonFiniteError(
            f"Step {bad_step}: {problem}. {state} Lower the learning rate, clip gradients, "
            "check the input, or pass on_nonfinite='skip' (--on_nonfinite=skip) to leave "
            "out such steps, or 'recover' to go on from the last checkpoint past the "
            "batches that led to them."
        )

    def after_nonfinite_weights(self, step: int, nonfinite_names: list[str]) -> Recovery:
        """Goes back to the last checkpoint (every one is finite); recovers or raises.

        The loss and gradient checks cannot see an update that is itself not
        finite (an infinite learning rate, an overflowing optimizer state), and
        no policy can skip it after the fact: "recover" recovers as from a
        non-finite `step` (the inner loop's last), every other policy stops.

        Raises:
            NonFiniteError: unless the policy is "recover" and it may recover.
        """
        if self._trainer.step_options.on_nonfinite == "recover":
            return self.recover(
                step,
                f"{describe_names(nonfinite_names)} not finite (NaN or inf) after it, "
                "although the steps' loss and gradient checks passed",
            )
        state = self.back_to_checkpoint()
        raise NonFiniteError(
            f"After step {step}, {describe_names(nonfinite_names)} not finite (NaN or inf), "
            "although the steps' loss and gradient checks passed: an update itself was not "
            f"finite. {state} Check the learning rate and the optimizer's settings (a "
            "learning rate that is inf or huge does this), or clip gradients."
        )

    def recover(
        self,
        bad_step: int,
        problem: str,
        *,
        cause: str = recovery.NONFINITE,
        error: type[Exception] = NonFiniteError,
        first_bad_step: int | None = None,
    ) -> Recovery:
        """Goes back to the last checkpoint and moves the train stream past `bad_step`'s batches.

        Args:
            problem: what was wrong at `bad_step`, as a clause for the messages.
            cause: what the recovery is recorded as (`recovery.NONFINITE`, `LOSS_SPIKE`).
            error: what is raised when it cannot recover.
            first_bad_step: the first step of several bad ones (a spike's first high step):
                the checkpoint gone back to is one saved before it; None: `bad_step`.

        Raises:
            `error`: the run has made max_recoveries recoveries already, or
                there is no checkpoint to go back to.
        """
        entries = list(self._recoveries.entries)
        limit = self._trainer.step_options.max_recoveries
        if len(entries) >= limit:
            steps = ", ".join(str(entry["step"]) for entry in entries)
            raise error(
                f"Step {bad_step}: {problem}, and the run has recovered {len(entries)} "
                f"time{'s' if len(entries) > 1 else ''} already (max_recoveries={limit}; "
                f"at step{'s' if len(entries) > 1 else ''} {steps}), so it stops. "
                f"{self.back_to_checkpoint(before_step=first_bad_step)} Lower the learning "
                "rate, clip gradients, check the input, or raise max_recoveries "
                "(--max_recoveries) to let it recover again."
            )
        if not self._go_back(first_bad_step):
            self._weights_lost_at = self._trainer.step
            raise error(f"Step {bad_step}: {problem}. {_NO_CHECKPOINT}")
        restored = self._trainer.step
        entry = Recovery(
            step=bad_step,
            restored_step=restored,
            skipped_batches=(bad_step - restored) * self._trainer.definition.batches_per_step,
            cause=cause,
        )
        self._recoveries.entries = [*entries, entry]
        return entry

    def _go_back(self, before_step: int | None = None) -> bool:
        """Restores the last checkpoint (saved before `before_step`, where given), the train
        stream resuming there; False without one."""
        if self._checkpoints.checkpointer is None:
            return False
        # What a checkpoint without the record (or the watch) stands for.
        self._recoveries.entries = []
        if self._spike_watch is not None:
            self._spike_watch.reset()
        if self._checkpoints.restore(before_step) is None:
            return False
        self._train_input.position = -1
        return True

    def back_to_checkpoint(
        self, *, weights_finite: bool = False, before_step: int | None = None
    ) -> str:
        """Goes back to the last checkpoint after a bad step; says where the loop is now.

        Without a checkpoint, weights that may not be finite (`weights_finite`
        False) make the Trainer refuse to train on.
        """
        if self._go_back(before_step):
            return (
                f"Nothing was saved after it; the loop is back at its last checkpoint "
                f"(step {self._trainer.step}), where a rerun also resumes."
            )
        if weights_finite:
            return (
                "There is no checkpoint to go back to: the weights in memory are those "
                f"after step {self._trainer.step}."
            )
        self._weights_lost_at = self._trainer.step
        return _NO_CHECKPOINT


_NO_CHECKPOINT = (
    "There is no checkpoint to go back to: the weights in memory are not finite, "
    "and nothing was saved."
)


def check_can_recover(
    name: str,
    strategy: tf.distribute.Strategy,
    *,
    has_train_data: bool,
    model_dir: str | None,
    setting: str = "on_nonfinite",
) -> None:
    """Raises ValueError when `setting`='recover' cannot work for the definition `name`.

    Args:
        has_train_data: whether the run has train data, or makes its own
            (RL), drawing new data after a recovery (`Loop.data_step`).
        setting: the policy asked to recover: on_nonfinite or on_loss_spike.
    """
    policy = f"{setting}='recover'"
    spikes = setting == "on_loss_spike"
    bad = "a loss spike" if spikes else "a non-finite step"
    other = "'ignore'" if spikes else "'skip'"
    others = f"{setting}='stop' or {other} (--{setting}=stop or {other.strip(chr(39))})"
    if topology.strategy_name(strategy) == "parameter_server":
        raise ValueError(
            f"{policy} moves the train stream past the batches that led "
            f"to {bad}, and under ParameterServerStrategy each worker reads "
            "its own stream, at no position a checkpoint records. Pass "
            + (
                f"{others}."
                if spikes
                else "on_nonfinite='skip' (--on_nonfinite=skip; the workers leave out a "
                "non-finite update under every policy) or 'stop'."
            )
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
