"""A run's data: what its train and eval input are made from, and its eval data as its
executor reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from loops.definition import executors
from loops.input import distributed_input


@dataclass(frozen=True)
class InputSources:
    """A run's data and where it is read: what its train and eval input are made from.

    Attributes:
        strategy: where the steps run, which distributes the batches.
        train_data: the train stream of global batches (or a function that makes it); None
            for a definition that makes its own data.
        eval_data: the finite eval batches (global); None without any.
        coordinator: under ParameterServerStrategy, the coordinator (`coordinator`),
            which schedules the steps on the workers and evaluates by itself; else None.
    """

    strategy: tf.distribute.Strategy
    train_data: distributed_input.DatasetSource | None
    eval_data: distributed_input.DatasetSource | None
    coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator | None


class EvalInput:
    """A run's eval data as its executor reads it (`distributed_input.eval_dataset`): made once,
    kept until `release`.

    Args:
        inputs: the run's data (its eval_data) and strategy; under
            ParameterServerStrategy the coordinator evaluates by itself (reading the
            weights from the parameter servers).
        executor: what runs the definition's eval step.
    """

    def __init__(self, inputs: InputSources, executor: executors.Executor):
        self._inputs = inputs
        self._executor = executor
        self._dataset: Any = None

    def evaluate(self) -> dict[str, float]:
        """One pass of the executor's eval step over the eval data; {} without eval data."""
        inputs = self._inputs
        if inputs.eval_data is None:
            return {}
        if self._dataset is None and inputs.coordinator is not None:
            self._dataset = distributed_input.as_dataset_fn(inputs.eval_data)()
        elif self._dataset is None:
            self._dataset = distributed_input.eval_dataset(inputs.strategy, inputs.eval_data)
        if inputs.coordinator is None and isinstance(self._dataset, tf.data.Dataset):
            with tf.device("/cpu:0"):  # where every replica reads it (they are all host CPUs)
                iterator = iter(self._dataset)
        else:
            iterator = iter(self._dataset)
        return self._executor.evaluate(iterator)

    def output_names(self) -> set[str] | None:
        """The eval step's outputs, found by tracing it (nothing runs); None when unknown."""
        inputs = self._inputs
        if inputs.eval_data is None:
            return set()
        if inputs.coordinator is not None:
            return None
        if self._dataset is None:
            self._dataset = distributed_input.eval_dataset(inputs.strategy, inputs.eval_data)
        return self._executor.eval_output_names(self._dataset.element_spec)

    def release(self) -> None:
        """Drops the distributed dataset (and its iterators' buffers)."""
        self._dataset = None
