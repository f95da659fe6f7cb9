"""The initial row of a raw id, a function of the seed, the id and the column alone (a
splitmix64 hash): what a `DynamicTable` gives each id it admits and an `EmbeddingTable` made
with `initial_ids` gives its rows, so a table over a log's raw ids starts the same whatever their
order, the table's split or the device."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

INITIAL_RANGE = 0.05
# The most int64 ids a string hashes onto: one below the map's reserved 2**63 - 1.
STRING_BUCKETS = 2**63 - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mixed(x: tf.Tensor) -> tf.Tensor:
    """splitmix64's finalizer on uint64 values: each bit of the input moves about half."""

    def shifted(value: tf.Tensor, bits: int) -> tf.Tensor:
        return tf.bitwise.bitwise_xor(
            value, tf.bitwise.right_shift(value, tf.constant(bits, tf.uint64))
        )

    x = shifted(x, 30) * tf.constant(0xBF58476D1CE4E5B9, tf.uint64)
    x = shifted(x, 27) * tf.constant(0x94D049BB133111EB, tf.uint64)
    return shifted(x, 31)


def initial_rows(seed: int, ids: tf.Tensor, dim: int) -> tf.Tensor:
    """The initial row of each id (int64 [k]) -> float32 [k, dim], uniform in [-0.05, 0.05):
    a function of the seed, the id and the column alone, on every device."""
    golden = tf.constant(_GOLDEN, tf.uint64)
    key = _mixed(tf.constant(seed % 2**64, tf.uint64) + golden)
    base = _mixed(tf.bitwise.bitwise_xor(tf.bitcast(tf.cast(ids, tf.int64), tf.uint64), key))
    columns = tf.range(1, dim + 1, dtype=tf.int64)
    bits = _mixed(base[:, None] + tf.bitcast(columns, tf.uint64)[None, :] * golden)
    unit = tf.cast(tf.bitwise.right_shift(bits, tf.constant(40, tf.uint64)), tf.float32) * (
        1.0 / 2**24
    )  # 24 bits: exact in float32
    return unit * (2 * INITIAL_RANGE) - INITIAL_RANGE


def string_numbers(ids) -> tf.Tensor:
    """Each string id as the int64 a table keys it by (TensorFlow's 64-bit fingerprint)."""
    return tf.strings.to_hash_bucket_fast(ids, STRING_BUCKETS)


def row_id_numbers(ids) -> np.ndarray:
    """int64 [rows]: the id each row of a table holds, as `initial_rows` reads it; strings
    (or bytes) are hashed by `string_numbers`.

    Raises:
        ValueError: ids that are not one list of whole numbers or of strings.
    """
    values = np.asarray(ids)
    if values.ndim != 1 or not len(values):
        raise ValueError(
            "the initial ids must be one id a row (a non-empty 1-D list), got shape "
            f"{values.shape}."
        )
    if values.dtype.kind in "USO":
        return string_numbers(tf.constant([str(value) for value in values])).numpy()
    if values.dtype.kind not in "iu":
        raise ValueError(
            f"the initial ids must be whole numbers or strings, got {values.dtype} values such as "
            f"{values[0]!r}; pass the raw ids the rows hold."
        )
    return values.astype(np.int64)
