"""The rows `loops-ctr` trains, validates and tests on: a feature table of the user's (a CSV or
Parquet file read by a JSON spec, `loops.input.feature_tables`) or a generated click log
(`loops_data.ctr_data`), split at random into train, validation and test rows, and the test
figures of a trained model on them (AUC, log loss, calibration, the planted truth's AUC).

Nothing here imports TensorFlow when loaded: the binary checks a table before TensorFlow
starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from loops.input import feature_growth, feature_tables
from loops.vocabulary.host_memory import in_units, memory_bytes

# The generated log's shape when --data is not given: small enough that the default run
# trains in under a minute on 2 CPU cores, with every kind of column.
GENERATED_SHAPE = dict(
    numeric_columns=4,
    categorical_columns=8,
    multi_hot_columns=2,
    cardinality=100,
    bag_cardinality=50,
    longest_bag=5,
)


@dataclasses.dataclass(frozen=True)
class Rows:
    """Some rows of a table: each column's array (rows first), 0/1 labels, and for a
    generated log the planted truth's logit of each row."""

    columns: dict[str, np.ndarray]
    labels: np.ndarray
    truth_logits: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def taken(self, index: np.ndarray) -> Rows:
        """These rows at `index`, in its order."""
        truth = None if self.truth_logits is None else self.truth_logits[index]
        return Rows({name: a[index] for name, a in self.columns.items()}, self.labels[index], truth)


@dataclasses.dataclass(frozen=True)
class SplitTable:
    """A table split into train, validation (None without one) and test rows, with the
    columns by kind (`features`: the arguments of `loops_models.ctr.CTRFeatures`), where
    it came from, and what the training rows decided of a file's columns (`fitted`)."""

    train: Rows
    validation: Rows | None
    test: Rows
    features: dict[str, Any]
    source: str
    split: str
    fitted: feature_tables.FittedFeatures | None = None

    def notes(self) -> dict[str, Any]:
        """What the data is, for results.json's "data"."""
        notes: dict[str, Any] = {
            "source": self.source,
            "split": self.split,
            "train_rows": len(self.train),
            "validation_rows": 0 if self.validation is None else len(self.validation),
            "test_rows": len(self.test),
            "train_positive_rate": float(self.train.labels.mean()),
        }
        if self.test.truth_logits is not None:
            notes["planted_test_auc"] = planted_auc(self.test)
        return notes


def split_indices(
    rows: int, *, test_fraction: float, validation_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, validation, test) row numbers: a permutation of the rows by
    `numpy.random.default_rng(seed)`, its first 1 - test_fraction (rounded down) the training
    rows, and the last validation_fraction of those (rounded) the validation rows.

    Raises:
        ValueError: a split that leaves train, validation (when asked for) or test empty.
    """
    order = np.random.default_rng(seed).permutation(rows)
    cut = int(math.floor(rows * (1 - test_fraction)))
    train, test = order[:cut], order[cut:]
    held = int(round(len(train) * validation_fraction))
    train, validation = train[: len(train) - held], train[len(train) - held :]
    sizes = {"train": len(train), "test": len(test)}
    if validation_fraction:
        sizes["validation"] = len(validation)
    empty = [name for name, size in sizes.items() if size == 0]
    if empty:
        raise ValueError(
            f"{rows} rows split by --test_fraction={test_fraction} and --validation_fraction="
            f"{validation_fraction} leave no {' or '.join(empty)} rows; give more rows or "
            "fractions that leave each part a row."
        )
    return train, validation, test


def _split_words(test_fraction: float, validation_fraction: float, seed: int) -> str:
    words = f"random, seed {seed}: test {test_fraction:g} of the rows"
    if validation_fraction:
        words += f"; validation {validation_fraction:g} of the training rows"
    return words


def generated(
    rows: int, *, seed: int, test_fraction: float, validation_fraction: float
) -> SplitTable:
    """A generated Criteo-shaped log of `rows` rows (`GENERATED_SHAPE`), split."""
    from loops_data import ctr_data

    log = ctr_data.click_log(rows, seed=seed, **GENERATED_SHAPE)
    everything = Rows(dict(log.columns), log.labels, log.truth_logits)
    train, validation, test = split_indices(
        rows, test_fraction=test_fraction, validation_fraction=validation_fraction, seed=seed
    )
    return SplitTable(
        everything.taken(train),
        everything.taken(validation) if validation_fraction else None,
        everything.taken(test),
        log.description(),
        f"generated click log, {rows} rows (seed {seed})",
        _split_words(test_fraction, validation_fraction, seed),
    )


# The bytes a generated row takes as `generated` holds it: its columns (numeric float32,
# categorical int32, the multi-hot bags int32 at their longest), its float32 label and float64
# truth, once in the log and once in its split. A lower bound: the draws take more meanwhile.
GENERATED_ROW_BYTES = 2 * (
    4 * GENERATED_SHAPE["numeric_columns"]
    + 4 * GENERATED_SHAPE["categorical_columns"]
    + 4 * GENERATED_SHAPE["multi_hot_columns"] * GENERATED_SHAPE["longest_bag"]
    + 4
    + 8
)


def check_generated_rows_fit(rows: int, *, memory: int | None = None) -> None:
    """Refuses a --generated_rows whose log cannot fit in `memory` bytes (default: this
    machine's; 0 checks nothing), before any is drawn.

    Raises:
        ValueError: the rows, the bytes they need, and the most rows that fit.
    """
    memory = memory_bytes() if memory is None else memory
    needed = rows * GENERATED_ROW_BYTES
    if memory and needed > memory:
        raise ValueError(
            f"--generated_rows={rows} is more than this machine can hold: the generated log "
            f"and its split take {GENERATED_ROW_BYTES} bytes a row ({in_units(needed)}), and "
            f"it has {in_units(memory)} of memory; pass --generated_rows<="
            f"{memory // GENERATED_ROW_BYTES}."
        )


def generated_tables() -> dict[str, int]:
    """The rows of each table of the generated log's model (`loops_data.ctr_data`'s column
    names: its categorical, then its multi-hot columns)."""
    categorical = GENERATED_SHAPE["categorical_columns"]
    bags = GENERATED_SHAPE["multi_hot_columns"]
    tables = {f"C{index}": GENERATED_SHAPE["cardinality"] for index in range(1, categorical + 1)}
    tables.update({name: GENERATED_SHAPE["bag_cardinality"] for name in ("tags", "history")[:bags]})
    return tables


def checked_table(data: str, spec: str) -> tuple[feature_tables.FeatureSpec, feature_tables.Table]:
    """The spec and the table of --data and --spec, every field checked against the spec
    (before TensorFlow starts: nothing here imports it).

    Raises:
        ValueError: as `checked_fit`.
    """
    parsed, table, _ = checked_fit(data, spec)
    return parsed, table


def checked_fit(
    data: str, spec: str
) -> tuple[feature_tables.FeatureSpec, feature_tables.Table, feature_tables.FittedFeatures]:
    """`checked_table`'s spec and table, and the vocabularies and scales of the whole table
    (each of its vocabularies holds the training rows' own, so its tables are at least as
    large as the model's: what a check of the model's size against memory reads).

    Raises:
        ValueError: a file missing, a spec that is not one, a spec column the table lacks,
            or a field its column does not take, naming the file, the value and the fix.
    """
    for flag, path, what in (
        ("data", data, "a CSV or Parquet file"),
        ("spec", spec, "a JSON file"),
    ):
        if not os.path.isfile(path):
            raise ValueError(
                f"--{flag}={path} is not a file; name {what} that exists"
                + (" (the feature spec: docs/ctr.md)." if flag == "spec" else ".")
            )
    parsed = feature_tables.FeatureSpec.read(spec)
    table = feature_tables.read_table(data)
    try:
        fitted = feature_tables.fit(parsed, table)  # every field checked, with its row number
    except ValueError as error:
        raise ValueError(f"{error} (--spec={spec})") from None
    return parsed, table, fitted


def from_table(
    spec: feature_tables.FeatureSpec,
    table: feature_tables.Table,
    *,
    seed: int,
    test_fraction: float,
    validation_fraction: float,
    grown_from: feature_tables.FittedFeatures | None = None,
) -> SplitTable:
    """`table` split, its vocabularies and scales fitted to the training rows alone; with
    `grown_from` (the statistics of the run a continuation goes on from), those grown by
    them (`loops.input.feature_growth.grown`)."""
    rows = len(table.columns[spec.label])
    train, validation, test = split_indices(
        rows, test_fraction=test_fraction, validation_fraction=validation_fraction, seed=seed
    )
    fitted = feature_tables.fit(spec, _table_rows(table, train))
    if grown_from is not None:
        fitted = feature_growth.grown(grown_from, fitted)
    columns, labels = fitted.arrays(table)
    everything = Rows(feature_tables.model_arrays(fitted, columns), labels)
    return SplitTable(
        everything.taken(train),
        everything.taken(validation) if validation_fraction else None,
        everything.taken(test),
        features_of(fitted),
        f"{table.path}, {rows} rows",
        _split_words(test_fraction, validation_fraction, seed),
        fitted,
    )


def features_of(fitted: feature_tables.FittedFeatures) -> dict[str, Any]:
    """The columns of a fitted spec by kind: the arguments of `loops_models.ctr.CTRFeatures`."""
    cardinalities = fitted.cardinalities()
    features: dict[str, Any] = {"numeric": [], "categorical": {}, "multi_hot": {}}
    if fitted.dynamic_columns():
        features["dynamic"] = fitted.dynamic_columns()
    for column in fitted.spec.columns:
        if column.kind == "numeric":
            features["numeric"].append(column.name)
            bucketized = feature_tables.bucket_name(column.name)
            if bucketized in cardinalities:
                features["categorical"][bucketized] = cardinalities[bucketized]
        elif column.kind == "categorical":
            features["categorical"][column.name] = cardinalities[column.name]
        else:
            bag = (cardinalities[column.name], column.option("pooling"))
            features["multi_hot"][column.name] = bag
    return features


def _table_rows(table: feature_tables.Table, index: np.ndarray) -> feature_tables.Table:
    columns = {name: [fields[row] for row in index] for name, fields in table.columns.items()}
    return dataclasses.replace(table, columns=columns)


def planted_auc(rows: Rows) -> float:
    """The AUC of the planted truth's logits on `rows` (a generated log's)."""
    from loops.kinds.library.ranking_metrics import auc

    assert rows.truth_logits is not None
    return auc(rows.truth_logits, rows.labels)


def figures(logits_of: Callable[[Mapping[str, np.ndarray]], np.ndarray], rows: Rows) -> dict:
    """The test figures of a model (`logits_of`: columns -> a logit a row) on `rows`: auc,
    log_loss, accuracy, mean_prediction, positive_rate, calibration (their ratio), examples,
    and planted_auc for a generated log."""
    chunks = [
        np.asarray(logits_of({name: a[start : start + 8192] for name, a in rows.columns.items()}))
        for start in range(0, len(rows), 8192)
    ]
    result = figures_of(np.concatenate(chunks), rows.labels)
    if rows.truth_logits is not None:
        result["planted_auc"] = planted_auc(rows)
    return result


def figures_of(logits: np.ndarray, labels: np.ndarray) -> dict:
    """`figures` of a model's logits of some rows and their labels."""
    from loops.kinds.library.ranking_metrics import auc

    logits = logits.reshape(-1).astype(np.float64)
    labels = labels.astype(np.float64)
    # The log loss as tf.nn.sigmoid_cross_entropy_with_logits computes it, stably.
    losses = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    mean_prediction = float(np.mean(1 / (1 + np.exp(-logits))))
    positive_rate = float(labels.mean())
    result = {
        "auc": auc(logits, labels),
        "log_loss": float(losses.mean()),
        "accuracy": float(np.mean((logits > 0) == (labels > 0.5))),
        "mean_prediction": mean_prediction,
        "positive_rate": positive_rate,
        "calibration": mean_prediction / positive_rate if positive_rate else float("nan"),
        "examples": len(labels),
    }
    return result


def model_figures(definition: Any, rows: Rows) -> dict:
    """`figures` of a trained `loops.CTRLoop`'s model on `rows`."""
    import tensorflow as tf

    def logits_of(columns: Mapping[str, np.ndarray]) -> np.ndarray:
        tensors = {name: tf.constant(array) for name, array in columns.items()}
        return definition.logits(tensors).numpy()

    return figures(logits_of, rows)


def trainer_data(
    train: Rows, evaluated: Rows, *, global_batch_size: int, seed: int
) -> dict[str, Any]:
    """The Trainer's `train_data` (endless shuffled batches of the train rows) and `eval_data`
    (one pass over the evaluated rows, its last batch partial), as `loops.CTRLoop` takes
    them: (columns, labels)."""
    from loops_data.in_memory import batches_in_memory, endless_batches_in_memory

    return dict(
        train_data=lambda: endless_batches_in_memory(
            (dict(train.columns), train.labels), global_batch_size, seed
        ),
        eval_data=lambda: batches_in_memory(
            (dict(evaluated.columns), evaluated.labels), global_batch_size
        ),
    )
