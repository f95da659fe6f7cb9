"""A feature table kept as a sharded log (`sharded_logs`), split by each row's place in its shard,
fitted by one streaming pass over its training rows (`streaming_fit`) and read as the global
batches a `loops.CTRLoop` takes, (columns, labels), in bounded memory (`log_streams`).

The split (`streaming_fit.Split`): a row's `sharded_logs.row_fractions` value (a hash of its
shard's name and its row number) below `test_fraction` makes it a test row; in the next
`validation_fraction` of what is left, a validation row; else a training row. It needs no pass
over the log and no row in memory, and is the same on any layout and in any order of the shards.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from loops.input import arrow_features, log_streams
from loops.input.feature_tables import FittedFeatures, bucket_name, model_arrays
from loops.input.sharded_logs import BlockTable, LogPart, ShardedLog
from loops.input.streaming_fit import Split


def prepared(fitted: FittedFeatures):
    """A block's rows -> (columns, labels) as a CTRLoop reads them: ids int32 (a dynamic
    column's int64), numbers and
    labels float32 (`arrow_features.Prepared`, else `FittedFeatures.arrays` row by row)."""
    vectorized = arrow_features.Prepared(fitted)

    def prepare(block: BlockTable) -> tuple[dict[str, np.ndarray], np.ndarray]:
        found = vectorized.arrays(block.arrow)
        columns, labels = found or fitted.arrays(block.table(), part=True)
        return model_arrays(fitted, columns), labels

    return prepare


def signature(fitted: FittedFeatures) -> tuple[dict[str, tf.TensorSpec], tf.TensorSpec]:
    """The `tf.TensorSpec`s of a batch of `prepared` rows, rows first (a bag's width varies)."""
    columns, dynamic = {}, fitted.dynamic_columns()
    for column in fitted.spec.columns:
        if column.kind == "numeric":
            columns[column.name] = tf.TensorSpec([None], tf.float32)
            if column.name in fitted.boundaries:
                columns[bucket_name(column.name)] = tf.TensorSpec([None], tf.int32)
        else:
            ids = tf.int64 if column.name in dynamic else tf.int32
            shape = [None] if column.kind == "categorical" else [None, None]
            columns[column.name] = tf.TensorSpec(shape, ids)
    return columns, tf.TensorSpec([None], tf.float32)


@dataclasses.dataclass(frozen=True)
class FeatureLog:
    """A sharded feature log, its split and what its training rows decided (`fitted`)."""

    log: ShardedLog
    fitted: FittedFeatures
    split: Split

    def rows(self, part: str) -> log_streams.Rows:
        """The rows of `part` ("train", "validation" or "test"), prepared by `fitted`."""
        part_rows = LogPart(self.log, *self.split.bands()[part])
        return log_streams.Rows(part_rows, prepared(self.fitted))

    def row_counts(self) -> dict[str, int]:
        return {part: int(self.rows(part).counts().sum()) for part in self.split.bands()}

    def train_batches(
        self, *, global_batch_size: int, seed: int, window_blocks: int = 8, stats=None
    ) -> Any:
        """Endless shuffled global batches of the training rows (`log_streams`)."""
        return log_streams.shuffled_log_batches(
            self.rows("train"),
            global_batch_size=global_batch_size,
            seed=seed,
            signature=signature(self.fitted),
            window_blocks=window_blocks,
            stats=stats,
        )

    def eval_batches(self, part: str, *, global_batch_size: int) -> Any:
        """One pass over the rows of `part` in the log's order, as a dataset function."""
        return log_streams.ordered_log_batches(
            self.rows(part), global_batch_size=global_batch_size, signature=signature(self.fitted)
        )
