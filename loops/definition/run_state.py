"""A run's state as its user reads it (`trainer.state`): the step, the metrics last reported,
the speeds and how the last `train` ended; written by the run's parts only."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class RunState:
    """What a run has done so far, read-only to its user: `trainer.state`.

        trainer.train(1000)
        trainer.state.step, trainer.state.last_eval_metrics, trainer.state.stop_reason

    The run's parts write it through `record`; an assignment raises
    AttributeError. One object for the run's life: a reference to it sees each
    change.

    Attributes:
        step: the global step, read from the run's step counter.
        last_train_metrics: the metrics of the last inner loop reported.
        last_health_metrics: the health metrics (`loops.core.health`) last reported.
        last_eval_metrics: the numbers of the last evaluation that had any.
        steps_per_second: the last `train` call's speed (its first call's tracing left out).
        units_per_second: the definition's `throughput_unit` per second over the
            same steps; None when its steps do not count it.
        skipped_steps: steps whose update was left out because it was not finite.
        stop_reason: why the last `train` stopped early (`request_stop`); None when it did not.
        preempted: whether the last `train` ended on SIGTERM (every completed step saved).
    """

    _global_step: tf.Variable
    last_train_metrics: dict[str, float]
    last_health_metrics: dict[str, float]
    last_eval_metrics: dict[str, float]
    steps_per_second: float
    units_per_second: float | None
    skipped_steps: int
    stop_reason: str | None
    preempted: bool

    _RECORDED = frozenset(
        {
            "last_train_metrics",
            "last_health_metrics",
            "last_eval_metrics",
            "steps_per_second",
            "units_per_second",
            "skipped_steps",
            "stop_reason",
            "preempted",
        }
    )

    def __init__(self, global_step: tf.Variable):
        object.__setattr__(self, "_global_step", global_step)
        self.record(
            last_train_metrics={},
            last_health_metrics={},
            last_eval_metrics={},
            steps_per_second=0.0,
            units_per_second=None,
            skipped_steps=0,
            stop_reason=None,
            preempted=False,
        )

    @property
    def step(self) -> int:
        return int(self._global_step.numpy())

    def record(self, **values: Any) -> None:
        """Sets some of the state (the run's parts call it; a user only reads).

        Raises:
            AttributeError: a name that is not part of the state.
        """
        for name, value in values.items():
            if name not in self._RECORDED:
                raise AttributeError(f"RunState has no {name!r}; it has {sorted(self._RECORDED)}.")
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"trainer.state is read-only ({name!r} is the run's to set): it says what the run "
            "did; change the run through the Trainer's methods (train, evaluate, request_stop)."
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in sorted(self._RECORDED))
        return f"RunState(step={self.step}, {fields})"
