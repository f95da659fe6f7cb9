"""A run's warm start: applied when model_dir holds no checkpoint of the run's own, its report
kept in model_dir (warm_start.json) and in results.json, and left alone on a resume; a
continuation's report carries the lineage of the runs it goes on from."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from loops.core import own_files
from loops.model_dir import run_config
from loops.model_dir.warm_start import WarmStart, warm_start
from loops.run.controller import Controller

REPORT_FILE = "warm_start.json"  # in MODEL_DIR: what the run's start took, remapped and left
_REPORT_LIMIT = 64 << 20


def start_run(
    controller: Controller,
    start: WarmStart | None,
    items: Mapping[str, Any],
    restored: str | None,
) -> dict[str, Any] | None:
    """The run's warm-start report: `start` applied to `items` when nothing was `restored`
    (every process alike), else the report its first start kept; None without a start.

    A resumed run goes on from its own checkpoint, which holds what the warm start set and
    what training made of it since: the start is not applied twice.

    Raises:
        ValueError: as `loops.model_dir.warm_start.warm_start`.
    """
    model_dir = controller.options.model_dir
    path = os.path.join(model_dir, REPORT_FILE) if model_dir else None
    if restored is not None:
        kept = own_files.read_own_file(path, _REPORT_LIMIT) if path else b""
        report = json.loads(kept) if kept else None
    elif start is not None:
        report = warm_start(start, items)
        if start.continues:
            # The new log's first batch is the next step's.
            controller.recoveries.stream_start.assign(report["step"] or 0)
            report["lineage"] = _lineage_of(report["checkpoint"], report["step"])
            _evaluate_at_start(controller, report)
        taken = len(report["taken"]) + sum(
            len(table["variables"]) for table in report["remapped"].values()
        )
        controller.report.progress.line(
            f"warm start from {report['checkpoint']}: took {taken} variables "
            f"({len(report['remapped'])} tables by id), left {len(report['left'])}"
        )
        if path and controller.run_context.is_chief:
            own_files.write_atomic(path, json.dumps(report, indent=1).encode())
    else:
        return None
    if report is not None:
        entry = {"warm_start": report}
        controller.report.extras = (*controller.report.extras, lambda: entry)
    return report


def _evaluate_at_start(controller: Controller, report: dict[str, Any]) -> None:
    """Adds to a continuation's `report` the temporal evaluation: the model it goes on from,
    as it starts, evaluated on this run's eval data (trained on the logs before, evaluated
    on the next: `evaluated_at_start`, {} without eval data), and `temporal`, that figure of
    each continuation of the lineage, oldest first (every process evaluates alike)."""
    run = controller.run_context
    with run.averaged_weights():
        metrics = controller.definition.run_evaluation(run)
    figures = {
        name: float(value) if math.isfinite(float(value)) else None
        for name, value in metrics.items()
        if np.ndim(value) == 0
    }
    report["evaluated_at_start"] = {"step": report["step"], **figures} if figures else {}
    if figures:
        controller.report.progress.line(
            f"the model continued from, on this run's eval data (step {report['step']}): "
            + ", ".join(
                f"{name} {value:.4g}" for name, value in figures.items() if value is not None
            )
        )
    earlier = [entry.get("evaluated_at_start") for entry in report["lineage"]]
    report["temporal"] = [entry for entry in (*earlier, report["evaluated_at_start"]) if entry]


def _lineage_of(prefix: str, step: int | None) -> list[dict[str, Any]]:
    """The runs a continuation from checkpoint `prefix` (at `step`) goes on from, oldest
    first: the lineage that run's warm_start.json keeps (beside its checkpoints/, or beside
    the checkpoint), then that run itself with the log it trained on (its config.json's
    resume identity; None where it records none)."""
    directory = os.path.dirname(prefix)
    if os.path.basename(directory) == "checkpoints":
        directory = os.path.dirname(directory)
    kept = own_files.read_own_file(os.path.join(directory, REPORT_FILE), _REPORT_LIMIT)
    lineage = _kept_report(kept).get("lineage")  # a damaged report: nothing of the runs before
    config = run_config.read_if_intact(directory) or {}
    run = {"checkpoint": prefix, "step": step, "log": config.get(run_config.RESUME_IDENTITY)}
    # That run's own temporal evaluation, when it continued one before it.
    run["evaluated_at_start"] = _kept_report(kept).get("evaluated_at_start") or {}
    return [*(lineage if isinstance(lineage, list) else []), run]


def _kept_report(kept: bytes) -> dict[str, Any]:
    """A kept warm_start.json, read; {} where there is none or it is damaged."""
    try:
        report = json.loads(kept) if kept else {}
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}
