"""The train input's position: a loop's train iterator placed where the run's next step reads."""

from __future__ import annotations

from collections.abc import Iterator

import tensorflow as tf

from loops.definition.recovery import Recoveries
from loops.input import distributed_input
from loops.run.input_sources import InputSources


class TrainInput:
    """A loop's train iterator, positioned after some steps' batches so a resume continues there.

    Step k's batches start at (k - the step the stream began at) * batches_per_step plus
    the batches that the run's recoveries moved the stream past (`Recoveries`).

    Args:
        inputs: the run's train data, strategy and coordinator.
        data_offset: the definition's count of the steps recoveries moved past
            (`Loop.data_step`), which `at_step` sets.
        batches_per_step: the global batches a step reads.
        recoveries: the run's record of recoveries.
    """

    def __init__(
        self,
        inputs: InputSources,
        data_offset: tf.Variable,
        batches_per_step: int,
        recoveries: Recoveries,
    ):
        self._inputs = inputs
        self._data_offset = data_offset
        self._batches_per_step = batches_per_step
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
        steps = step - int(self._recoveries.stream_start.numpy())
        return steps * self._batches_per_step + self._recoveries.skipped_batches

    def at_step(self, step: int):
        """The iterator positioned after `step` steps' batches (None without train data).

        Also sets the loop's `data_offset` (the steps recoveries moved past),
        on which loops that make their own data key it (`Loop.data_step`).
        """
        inputs = self._inputs
        offset = self._recoveries.skipped_batches // self._batches_per_step
        if int(self._data_offset.numpy()) != offset:
            self._data_offset.assign(offset)
        if inputs.train_data is None:
            return None
        position = self.position_at(step)
        if self._iterator is None or self.position != position:
            if inputs.coordinator is not None:  # the chief reads and hands out the batches
                self._iterator = distributed_input.global_batch_iterator(
                    inputs.train_data, skip_batches=position
                )
            else:
                self._iterator = distributed_input.train_iterator(
                    inputs.strategy, inputs.train_data, skip_batches=position
                )
            self.position = position
        return self._iterator
