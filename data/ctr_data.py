"""A generated Criteo-shaped click log: 13 numeric and 26 categorical columns with power-law value
frequencies, two multi-hot columns of variable length (some empty), and labels drawn from a
planted logistic truth, whose AUC on a split is the bar a trained model is held to.

Every number is a function of the seed: the same log on every run and machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from loops.kinds.library.ranking_metrics import auc
from loops_data.in_memory import batches_in_memory, endless_batches_in_memory

NUMERIC = tuple(f"I{index}" for index in range(1, 14))
CATEGORICAL = tuple(f"C{index}" for index in range(1, 27))
MULTI_HOT = ("tags", "history")
PAD_ID = -1


@dataclass(frozen=True)
class ClickLog:
    """The log's columns (name -> array, rows first), 0/1 labels, and the planted truth's logit
    of each row (the log odds its label was drawn with)."""

    columns: dict[str, np.ndarray]
    labels: np.ndarray
    truth_logits: np.ndarray
    cardinalities: dict[str, int]

    def __len__(self) -> int:
        return len(self.labels)

    def rows(self, start: int, stop: int) -> ClickLog:
        """The log's rows start..stop - 1 (a split)."""
        return ClickLog(
            {name: column[start:stop] for name, column in self.columns.items()},
            self.labels[start:stop],
            self.truth_logits[start:stop],
            self.cardinalities,
        )

    def only(self, names: list[str]) -> ClickLog:
        """The log with these columns alone (a model of fewer columns)."""
        return ClickLog(
            {name: self.columns[name] for name in names},
            self.labels,
            self.truth_logits,
            {name: count for name, count in self.cardinalities.items() if name in names},
        )

    def planted_auc(self) -> float:
        """The AUC of the planted truth's logits on these rows: the best a model can expect."""
        return auc(self.truth_logits, self.labels)

    def description(self) -> dict[str, Any]:
        """The columns by kind (numeric names; categorical and multi-hot name -> cardinality),
        the arguments of `loops_models.ctr.CTRFeatures`."""
        return {
            "numeric": [name for name in NUMERIC if name in self.columns],
            "categorical": {
                name: self.cardinalities[name] for name in CATEGORICAL if name in self.columns
            },
            "multi_hot": {
                name: self.cardinalities[name] for name in MULTI_HOT if name in self.columns
            },
        }


def _power_law_ids(
    generator: np.random.Generator, rows: int, cardinality: int, exponent: float
) -> np.ndarray:
    """Ids 0..cardinality - 1 with frequency ∝ 1 / (id + 1) ** exponent (id 0 the commonest)."""
    weights = 1.0 / np.arange(1, cardinality + 1, dtype=np.float64) ** exponent
    return generator.choice(cardinality, size=rows, p=weights / weights.sum()).astype(np.int32)


def click_log(
    rows: int,
    *,
    seed: int = 0,
    cardinality: int = 20,
    bag_cardinality: int = 30,
    longest_bag: int = 5,
    exponent: float = 1.1,
    base_rate: float = 0.25,
    numeric_columns: int = len(NUMERIC),
    categorical_columns: int = len(CATEGORICAL),
    multi_hot_columns: int = len(MULTI_HOT),
) -> ClickLog:
    """`rows` generated examples (see the module docstring).

    Args:
        rows: examples.
        seed: every draw's seed.
        cardinality: the distinct values of each categorical column (small for tests; a
            Criteo-sized log takes millions).
        bag_cardinality: the distinct ids of each multi-hot column.
        longest_bag: a bag holds 0..longest_bag ids (uniformly), padded with -1 to this width.
        exponent: the power law of the values' frequencies.
        base_rate: the click rate the truth's bias aims at (before the features move it).
        numeric_columns, categorical_columns, multi_hot_columns: the first this many of
            `NUMERIC`, `CATEGORICAL` and `MULTI_HOT` (a smaller log whose truth reads only
            its own columns; the defaults draw every column).
    """
    generator = np.random.default_rng(seed)
    columns: dict[str, np.ndarray] = {}
    logits = np.full(rows, np.log(base_rate / (1 - base_rate)))
    for name in NUMERIC[:numeric_columns]:
        # Counts with a long tail, log-transformed as Criteo's integer columns usually are.
        values = np.log1p(generator.poisson(generator.gamma(1.0, 3.0, rows))).astype(np.float32)
        columns[name] = values
        logits += generator.normal(0.0, 0.3) * (values - values.mean())
    cardinalities = {}
    for name in CATEGORICAL[:categorical_columns]:
        ids = _power_law_ids(generator, rows, cardinality, exponent)
        columns[name] = ids
        cardinalities[name] = cardinality
        logits += generator.normal(0.0, 0.4, cardinality)[ids]
    for name in MULTI_HOT[:multi_hot_columns]:
        lengths = generator.integers(0, longest_bag + 1, rows)
        bags = _power_law_ids(generator, rows * longest_bag, bag_cardinality, exponent)
        bags = bags.reshape(rows, longest_bag)
        bags[np.arange(longest_bag)[None, :] >= lengths[:, None]] = PAD_ID
        columns[name] = bags
        cardinalities[name] = bag_cardinality
        effects = np.append(generator.normal(0.0, 0.8, bag_cardinality), 0.0)  # pad: nothing
        logits += effects[bags].sum(axis=1) / np.maximum(lengths, 1)
    labels = (generator.random(rows) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    return ClickLog(columns, labels, logits, cardinalities)


def dataset_rows(log: ClickLog) -> tuple[Mapping[str, np.ndarray], np.ndarray]:
    """(columns, labels): the nest of a Trainer's batches, `loops.CTRLoop`'s (features, labels)."""
    return dict(log.columns), log.labels


def trainer_data(
    train: ClickLog, test: ClickLog, *, global_batch_size: int, seed: int
) -> dict[str, Any]:
    """The Trainer's `train_data` (endless shuffled batches of the train rows) and `eval_data`
    (one pass over the test rows, its last batch partial)."""
    return dict(
        train_data=lambda: endless_batches_in_memory(dataset_rows(train), global_batch_size, seed),
        eval_data=lambda: batches_in_memory(dataset_rows(test), global_batch_size),
    )


def one_pass(log: ClickLog, global_batch_size: int) -> tf.data.Dataset:
    """The log's rows once, in order, in global batches (the last one partial)."""
    return batches_in_memory(dataset_rows(log), global_batch_size)
