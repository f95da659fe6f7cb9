"""What a run reports: each inner loop's metrics and speed, evaluations, recoveries, results."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from loops import topology
from loops.core import health, outputs, reporting
from loops.definition.recovery import Recovery
from loops.definition.run_state import RunState


class InnerLoop(NamedTuple):
    """One inner loop of a call: steps start + 1..end, their logs, the seconds they took."""

    start: int
    end: int
    logs: dict[str, np.ndarray]  # output columns, a row per step
    seconds: float


class TimedCall(NamedTuple):
    """One executor call that training went on from: what its speed is judged on."""

    steps: int
    seconds: float
    # The throughput unit its steps processed (the loop's `throughput_unit`
    # output summed); None when its steps do not return that output.
    units: float | None


class TrainHistory:
    """The per-step values of one `train` call by output name: what `train` returns."""

    def __init__(self) -> None:
        self._parts: dict[str, list[np.ndarray]] = {}

    def add(self, values: Mapping[str, np.ndarray]) -> None:
        """Appends some steps' values (name -> an array with a row per step)."""
        for name, column in values.items():
            self._parts.setdefault(name, []).append(column)

    def drop_last(self, count: int) -> None:
        """Forgets the values of the last `count` steps logged (those a recovery undid)."""
        for parts in self._parts.values():
            values = np.concatenate(parts)
            parts[:] = [values[: max(len(values) - count, 0)]]

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: np.concatenate(parts) for name, parts in self._parts.items()}


class Reporter:
    """A run's progress lines and TensorBoard scalars; it records the metrics and speeds it
    reports in the run's state.

    Args:
        progress: where progress lines go.
        summaries: where TensorBoard scalars go (the sidecar evaluator sets its own:
            `Controller.report_to`).
        throughput_unit: (the Sum output counting what a step processes, its
            unit's name), reported as "<unit>_per_second" beside steps/s.
        state: the run's state, where the last metrics and speeds go.
        extras: each returns entries of its own for results.json, added in order
            after the run's (the definition's `results_extra`, the executor's).
    """

    def __init__(
        self,
        *,
        progress: reporting.Progress,
        summaries: reporting.Summaries,
        throughput_unit: tuple[str, str],
        state: RunState,
        extras: Sequence[Callable[[], Mapping[str, Any]]] = (),
    ):
        self.progress = progress
        self.summaries = summaries
        self.throughput_unit = throughput_unit
        self.state = state
        self.extras = tuple(extras)
        # Every evaluation of the run ({"step": ..., metric: value}), kept across resumes.
        self.eval_history: list[dict[str, Any]] = []

    def units(self, logs: Mapping[str, np.ndarray]) -> float | None:
        """How much of the throughput unit the steps of `logs` processed; None if not counted."""
        unit_output = self.throughput_unit[0]
        return float(np.sum(logs[unit_output])) if unit_output in logs else None

    def inner_loop(
        self,
        kinds: Mapping[str, type],
        inner_loop: InnerLoop,
        num_steps: int,
        history: TrainHistory,
    ) -> None:
        """Reports an inner loop from its steps' logs: history, metrics, summaries, progress."""
        start, end, logs, seconds = inner_loop
        history.add(outputs.per_step_values(kinds, logs))
        rates = {"steps_per_second": (end - start) / seconds if seconds > 0 else 0.0}
        units = self.units(logs)
        if units is not None:
            rates[f"{self.throughput_unit[1]}_per_second"] = units / seconds if seconds > 0 else 0.0
        metrics, found = health.reported(outputs.aggregate_steps(kinds, logs))
        # The health metrics kept are the per-layer ones of the last step that had them.
        state = self.state
        state.record(
            last_train_metrics=metrics,
            last_health_metrics=health.latest(state.last_health_metrics, found),
        )
        tagged = {health.PREFIX + name: value for name, value in found.items()}
        self.summaries.scalars("train", end, {**metrics, **tagged, **rates})
        shown = {**metrics, **health.in_progress(found)}
        self.progress.train(end, num_steps, shown, rates)

    def evaluation(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Reports an evaluation's numbers at `step` (nothing when it has none).

        Its arrays (a classifier's confusion matrix) are the definition's to draw.
        """
        metrics = reporting.scalar_metrics(metrics)
        if not metrics:
            return
        self.state.record(last_eval_metrics=metrics)
        self.eval_history = [entry for entry in self.eval_history if entry["step"] < step]
        self.eval_history.append({"step": step, **metrics})
        self.summaries.scalars("eval", step, metrics)
        self.progress.eval(step, metrics)

    def recovery(self, entry: Recovery, *, problem: str, count: int, max_recoveries: int) -> None:
        """Reports the run's `count`-th recovery (from a step that was `problem`: "not finite")
        and forgets the evaluations it undid."""
        restored = entry["restored_step"]
        self.eval_history = [item for item in self.eval_history if item["step"] <= restored]
        self.summaries.scalars("train", entry["step"], {"recoveries": count})
        steps = (
            f"step {entry['step']}'s"
            if entry["step"] == restored + 1
            else f"those of steps {restored + 1} to {entry['step']}"
        )
        skipped = entry["skipped_batches"]
        self.progress.line(
            f"step {entry['step']} was {problem}: recovery {count} of at most "
            f"{max_recoveries}, back at the checkpoint of step {restored}; the "
            f"train stream moved past {skipped} batch{'es' if skipped > 1 else ''} ({steps}), "
            "and training goes on"
        )

    def speed(self, calls: Sequence[TimedCall]) -> None:
        """Sets steps_per_second and units_per_second from a `train` call's executor calls."""
        if not calls:
            return
        # The first call includes tracing; leave it out when there are others.
        timed = calls[1:] or calls
        seconds = max(sum(call.seconds for call in timed), 1e-9)
        units = [call.units for call in timed]
        self.state.record(
            steps_per_second=sum(call.steps for call in timed) / seconds,
            units_per_second=(
                None if None in units else sum(u for u in units if u is not None) / seconds
            ),
        )

    def results(
        self,
        *,
        loop: str,
        strategy: tf.distribute.Strategy,
        recoveries: Sequence[Recovery],
        config: Mapping[str, Any],
        extra: Mapping[str, Any],
    ) -> dict[str, Any]:
        """What results.json holds: the run (the definition's name `loop`, its strategy), its
        metrics and speeds, how it ended, its config, then the definition's `extra`."""
        state = self.state
        return {
            "loop": loop,
            "strategy": topology.strategy_name(strategy),
            "num_replicas": strategy.num_replicas_in_sync,
            "global_step": state.step,
            "train": state.last_train_metrics,
            "health": state.last_health_metrics,
            "eval": state.last_eval_metrics,
            "steps_per_second": state.steps_per_second,
            **(
                {}
                if state.units_per_second is None
                else {f"{self.throughput_unit[1]}_per_second": state.units_per_second}
            ),
            "skipped_steps": state.skipped_steps,
            "recoveries": list(recoveries),
            "preempted": state.preempted,
            "stop_reason": state.stop_reason,
            "config": config,
            "history": self.eval_history,
            "versions": reporting.library_versions(),
            **extra,
        }

    def write_results(
        self,
        directory: str | None,
        *,
        loop: str,
        strategy: tf.distribute.Strategy,
        recoveries: Sequence[Recovery],
        config: Mapping[str, Any],
    ) -> dict[str, Any]:
        """`results` with the extras, written to `directory`/results.json when a directory is
        given (the chief's model_dir); returns them."""
        extra: dict[str, Any] = {}
        for entries in self.extras:
            extra.update(entries())
        results = self.results(
            loop=loop, strategy=strategy, recoveries=recoveries, config=config, extra=extra
        )
        if directory:
            reporting.write_json_atomic(os.path.join(directory, "results.json"), results)
        return results
