"""The model a run ends with when it keeps its best checkpoint: the best one, restored before the
export and tested once on rows no evaluation saw (`RestoreBestOnEnd`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from loops.core import reporting
from loops.definition.run_context import RunContext
from loops.run.actions import Action
from loops.tables import embedding_tables

BEST_FILE = "best.json"


class RestoreBestOnEnd(Action):
    """When training ends, puts the weights of the best checkpoint a `loops.KeepBest` kept back
    into the model, tests that model once, and adds to results.json which step it is, its
    evaluation figures there and its test figures.

    Give it after the KeepBest and before a `loops.ExportOnEnd` (actions run in order), so
    the export serves the best model. Only the trained state is restored (the definition's
    items, its weight averages and update states), not the step: the run's own checkpoints
    keep its last step, and a longer rerun goes on from there. The chief alone restores and
    tests (the export is the chief's), but where tables are split over several workers
    every worker restores its own rows and gathers the whole tables; results.json gains:

        "best_step": the step of the best checkpoint (the last step without one),
        "validation": the evaluation figures at that step (its entry of "history"),
        "test": `test(definition)`, the figures of the model exported.

    Not run when training is preempted: the rerun that finishes it does this.
    """

    name = "restore_best_on_end"

    def __init__(self, test: Callable[[Any], Mapping[str, float]], *, directory: str | None = None):
        """
        Args:
            test: the trained definition (holding the best weights) -> its test figures.
            directory: where the KeepBest keeps the best checkpoint; default model_dir/best.
        """
        self.test = test
        self.directory = directory

    def after_train(self, run: RunContext) -> None:
        items = run.definition.checkpoint_items()
        # Tables split over several workers: every worker restores its own rows and joins
        # the gather that gives the chief's test (and the export after) the whole tables.
        every_worker = bool(embedding_tables.split_over_workers(items))
        if not (run.is_chief or every_worker) or run.model_dir is None:
            return
        best = best_record(self.directory or os.path.join(run.model_dir, "best"))
        step = run.state.step
        if best is not None and int(best["step"]) != step:
            restore_trained_state(run, best["checkpoint"])
            step = int(best["step"])
            if run.is_chief:
                run.progress.line(
                    f"restored the best checkpoint (step {step}, {best['metric']} "
                    f"{float(best['value']):.6g}) for the export and the test"
                )
        with embedding_tables.held_whole(items):
            if run.is_chief:
                self._test(run, step)

    def _test(self, run: RunContext, step: int) -> None:
        """Tests the model (holding the best weights) and adds the figures to results.json."""
        assert run.model_dir is not None
        with run.averaged_weights():
            test = dict(self.test(run.definition))
        run.progress.line(
            f"test of the model at step {step}: "
            + ", ".join(f"{name} {value:.4f}" for name, value in test.items())
        )
        path = os.path.join(run.model_dir, "results.json")
        with open(path, encoding="utf-8") as stream:
            results = json.load(stream)
        history = results.get("history") or []
        validation = next((dict(e) for e in history if e.get("step") == step), {})
        validation.pop("step", None)
        results.update(best_step=step, validation=validation, test=test)
        reporting.write_json_atomic(path, results)


def best_record(directory: str) -> dict[str, Any] | None:
    """best.json of `directory`, or None where no evaluation improved (none written)."""
    path = os.path.join(directory, BEST_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as stream:
        return json.load(stream)


def restore_trained_state(run: RunContext, checkpoint: str) -> None:
    """Reads the trained state (everything the run saves but its step counter) from
    `checkpoint` into the run's variables."""
    assert run.checkpointer is not None  # a KeepBest's checkpoint needs the run's
    items = {name: item for name, item in run.checkpointer.items.items() if name != "global_step"}
    tf.train.Checkpoint(**items).restore(
        checkpoint
    ).expect_partial().assert_existing_objects_matched()
