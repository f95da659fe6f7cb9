"""The rows `loops-ctr` trains on when --data names shards (a directory, a glob, or a --format):
a sharded feature log (`loops.input.feature_streams`) split by each row's place in its shard,
its statistics fitted in one streaming pass before TensorFlow starts, read as streamed global
batches, and its test rows streamed once for the test figures.

Nothing here imports TensorFlow when loaded: the binary checks the log before TensorFlow
starts.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from loops.input import feature_tables, sharded_logs

# Where a log's rows fall between parts, in words (results.json's "data": "split").
SPLIT_WORDS = (
    "by a hash of each row's shard name and row number: test {test:g} of the rows{validation}"
)


def names_shards(data: str | None, file_format: str | None) -> bool:
    """Whether --data (with --format) names a sharded log rather than one table read whole: a
    directory, a glob, a --format, or a TFRecord or TSV file."""
    if data is None:
        return False
    if file_format is not None or os.path.isdir(data) or glob.has_magic(data):
        return True
    return os.path.splitext(data)[1].lower() in (".tfrecord", ".tfrecords", ".tfrec", ".tsv")


# The test rows whose logits and labels the test keeps for an exact AUC (12 bytes a row).
EXACT_AUC_ROWS = 1 << 24


@dataclasses.dataclass
class FigureSums:
    """`ctr_tables.figures_of`'s figures but the AUC, from sums over batches."""

    examples: int = 0
    loss: float = 0.0
    correct: int = 0
    predicted: float = 0.0
    positives: float = 0.0

    def update(self, logits: np.ndarray, labels: np.ndarray) -> None:
        self.examples += len(labels)
        stable = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
        self.loss += float(stable.sum())
        self.correct += int(np.sum((logits > 0) == (labels > 0.5)))
        self.predicted += float(np.sum(1 / (1 + np.exp(-logits))))
        self.positives += float(labels.sum())

    def figures(self) -> dict[str, Any]:
        mean_prediction = self.predicted / self.examples
        positive_rate = self.positives / self.examples
        return {
            "log_loss": self.loss / self.examples,
            "accuracy": self.correct / self.examples,
            "mean_prediction": mean_prediction,
            "positive_rate": positive_rate,
            "calibration": mean_prediction / positive_rate if positive_rate else float("nan"),
            "examples": self.examples,
        }


@dataclasses.dataclass
class StreamedTable:
    """A sharded feature log split and fitted: what `CTRTraining` reads of its rows."""

    log: sharded_logs.ShardedLog
    fitted: feature_tables.FittedFeatures
    test_fraction: float
    validation_fraction: float
    window_blocks: int

    def __post_init__(self) -> None:
        from loops.input.feature_streams import FeatureLog, Split

        self.rows = FeatureLog(
            self.log, self.fitted, Split(self.test_fraction, self.validation_fraction)
        )
        self.counts = self.rows.row_counts()
        from loops_data.ctr_tables import features_of

        self.features = features_of(self.fitted)
        empty = [p for p in ("train", "test") if not self.counts[p]]
        if self.validation_fraction and not self.counts["validation"]:
            empty.append("validation")
        if empty:
            raise ValueError(
                f"The split of {self.log.root} ({self.log.num_rows} rows) by --test_fraction="
                f"{self.test_fraction} and --validation_fraction={self.validation_fraction} "
                f"leaves no {' or '.join(empty)} rows; give more rows or larger fractions."
            )

    @property
    def evaluated(self) -> str:
        """The part evaluated during training: validation, or test without one."""
        return "validation" if self.validation_fraction else "test"

    def notes(self) -> dict[str, Any]:
        validation = (
            f"; validation {self.validation_fraction:g} of the rest"
            if self.validation_fraction
            else ""
        )
        return {
            "source": f"{self.log.root}, {self.log.format}, {len(self.log.shards)} shards, "
            f"{self.log.num_rows} rows (streamed)",
            "split": SPLIT_WORDS.format(test=self.test_fraction, validation=validation),
            "train_rows": self.counts["train"],
            "validation_rows": self.counts["validation"] if self.validation_fraction else 0,
            "test_rows": self.counts["test"],
        }

    def trainer_data(self, *, global_batch_size: int, seed: int) -> dict[str, Any]:
        """The Trainer's `train_data` (streamed shuffled batches, resumable at any batch) and
        `eval_data` (one pass over the evaluated part)."""
        return dict(
            train_data=self.rows.train_batches(
                global_batch_size=global_batch_size, seed=seed, window_blocks=self.window_blocks
            ),
            eval_data=self.rows.eval_batches(self.evaluated, global_batch_size=global_batch_size),
        )

    def test_figures(
        self, definition: Any, global_batch_size: int, *, exact_rows: int = EXACT_AUC_ROWS
    ) -> dict[str, Any]:
        """The trained definition's figures on the test rows, streamed once: up to
        `exact_rows` rows every logit and label kept (12 bytes a row) and the AUC exact; past
        them the AUC of a `StreamingAUC`, its error bound beside it (`auc_bound`), and the
        other figures from sums."""
        from loops.kinds.library.ranking_metrics import StreamingAUC
        from loops_data.ctr_tables import figures_of

        kept: list[tuple[np.ndarray, np.ndarray]] | None = []
        streaming, sums = StreamingAUC(), FigureSums()
        test = self.rows.eval_batches("test", global_batch_size=global_batch_size)
        for columns, batch_labels in test():
            logits = definition.logits(columns).numpy().reshape(-1).astype(np.float64)
            labels = batch_labels.numpy().astype(np.float64)
            streaming.update(logits, labels)
            sums.update(logits, labels)
            if kept is not None:
                kept.append((logits, labels))
                if sums.examples > exact_rows:
                    kept = None  # past the exact AUC's rows: the sketch and the sums go on
        if kept is not None:
            return figures_of(*(np.concatenate(part) for part in zip(*kept)))
        return {**sums.figures(), "auc": streaming.result(), "auc_bound": streaming.bound()}


def opened_log(
    data: str, spec: str, *, file_format: str | None
) -> tuple[feature_tables.FeatureSpec, sharded_logs.ShardedLog]:
    """The spec of --spec and the sharded log of --data, indexed (no row read).

    Raises:
        ValueError: a spec file missing or not a spec, or a log that cannot be indexed, naming
            the file and the fix.
    """
    if not os.path.isfile(spec):
        raise ValueError(
            f"--spec={spec} is not a file; name a JSON file that exists (the feature spec: "
            "docs/ctr.md)."
        )
    parsed = feature_tables.FeatureSpec.read(spec)
    try:
        return parsed, sharded_logs.ShardedLog.open(data, file_format=file_format)
    except ValueError as error:
        raise ValueError(f"{error} (--data={data})") from None


# In a model_dir: the statistics a run's pass fitted, with what they were fitted on.
FITTED_FILE = "streamed_features.json"


def fitted_log(
    spec: feature_tables.FeatureSpec,
    log: sharded_logs.ShardedLog,
    *,
    split: tuple[float, float],
    model_dir: str | None,
    flags: str,
    grown_from: feature_tables.FittedFeatures | None = None,
    worker: tuple[int, int] | None = None,
) -> feature_tables.FittedFeatures:
    """The statistics of the log's training rows: those a run in `model_dir` fitted on the
    same log, spec and split (`FITTED_FILE`: a resume reads them, never recomputes them),
    else one pass that checks every field the training rows hold (before TensorFlow starts);
    with `grown_from` (the statistics of the run a continuation goes on from), those grown
    by them (`loops.input.feature_growth.grown`). `worker`: this task's (index, count) among
    the workers of a cluster (`loops.cluster.cluster_config.pass_worker`), which then split
    the pass through `model_dir` (`loops.input.fit_exchange`).

    Raises:
        ValueError: a field its column does not take, naming the shard, the row, the value and
            the fix, and `flags`.
    """
    from loops.input.feature_growth import grown
    from loops.input.streaming_fit import Split, fit_log

    basis = _basis(spec, log, split, grown_from)
    saved = _saved_fit(model_dir, basis)
    if saved is not None:
        return saved
    band = Split(*split).bands()["train"]
    try:
        if worker is not None and model_dir:
            from loops.input import fit_exchange

            folder = fit_exchange.shares_folder(model_dir, basis)
            fitted = fit_exchange.fit_split(spec, log, band, folder=folder, worker=worker)
        else:
            fitted = fit_log(spec, log, band)
    except ValueError as error:
        raise ValueError(f"{error} ({flags})") from None
    return fitted if grown_from is None else grown(grown_from, fitted)


def _basis(
    spec: feature_tables.FeatureSpec,
    log: sharded_logs.ShardedLog,
    split: tuple[float, float],
    grown_from: feature_tables.FittedFeatures | None,
) -> dict[str, Any]:
    """What a pass's statistics were fitted on: the log's identity, the spec, the split and
    the statistics they grew from (a hash of their JSON), if any."""
    as_json = json.loads(feature_tables.FittedFeatures(spec, {}, {}).to_json())["spec"]
    basis = {"log": dict(log_record(log)), "spec": as_json, "split": split}
    if grown_from is not None:
        basis["grown_from"] = hashlib.sha256(grown_from.to_json().encode()).hexdigest()
    return basis


def saved_pass(model_dir: str | None, name: str, basis: Any, read: Any) -> Any:
    """`read(saved)` of the JSON file `name` in `model_dir` that a run's pass wrote for the
    same `basis` (what it was fitted on); None where there is none, it was fitted on another
    basis, or it does not read (the pass then runs again, and its file is written anew)."""
    path = os.path.join(model_dir or "", name)
    if not model_dir or not os.path.isfile(path):
        return None
    try:
        with open(path) as stream:
            saved = json.load(stream)
        if saved.get("basis") != json.loads(json.dumps(basis)):
            return None
        return read(saved)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _saved_fit(model_dir: str | None, basis: dict) -> feature_tables.FittedFeatures | None:
    return saved_pass(
        model_dir,
        FITTED_FILE,
        basis,
        lambda saved: feature_tables.FittedFeatures.from_json(saved["fitted"]),
    )


def save_fit(
    model_dir: str,
    spec: feature_tables.FeatureSpec,
    log: sharded_logs.ShardedLog,
    fitted: feature_tables.FittedFeatures,
    split: tuple[float, float],
    grown_from: feature_tables.FittedFeatures | None = None,
) -> None:
    """Writes `FITTED_FILE` in `model_dir` (atomically) for a resume to read."""
    from loops.core import reporting

    basis = _basis(spec, log, split, grown_from)
    reporting.write_json_atomic(
        os.path.join(model_dir, FITTED_FILE), {"basis": basis, "fitted": fitted.to_json()}
    )


def log_record(log: sharded_logs.ShardedLog) -> Mapping[str, Any]:
    """The log as a run's identity records a file: its root, bytes and a hash of its shards'
    identities (`loops.input.log_identity.shards_record`)."""
    from loops.input.log_identity import shards_record

    return shards_record(log.root, log.identity())
