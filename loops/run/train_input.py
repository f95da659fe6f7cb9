"""The train input's position: a loop's train iterator placed where the run's next step reads."""

from __future__ import annotations

from collections.abc import Iterator

from loops.input import distributed_input
from loops.run.recovery import Recoveries
from loops.run.run_context import Run


class TrainInput:
    """A loop's train iterator, positioned after some steps' batches so a resume continues there.

    Step k's batches start at k * batches_per_step plus the batches that the
    run's recoveries moved the stream past.
    """

    def __init__(self, trainer: Run, recoveries: Recoveries):
        self._trainer = trainer
        self._recoveries = recoveries
        self._iterator: Iterator | None = None
        # Batches the iterator has handed out; -1 when not known (the next call makes a new one).
        self.position = -1

    def release(self) -> None:
        """Drops the iterator (the next `at_step` makes a new one)."""
        self._iterator = None
        self.position = -1

    def position_at(self, step: int) -> int:
        """Batches of the stream before step `step + 1`'s."""
        return step * self._trainer.definition.batches_per_step + self._recoveries.skipped_batches

    def at_step(self, step: int):
        """The iterator positioned after `step` steps' batches (None without train data).

        Also sets the loop's `data_offset` (the steps recoveries moved past),
        on which loops that make their own data key it (`Loop.data_step`).
        """
        trainer = self._trainer
        offset = self._recoveries.skipped_batches // trainer.definition.batches_per_step
        if int(trainer.data_offset.numpy()) != offset:
            trainer.data_offset.assign(offset)
        if trainer.train_data is None:
            return None
        position = self.position_at(step)
        if self._iterator is None or self.position != position:
            if trainer.coordinator is not None:  # the chief reads and hands out the batches
                self._iterator = distributed_input.global_batch_iterator(
                    trainer.train_data, skip_batches=position
                )
            else:
                self._iterator = distributed_input.train_iterator(
                    trainer.strategy, trainer.train_data, skip_batches=position
                )
            self.position = position
        return self._iterator
