"""A feature table's fitted vocabularies, hash buckets and numeric scales as a TensorFlow
graph, so that a click-through export serves raw columns (`loops.input.feature_tables`)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from loops.input.feature_tables import PAD_ID, Column, FittedFeatures, bucket_name
from loops.model_dir import signature_names


class RawFeatures(tf.Module):
    """Raw columns -> the columns a model trained on, as `FittedFeatures.arrays` prepares them.

    A numeric column is float64 [n], log1p'd where its spec says `normalize=log`, then
    centred and scaled; a categorical column is string [n] (a number as its text, "3" for 3
    and 3.0), looked up in its vocabulary (row 0 for a value training did not keep) or hashed
    to its bucket; a multi-hot column is string [n], its values joined by the column's
    separator ("" an empty bag), padded with `PAD_ID`. A crossed column is no raw column: its
    value is the text of each column it crosses (string [n], those the spec does not list
    too) joined by its separator, as `feature_tables` joins a table's rows; a served value
    holding the separator (which a table may not hold) joins to a text no kept pair has, so
    a vocabulary gives it row 0 (a hashed cross, some bucket). A number training refuses
    (NaN, inf, a negative under `normalize=log`) gives a row that `takes` marks False. The
    lookup tables are attributes, so an export saves them and initializes them on load.
    """

    def __init__(self, fitted: FittedFeatures):
        super().__init__()
        self._spec = fitted.spec
        self._columns = list(fitted.spec.columns)
        self._scales = dict(fitted.scales)
        self._boundaries = {
            name: tf.constant(bounds, tf.float64) for name, bounds in fitted.boundaries.items()
        }
        self.tables = {
            column.name: _vocabulary_table(fitted.vocabularies[column.name])
            for column in self._columns
            if column.kind != "numeric" and not column.hash_buckets()
        }

    def signature(self) -> dict[str, tf.TensorSpec]:
        """Each raw column's spec, by column name (`signature_names.raw_columns`), named as
        `signature_names.served_name` serves it: the spec's columns but the crossed ones, then
        each column a cross reads that the spec does not list (string).

        Raises:
            ValueError: two columns served under one name (`signature_names.served_names`).
        """
        kinds = {column.name: column.kind for column in self._columns}
        names = signature_names.raw_columns(self._spec)
        served = signature_names.served_names(names, "serving_default")
        return {
            name: tf.TensorSpec(
                [None], tf.float64 if kinds.get(name) == "numeric" else tf.string, name=served[name]
            )
            for name in names
        }

    def takes(self, raw: dict[str, tf.Tensor]) -> tf.Tensor:
        """bool [n]: whether each row's numbers are ones training takes (finite, and >= 0 in a
        `normalize=log` column); a row with another is no row the model can score."""
        takes = tf.ones([tf.shape(next(iter(raw.values())))[0]], tf.bool)
        for column in self._columns:
            if column.kind == "numeric":
                values = raw[column.name]
                good = tf.math.is_finite(values)
                if column.option("normalize") == "log":
                    good &= values >= 0
                takes &= good
        return takes

    def __call__(self, raw: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """The prepared columns (numeric float32, categorical and multi-hot int64) of `raw`."""
        prepared = {}
        for column in self._columns:
            values = self._crossed(column, raw) if column.crosses() else raw[column.name]
            if column.kind == "numeric":
                prepared[column.name] = self._numbers(column, values)
                if column.name in self._boundaries:
                    # The bucket of the value as `numbers_of` reads it (log1p'd for log).
                    read = tf.math.log1p(values) if column.option("normalize") == "log" else values
                    prepared[bucket_name(column.name)] = tf.searchsorted(
                        self._boundaries[column.name], read, side="right", out_type=tf.int64
                    )
            elif column.kind == "categorical":
                prepared[column.name] = self._ids(column, values)
            else:
                prepared[column.name] = self._bags(column, values)
        return prepared

    def _crossed(self, column: Column, raw: dict[str, tf.Tensor]) -> tf.Tensor:
        return tf.strings.join(
            [raw[source] for source in column.crosses()], separator=column.option("separator")
        )

    def _numbers(self, column: Column, values: tf.Tensor) -> tf.Tensor:
        if column.option("normalize") == "log":
            values = tf.math.log1p(values)
        center, scale = self._scales[column.name]
        normalized = (values - center) / scale
        # As `feature_tables` normalizes: a difference past float64's range taken apart.
        apart = values / scale - center / scale
        normalized = tf.where(tf.math.is_finite(normalized), normalized, apart)
        return tf.cast(normalized, tf.float32)  # past float32: inf, a row `PreparedRows` flags

    def _ids(self, column: Column, values: Any) -> Any:
        buckets = column.hash_buckets()
        if buckets:
            return tf.strings.to_hash_bucket_fast(values, buckets)
        return self.tables[column.name].lookup(values)

    def _bags(self, column: Column, fields: tf.Tensor) -> tf.Tensor:
        bags = tf.strings.split(fields, sep=column.option("separator"))
        # An empty field is an empty bag (splitting it gives one empty value).
        kept = tf.repeat(tf.not_equal(fields, ""), bags.row_lengths())
        bags = tf.ragged.boolean_mask(bags, bags.with_flat_values(kept))
        ids = tf.ragged.map_flat_values(lambda flat: self._ids(column, flat), bags)
        padded = ids.to_tensor(default_value=PAD_ID)
        # A padding column more: a batch of empty bags still has one (as `arrays` gives).
        return tf.concat(
            [padded, tf.fill([tf.shape(padded)[0], 1], tf.constant(PAD_ID, tf.int64))], 1
        )


def _vocabulary_table(vocabulary: list[str]) -> tf.lookup.StaticHashTable:
    """Value -> its row (1 onwards, in vocabulary order); 0 for any other value."""
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(vocabulary, tf.string),
            tf.range(1, len(vocabulary) + 1, dtype=tf.int64),
        ),
        default_value=0,
    )
