"""A moving average of the weights a loop trains, which evaluation and export swap in.

`Loop(ema_decay=...)` gives every `loops.Update` (but those made with
`average=False`) a `WeightAverage` of the variables it trains, updated in
cross-replica context after each update it applies, with the early
debiasing of `target_networks.MovingAverage`. The loop's `WeightAverages`
checkpoints them all and swaps them into the trained variables while the
Controller evaluates and while an export runs, so the raw weights keep
training and are what every checkpoint holds as the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import tensorflow as tf

from loops.core.target_networks import MovingAverage
from loops.vocabulary import settings


def check_decay(decay: float | None) -> None:
    """Raises ValueError unless `decay` is None or in (0, 1)."""
    settings.check_ema_decay("ema_decay", decay)


class WeightAverage(tf.Module):
    """The debiased moving average of one update's variables; create it in strategy scope.

    Args:
        variables: the variables an optimizer trains; only read.
        decay: the decay once debiased, in (0, 1).
        name: names the averages' variables.
    """

    def __init__(self, variables: Sequence[tf.Variable], *, decay: float, name: str):
        super().__init__(name=name)
        check_decay(decay)
        if not variables:
            raise ValueError(
                f"{name}: there are no variables to average yet. Build the model (call "
                "it once, or model.build(shape)) before making its loops.Update."
            )
        trained = list(variables)
        # Initial values are overwritten by MovingAverage's copy of the variables.
        averages = [
            tf.Variable(
                tf.zeros(variable.shape, variable.dtype),
                trainable=False,
                name=f"{name}_{index}",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            for index, variable in enumerate(trained)
        ]
        # MovingAverage is not tracked: the trained variables are the loop's to
        # checkpoint, and a list attribute of this module would be saved with it.
        self._moving = MovingAverage(averages, trained, decay=decay, name=name)
        self.averages = averages
        self.num_updates = self._moving.num_updates

    def update(self, applied: tf.Tensor) -> None:
        """After an update, in cross-replica context: averages in the weights if it was applied.

        A skipped update (`applied` 0.0) leaves the averages and their count unchanged.
        """
        self._moving.update(weight=applied)

    def swap(self) -> None:
        """Exchanges the values of the trained variables and their averages (host, eagerly)."""
        for variable, average in zip(self._moving.variables, self._moving.averages):
            trained = tf.identity(tf.convert_to_tensor(variable))  # a copy, not a read handle
            variable.assign(tf.convert_to_tensor(average))
            average.assign(trained)


class WeightAverages(tf.Module):
    """A loop's weight averages: what a checkpoint saves of them, and the swap in and out."""

    def __init__(self) -> None:
        super().__init__(name="weight_averages")
        self.updates: list[WeightAverage] = []
        self._swapped = False

    def add(self, average: WeightAverage) -> None:
        self.updates.append(average)

    def __bool__(self) -> bool:
        return bool(self.updates)

    def averaged(self) -> contextlib.AbstractContextManager[None]:
        """The trained variables hold their averages inside; their own values again after."""
        return self._exchanged_unless(self._swapped)

    def raw(self) -> contextlib.AbstractContextManager[None]:
        """Inside `averaged`: the trained variables hold their own values for a while."""
        return self._exchanged_unless(not self._swapped)

    @contextlib.contextmanager
    def _exchanged_unless(self, already: bool) -> Iterator[None]:
        if already or not self.updates:
            yield
            return
        self._swap()
        try:
            yield
        finally:
            self._swap()

    def _swap(self) -> None:
        for average in self.updates:
            average.swap()
        self._swapped = not self._swapped
