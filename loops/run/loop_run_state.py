"""The run a Loop hands to its Controller: the run methods and the run state read from it."""

from __future__ import annotations

from typing import Any

import numpy as np

from loops.core import reporting
from loops.model_dir.checkpoints import Checkpointer
from loops.run.controller import Controller


class LoopRunState:
    """What a `loops.Loop` exposes of its run, all of it its Controller's.

    `train`, `evaluate`, `request_stop`, `save_checkpoint` and `write_results`
    delegate to the Controller, and the run's options and state that code
    outside reads (`model_dir`, `progress`, `last_eval_metrics`, ...) are read
    from it.
    """

    controller: Controller

    # ---- The run: the Controller's. ----

    def train(self, num_steps: int) -> dict[str, np.ndarray]:
        """Trains until the global step reaches `num_steps`: `Controller.train`."""
        return self.controller.train(num_steps)

    def evaluate(self) -> dict[str, float]:
        """Evaluates now and reports it: `Controller.evaluate`."""
        return self.controller.evaluate()

    def request_stop(self, reason: str) -> None:
        """Ends `train` after the inner loop in progress: `Controller.request_stop`."""
        self.controller.request_stop(reason)

    def save_checkpoint(self) -> str | None:
        """Saves the loop's state now (every worker must call it): `Controller.save_checkpoint`."""
        return self.controller.save_checkpoint()

    def write_results(self) -> dict[str, Any]:
        """Writes model_dir/results.json (chief only): `Controller.write_results`."""
        return self.controller.write_results()

    # ---- The run's options and state that code outside reads. ----

    @property
    def model_dir(self) -> str | None:
        return self.controller.options.model_dir

    @property
    def eval_every(self) -> int | None:
        return self.controller.options.eval_every

    @property
    def is_chief(self) -> bool:
        return self.controller.is_chief

    @property
    def progress(self) -> reporting.Progress:
        return self.controller.progress

    @property
    def summaries(self) -> reporting.Summaries:
        return self.controller.summaries

    @property
    def checkpointer(self) -> Checkpointer | None:
        return self.controller.checkpointer

    @property
    def last_train_metrics(self) -> dict[str, float]:
        return self.controller.report.last_train_metrics

    @property
    def last_eval_metrics(self) -> dict[str, float]:
        return self.controller.report.last_eval_metrics

    @property
    def steps_per_second(self) -> float:
        return self.controller.report.steps_per_second

    @property
    def units_per_second(self) -> float | None:
        """`throughput_unit` per second (examples, tokens, ...); None when not counted."""
        return self.controller.report.units_per_second

    @property
    def skipped_steps(self) -> int:
        return self.controller.skipped_steps

    @property
    def stop_reason(self) -> str | None:
        return self.controller.stop_reason

    @property
    def preempted(self) -> bool:
        return self.controller.preempted
