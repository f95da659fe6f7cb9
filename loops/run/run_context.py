"""The narrow surfaces a run sees of a loop: what an Action may use, what the Controller needs.

A `loops.Loop` satisfies both (mypy checks it where the Loop hands itself to
its Controller), so actions keep receiving the loop; neither the Controller
nor the actions import `loops.run.loop`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Protocol

import tensorflow as tf

from loops.core import reporting
from loops.model_dir.checkpoints import Checkpointer
from loops.run import executors


class RunContext(Protocol):
    """What an Action may use of the loop its hooks get."""

    @property
    def strategy(self) -> tf.distribute.Strategy: ...

    @property
    def global_step(self) -> tf.Variable: ...

    @property
    def step(self) -> int: ...

    @property
    def model_dir(self) -> str | None: ...

    @property
    def eval_every(self) -> int | None: ...

    @property
    def is_chief(self) -> bool: ...

    @property
    def progress(self) -> reporting.Progress: ...

    @property
    def checkpointer(self) -> Checkpointer | None: ...

    @property
    def last_train_metrics(self) -> dict[str, float]: ...

    @property
    def last_eval_metrics(self) -> dict[str, float]: ...

    def request_stop(self, reason: str) -> None:
        """Ends `train` after the inner loop in progress."""

    def save_checkpoint(self) -> str | None:
        """Saves the loop's state now (every worker must call it); returns the path."""

    def averaged_weights(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the trained variables hold their moving averages."""


class RunDefinition(RunContext, Protocol):
    """What the Controller and its parts need of the loop they run (and hand to the actions)."""

    @property
    def name(self) -> str: ...

    @property
    def coordinator(self) -> Any: ...  # a ClusterCoordinator under ParameterServerStrategy

    @property
    def executor(self) -> executors.Executor: ...

    @property
    def train_data(self) -> Any: ...

    @property
    def needs_train_data(self) -> bool: ...

    @property
    def batches_per_step(self) -> int: ...

    @property
    def data_offset(self) -> tf.Variable: ...

    @property
    def on_nonfinite(self) -> str: ...

    @property
    def skips_nonfinite(self) -> bool: ...

    @property
    def max_recoveries(self) -> int: ...

    @property
    def num_replicas(self) -> int: ...

    @property
    def throughput_unit(self) -> tuple[str, str]: ...

    @property
    def config_free_to_change(self) -> frozenset[str]: ...

    def checkpoint_items(self) -> Mapping[str, Any]: ...

    def run_evaluation(self) -> dict[str, float]: ...

    def eval_metric_names(self) -> set[str] | None: ...

    def results_extra(self) -> dict[str, Any]: ...
