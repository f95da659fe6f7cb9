"""Which rows of a click-through model's prepared columns it can score (every number finite,
every id a row of its column's table), and the columns made safe to look up, so that an export
answers a row it cannot score with a flag and NaN, never another row's or a zero row's score."""

from __future__ import annotations

from collections.abc import Mapping

import keras
import tensorflow as tf

from loops.input.feature_tables import PAD_ID


class PreparedRows:
    """The kind of each of a model's inputs (numeric: float; categorical: int [n]; multi-hot:
    int [n, length] padded with `PAD_ID`) and the rows of each id column's table."""

    def __init__(self, model: keras.Model, cardinalities: Mapping[str, int]):
        """
        Raises:
            ValueError: an id column with no cardinality, naming it and the fix.
        """
        self.kinds = {column.name: _kind(column) for column in model.inputs}
        self.rows = {name: cardinalities.get(name) for name in self.kinds}
        missing = [name for name, kind in self.kinds.items() if kind != "numeric"]
        missing = [name for name in missing if not self.rows[name]]
        if missing:
            raise ValueError(
                f"export_ctr needs the rows of each id column's table to flag an id outside it, "
                f"and {', '.join(map(repr, missing))} has none; pass fitted= (the table's "
                "FittedFeatures) or cardinalities={name: rows} (CTRFeatures' cardinalities)."
            )

    def checked(self, columns: Mapping[str, tf.Tensor]) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """(the columns with each bad value replaced, bool [n] whether the row had none).

        A bad number (NaN, inf) becomes 0, a categorical id outside [0, rows) row 0 and a
        multi-hot id outside it (but `PAD_ID`) padding: the model reads only its own rows,
        and the flag tells the caller to discard what it gives for that row.
        """
        safe, valid = {}, []
        for name, values in columns.items():
            safe[name], good = self._checked_column(name, values)
            valid.append(good)
        return safe, tf.reduce_all(tf.stack(valid), axis=0)

    def _checked_column(self, name: str, values: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(the column with each bad value replaced, bool [n] whether its row had none)."""
        kind = self.kinds[name]
        if kind == "numeric":
            good = tf.math.is_finite(values)
            return tf.where(good, values, tf.zeros_like(values)), good
        inside = (values >= 0) & (values < self.rows[name])
        if kind == "categorical":
            return tf.where(inside, values, tf.zeros_like(values)), inside
        padding = tf.fill(tf.shape(values), tf.constant(PAD_ID, values.dtype))
        good = inside | (values == PAD_ID)
        return tf.where(inside, values, padding), tf.reduce_all(good, axis=1)


def _kind(column: keras.KerasTensor) -> str:
    if tf.as_dtype(column.dtype).is_floating:
        return "numeric"
    return "multi_hot" if len(column.shape) > 1 else "categorical"
